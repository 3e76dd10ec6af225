#!/usr/bin/env python3
"""test_model_reference.py — the C++ Llama and Mixtral against an independent Python reference, in float64.

For each case (multi-head, grouped-query, Llama-3.1 RoPE scaling, tied embeddings, Mixtral top-2 of 4 and top-1 of
3 experts) this writes a Hugging Face-style
checkpoint by hand (config.json + model.safetensors, no safetensors package), runs
`meshtrain score --checkpoint DIR --tokens ... --json --dump-reference OUT`, and compares the C++ fp32 logits, loss,
per-token log-probs and every parameter gradient with the reference computed here in float64. A Mixtral's reference
follows Hugging Face's MixtralSparseMoeBlock (softmax router in float, top-k, weights renormalized, one-hot expert
masks) and load_balancing_loss_func over every layer's router logits; its loss is the cross entropy plus
router_aux_loss_coef x aux_loss, so the router gradients check the load-balancing gradient too.

Tolerances (C++ computes in fp32, the reference in fp64): |cpp - ref| <= 1e-5 + 2e-4 * max|ref| per tensor, which
fp32 rounding stays well inside at these sizes while a wrong sign, head order, RoPE pairing or scaling breaks it
by orders of magnitude (see test_reference_detects_rope_convention_error). `meshtrain generate` on such directories
must give the reference's greedy tokens.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import torch

BINARY = os.environ.get("MESHTRAIN_BINARY", "")
ABS_TOL, REL_TOL = 1e-5, 2e-4

ST_DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "I64": torch.int64}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


def write_safetensors(path, tensors):
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else \
            t.contiguous().numpy().tobytes()
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = bytearray(blob[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=ST_DTYPES[e["dtype"]]).reshape(e["shape"]) if raw else \
            torch.zeros(e["shape"], dtype=ST_DTYPES[e["dtype"]])
    return out


# ---- the reference model (float64), written from the Llama-3 / HF description, not from the C++ code ----

def llama3_inv_freq(cfg):
    """Per-frequency Llama-3.1 scaling, written as the piecewise rule of Meta's apply_scaling."""
    dim, theta = cfg["head_dim"], cfg["rope_theta"]
    freqs = [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]
    s = cfg.get("rope_scaling")
    if not s:
        return torch.tensor(freqs, dtype=torch.float64)
    low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wl - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            out.append((1 - smooth) * f / s["factor"] + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def rope(x, inv_freq):
    """HF rotate-half: dimension i pairs with i + E/2, rotated by angle pos * inv_freq[i]. x: [B, T, heads, E]."""
    T, half = x.shape[1], x.shape[-1] // 2
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, E/2]
    c, s = torch.cos(angle)[None, :, None, :], torch.sin(angle)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def mixtral_block(cfg, p, pre, h, router_logits):
    """Hugging Face's MixtralSparseMoeBlock on h [B, T, D]; appends the router logits [B*T, E]."""
    B, T, D = h.shape
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    x = h.reshape(-1, D)
    logits = x @ p[pre + "block_sparse_moe.gate.weight"].T
    router_logits.append(logits)
    weights = torch.softmax(logits, dim=1)
    weights, selected = torch.topk(weights, k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    mask = torch.nn.functional.one_hot(selected, num_classes=E).permute(2, 1, 0)  # [E, k, N]
    for e in range(E):
        slot, token = torch.where(mask[e])
        if token.numel() == 0:
            continue
        xe = x[token]
        w = lambda name: p[pre + f"block_sparse_moe.experts.{e}.{name}.weight"]
        a = xe @ w("w1").T
        ye = ((a * torch.sigmoid(a)) * (xe @ w("w3").T)) @ w("w2").T
        out = out.index_add(0, token, ye * weights[token, slot, None])
    return out.view(B, T, D)


def load_balancing_loss(cfg, router_logits):
    """Hugging Face's load_balancing_loss_func without an attention mask."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    logits = torch.cat(router_logits, dim=0)
    weights = torch.softmax(logits, dim=-1)
    _, selected = torch.topk(weights, k, dim=-1)
    mask = torch.nn.functional.one_hot(selected, E).double()
    tokens_per_expert = mask.mean(dim=0)
    prob_per_expert = weights.mean(dim=0)
    return (tokens_per_expert * prob_per_expert[None]).sum() * E


def reference_forward(cfg, p, tokens):
    """(logits, aux_loss or None) of tokens [B, T] under params p."""
    B, T = tokens.shape
    H, K, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inv_freq = llama3_inv_freq(cfg)
    x = p["model.embed_tokens.weight"][tokens]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    router_logits = []
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        h = rmsnorm(x, p[pre + "input_layernorm.weight"], cfg["rms_norm_eps"])
        q = rope((h @ p[pre + "self_attn.q_proj.weight"].T).view(B, T, H, E), inv_freq)
        k = rope((h @ p[pre + "self_attn.k_proj.weight"].T).view(B, T, K, E), inv_freq)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(B, T, K, E)
        heads = []
        for hh in range(H):  # query head hh uses key/value head hh // (H / K)
            kv = hh // (H // K)
            scores = torch.einsum("bte,bse->bts", q[:, :, hh], k[:, :, kv]) / math.sqrt(E)
            scores = scores.masked_fill(~causal, float("-inf"))
            heads.append(torch.einsum("bts,bse->bte", torch.softmax(scores, -1), v[:, :, kv]))
        attn = torch.cat(heads, dim=-1)
        x = x + attn @ p[pre + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
        if cfg.get("model_type") == "mixtral":
            x = x + mixtral_block(cfg, p, pre, h, router_logits)
        else:
            gate, up = h @ p[pre + "mlp.gate_proj.weight"].T, h @ p[pre + "mlp.up_proj.weight"].T
            x = x + (gate * torch.sigmoid(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    x = rmsnorm(x, p["model.norm.weight"], cfg["rms_norm_eps"])
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return x @ head.T, (load_balancing_loss(cfg, router_logits) if router_logits else None)


def reference_logits(cfg, p, tokens):
    return reference_forward(cfg, p, tokens)[0]


def make_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Hq, Hk = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).float()

    p = {"model.embed_tokens.weight": w(V, D, scale=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        p[pre + "self_attn.q_proj.weight"] = w(Hq, D, scale=D ** -0.5)
        p[pre + "self_attn.k_proj.weight"] = w(Hk, D, scale=D ** -0.5)
        p[pre + "self_attn.v_proj.weight"] = w(Hk, D, scale=D ** -0.5)
        p[pre + "self_attn.o_proj.weight"] = w(D, Hq, scale=Hq ** -0.5)
        if cfg.get("model_type") == "mixtral":
            p[pre + "block_sparse_moe.gate.weight"] = w(cfg["num_local_experts"], D, scale=D ** -0.5)
            for e in range(cfg["num_local_experts"]):
                p[pre + f"block_sparse_moe.experts.{e}.w1.weight"] = w(F, D, scale=D ** -0.5)
                p[pre + f"block_sparse_moe.experts.{e}.w3.weight"] = w(F, D, scale=D ** -0.5)
                p[pre + f"block_sparse_moe.experts.{e}.w2.weight"] = w(D, F, scale=F ** -0.5)
        else:
            p[pre + "mlp.gate_proj.weight"] = w(F, D, scale=D ** -0.5)
            p[pre + "mlp.up_proj.weight"] = w(F, D, scale=D ** -0.5)
            p[pre + "mlp.down_proj.weight"] = w(D, F, scale=F ** -0.5)
        p[pre + "input_layernorm.weight"] = 1 + w(D, scale=0.2)
        p[pre + "post_attention_layernorm.weight"] = 1 + w(D, scale=0.2)
    p["model.norm.weight"] = 1 + w(D, scale=0.2)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = w(V, D, scale=D ** -0.5)
    return p


def base_config(**overrides):
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 64,
           "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
           "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "rope_scaling": None, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32"}
    cfg.update(overrides)
    return cfg


# original_max_position_embeddings=64 puts the 8 frequencies of head_dim 16 in all three regimes of the scaling
# (kept, interpolated, divided by factor) at a sequence length the test can afford.
LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}

CASES = {
    "mha": base_config(),
    "gqa": base_config(num_attention_heads=8, num_key_value_heads=2, head_dim=8, hidden_size=64),
    "gqa_llama31_rope": base_config(num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
                                    rope_scaling=LLAMA31_SCALING),
    "tied_mqa": base_config(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True),
    "mixtral_top2_of_4": base_config(model_type="mixtral", architectures=["MixtralForCausalLM"], num_key_value_heads=2,
                                     rope_theta=1e6, num_local_experts=4, num_experts_per_tok=2,
                                     router_aux_loss_coef=0.02, intermediate_size=96),
    "mixtral_top1_of_3": base_config(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=3,
                                     num_experts_per_tok=1, router_aux_loss_coef=0.5, intermediate_size=64),
}


def run_case(testcase, cfg, seed, seq_len=48):
    params = make_params(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg["vocab_size"], (seq_len,), generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        os.mkdir(ckpt)
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            json.dump(cfg, f)
        write_safetensors(os.path.join(ckpt, "model.safetensors"), params)
        dump = os.path.join(tmp, "dump.safetensors")
        cmd = [BINARY, "score", "--checkpoint", ckpt, "--tokens", " ".join(map(str, tokens.tolist())), "--json",
               "--threads", "2", "--dump-reference", dump]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        testcase.assertEqual(proc.returncode, 0, proc.stderr)
        printed = json.loads(proc.stdout)
        cpp = read_safetensors(dump)

    ref_params = {k: v.double().requires_grad_(True) for k, v in params.items()}
    inputs, targets = tokens[None, :-1], tokens[None, 1:]
    logits, aux_loss = reference_forward(cfg, ref_params, inputs)
    logprobs = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[0, :, 0]
    loss = -logprobs.mean()
    (loss + cfg["router_aux_loss_coef"] * aux_loss if aux_loss is not None else loss).backward()

    def close(name, got, want):
        err = (got.double() - want.detach()).abs().max().item()
        bound = ABS_TOL + REL_TOL * want.detach().abs().max().item()
        testcase.assertLessEqual(err, bound, f"{name}: max |C++ - reference| = {err:.3g} > {bound:.3g}")
        return err

    worst = close("logits", cpp["logits"], logits)
    close("loss", cpp["loss"], loss)
    close("logprobs", cpp["logprobs"], logprobs)
    if aux_loss is not None:
        close("aux_loss", cpp["aux_loss"], aux_loss)
        testcase.assertAlmostEqual(printed["aux_loss"], aux_loss.item(), delta=ABS_TOL + REL_TOL * aux_loss.item())
    else:
        testcase.assertNotIn("aux_loss", printed)
    testcase.assertAlmostEqual(printed["loss"], loss.item(), delta=ABS_TOL + REL_TOL * abs(loss.item()))
    testcase.assertEqual(len(printed["logprobs"]), seq_len - 1)
    close("printed logprobs", torch.tensor(printed["logprobs"]), logprobs)
    for name, p in ref_params.items():
        worst = max(worst, close("grad " + name, cpp["grad." + name], p.grad))
    testcase.assertEqual(sorted(k for k in cpp if k.startswith("grad.")), sorted("grad." + k for k in ref_params))
    return logits, worst


def check_greedy_tokens(testcase, cfg, params, prompt, tokens):
    """`tokens` (generated after `prompt`) are the reference's greedy decode under float64 `params`, recomputing the
    whole sequence for each (no cache). Where the reference's two best logits are within 1e-4, a tie that fp32
    rounding may break either way, the token must be one of the two."""
    sequence = list(prompt)
    for i, token in enumerate(tokens):
        top2 = torch.topk(reference_logits(cfg, params, torch.tensor([sequence]))[0, -1], 2)
        if top2.values[0] - top2.values[1] < 1e-4:
            testcase.assertIn(token, top2.indices.tolist(), f"new token {i}: a near tie, neither of the two best")
        else:
            testcase.assertEqual(token, top2.indices[0].item(), f"new token {i} after {sequence}")
        sequence.append(token)


@unittest.skipUnless(os.path.exists(BINARY), "MESHTRAIN_BINARY is not set to the built meshtrain")
class ModelReferenceTest(unittest.TestCase):
    def test_cases(self):
        for i, (name, cfg) in enumerate(CASES.items()):
            with self.subTest(case=name):
                _, worst = run_case(self, cfg, seed=100 + i)
                print(f"{name}: worst |C++ - reference| over logits and grads = {worst:.3g}", file=sys.stderr)

    def generate_greedy(self, cfg, params_seed, prompt_length, new_tokens):
        """Writes a hand-made HF directory of `cfg`, runs `meshtrain generate` (KV cache, fp32) on a random prompt and
        checks its tokens against the reference's greedy decode; returns what generate printed."""
        params = make_params(cfg, params_seed)
        prompt = torch.randint(0, cfg["vocab_size"], (prompt_length,),
                               generator=torch.Generator().manual_seed(params_seed + 1))
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            write_safetensors(os.path.join(tmp, "model.safetensors"), params)
            proc = subprocess.run([BINARY, "generate", "--checkpoint", tmp, "--tokens",
                                   " ".join(map(str, prompt.tolist())), "--max-new-tokens", str(new_tokens),
                                   "--json", "--threads", "2"], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        printed = json.loads(proc.stdout)
        self.assertEqual(len(printed["tokens"]), new_tokens)
        check_greedy_tokens(self, cfg, {k: v.double() for k, v in params.items()}, prompt.tolist(),
                            printed["tokens"])
        return printed

    def test_generate_greedy_on_hugging_face_directories(self):
        """`meshtrain generate` on hand-written HF directories: the reference's greedy tokens."""
        for name in ("gqa_llama31_rope", "tied_mqa", "mixtral_top2_of_4"):
            with self.subTest(case=name):
                printed = self.generate_greedy(CASES[name], params_seed=21, prompt_length=10, new_tokens=12)
                self.assertIsNone(printed["text"])  # no tokenizer.json in the directory

    def test_attention_in_several_query_blocks(self):
        """Causal attention runs in tiles of 64 queries against 64 keys (model/flash_attention.hpp): 199 positions
        (three whole tiles and a partial one on each side) score like the reference, and a 150-token prompt, its
        queries after the cached ones, generates the reference's greedy tokens."""
        cfg = CASES["gqa"]
        _, worst = run_case(self, cfg, seed=120, seq_len=200)
        print(f"gqa, 199 positions: worst |C++ - reference| over logits and grads = {worst:.3g}", file=sys.stderr)
        self.generate_greedy(cfg, params_seed=23, prompt_length=150, new_tokens=6)

    def test_reference_detects_rope_convention_error(self):
        """The tolerance is meaningful: the interleaved (Meta) RoPE pairing gives logits far outside it."""
        cfg = CASES["gqa_llama31_rope"]
        params = {k: v.double() for k, v in make_params(cfg, 7).items()}
        tokens = torch.randint(0, cfg["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(8))
        good = reference_logits(cfg, params, tokens)
        global rope
        saved = rope

        def interleaved(x, inv_freq):
            return saved(x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2), inv_freq)

        rope = interleaved
        try:
            bad = reference_logits(cfg, params, tokens)
        finally:
            rope = saved
        self.assertGreater((good - bad).abs().max().item(), 1000 * (ABS_TOL + REL_TOL * good.abs().max().item()))

    def test_llama31_scaling_changes_frequencies(self):
        """The scaled case really exercises all three regimes of the Llama-3.1 rule."""
        cfg = CASES["gqa_llama31_rope"]
        scaled, plain = llama3_inv_freq(cfg), llama3_inv_freq(dict(cfg, rope_scaling=None))
        ratio = (plain / scaled).tolist()
        self.assertTrue(any(abs(r - 1) < 1e-12 for r in ratio))
        self.assertTrue(any(abs(r - 8) < 1e-9 for r in ratio))
        self.assertTrue(any(1.01 < r < 7.99 for r in ratio))


if __name__ == "__main__":
    unittest.main()
