#!/usr/bin/env python3
"""model_step_peer.py — the peer of model_step_bench: the same Llama training step in PyTorch eager from Python.

A Llama-3 written the way a PyTorch user would (HF-style modules: repeat_kv, matmul attention, RMSNorm in fp32,
torch.autocast for bf16), AdamW. It starts from the weights and trains on the tokens of --start, a safetensors file
meshtrain's side wrote, so that both sides do the same work. Prints one JSON line:
{"tokens_per_s": ..., "step_s": [...], "losses": [...]} (losses of every step, the untimed warm-up's first).
Run by model_step_bench with the same config, threads and dtype.

Also the module bench/ddp_peer.py trains: the Llama, safetensors read and written, and the mapping between Hugging
Face's parameter names and this module's.
"""
import argparse
import json
import math
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.k, self.e = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        d = c["hidden_size"]
        self.q_proj = nn.Linear(d, self.h * self.e, bias=False)
        self.k_proj = nn.Linear(d, self.k * self.e, bias=False)
        self.v_proj = nn.Linear(d, self.k * self.e, bias=False)
        self.o_proj = nn.Linear(self.h * self.e, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.e).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.k, self.e).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.k, self.e).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        g = self.h // self.k
        k = k[:, :, None].expand(B, self.k, g, T, self.e).reshape(B, self.h, T, self.e)
        v = v[:, :, None].expand(B, self.k, g, T, self.e).reshape(B, self.h, T, self.e)
        s = (q @ k.transpose(2, 3)) / math.sqrt(self.e) + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, -1))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.self_attn = Attention(c)
        self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = None if c["tie_word_embeddings"] else nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        e = c["head_dim"]
        self.inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, e, 2).float() / e))

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.embed_tokens(tokens)
        ang = torch.outer(torch.arange(T).float(), self.inv_freq)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = torch.full((T, T), float("-inf")).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        return self.lm_head(x) if self.lm_head is not None else x @ self.embed_tokens.weight.t()


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "I64": torch.int64}


def module_name(name):
    """Hugging Face's parameter name ("model.layers.0.mlp.gate_proj.weight") as this module's
    ("layers.0.gate_proj.weight")."""
    return name.removeprefix("model.").replace(".mlp.", ".")


def hf_name(name):
    """This module's parameter name as Hugging Face's (module_name's inverse)."""
    if name.startswith("lm_head."):
        return name
    for proj in ("gate_proj", "up_proj", "down_proj"):
        name = name.replace(f".{proj}.", f".mlp.{proj}.")
    return "model." + name


def read_safetensors(path):
    """{name: tensor} of a safetensors file (8-byte little-endian header size, JSON header, data)."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(data[8 + size + begin:8 + size + end])
        out[name] = torch.frombuffer(raw, dtype=SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return out


def write_safetensors(path, tensors):
    """Writes {name: tensor} as a safetensors file, the tensors in name order, each contiguous."""
    names = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        blob = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="JSON of the HF LlamaConfig keys")
    ap.add_argument("--start", required=True, help="safetensors: the initial weights (HF names) and the tokens")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--trace", help="after the timed steps, profile `steps` more and write a Chrome trace here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    c = json.loads(a.config)
    model = Llama(c)
    start = read_safetensors(a.start)
    tokens = start.pop("tokens")
    state = {module_name(name): value for name, value in start.items()}
    model.load_state_dict(state, strict=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = tokens.shape[0], tokens.shape[1] - 1

    def train_step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, c["vocab_size"]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    times, losses = [], []
    for step in range(a.steps + 1):  # the first step warms up
        t0 = time.perf_counter()
        loss = train_step()
        if step:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if a.trace:
        with torch.autograd.profiler.profile() as profile:
            for _ in range(a.steps):
                train_step()
        profile.export_chrome_trace(a.trace)
    print(json.dumps({"tokens_per_s": batch * seq * len(times) / sum(times), "step_s": times, "losses": losses}))


if __name__ == "__main__":
    main()
