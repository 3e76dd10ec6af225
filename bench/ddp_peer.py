#!/usr/bin/env python3
"""ddp_peer.py — the PyTorch peer of meshtrain's data-parallel training: DistributedDataParallel over Gloo.

The Llama of bench/model_step_peer.py (HF-style modules, as a PyTorch user writes it), trained the way meshtrain
trains it: meshtrain's initialisation (normal(0, initializer_range) for matrices, ones for RMSNorm weights, the same
seed on every rank), AdamW (lr 3e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.01) behind meshtrain's default
schedule (linear warm-up over 5 steps from 0, then cosine to 0.1x; step index 0-based), gradient clipping to global
norm 1.0, fp32 or bf16 (torch.autocast on CPU).

Data: random tokens (uniform over the vocabulary), one global batch of B rows x (T+1) tokens per step drawn from a
seeded generator; rank r trains on rows [r*B/N, (r+1)*B/N). Every world size therefore sees the same data, and the
loss (the mean over all ranks) must be the same at world 1 and world N up to reduction order.

No torchrun: the script spawns its N ranks itself (torch.multiprocessing, MASTER_ADDR=127.0.0.1, a free port), each
with torch.set_num_threads(cores // N) and init_process_group("gloo"). World 1 runs in-process with no DDP wrapper.

Prints one JSON line on stdout when done. Times are medians over the steps after the warm-up, each step's time the
slowest rank's:
  step_time_s   whole optimizer step (batch slicing + forward + backward with DDP's all-reduce + clip + AdamW)
  data_wait_s   drawing the batch and slicing this rank's rows
  comm_s        exposed communication: (forward+backward with DDP's gradient all-reduce) - (the same forward+backward
                under DDP's no_sync(), which skips the all-reduce), the latter timed by probes run on the last
                --comm-probes training steps' batches (no optimizer step; they leave training unchanged);
                0 at world 1; null with --comm-probes 0
  compute_s     step_time_s - data_wait_s - comm_s (null when comm_s is)

  /usr/bin/python3 bench/ddp_peer.py --model-config configs/model/llama-100m.yaml --world-size 2 \
      --global-batch 8 --block-size 256 --steps 6
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_step_peer import Llama  # noqa: E402  (the peer model, shared with model_step_bench)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
               "initializer_range"]


def load_yaml(path):
    try:
        import yaml
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except ImportError:  # a tiny parser for the flat `key: value` files under configs/model
        out = {}
        for line in open(path, encoding="utf-8"):
            line = line.split("#", 1)[0].rstrip()
            if not line or line.startswith(" ") or ":" not in line:
                continue
            k, v = (s.strip() for s in line.split(":", 1))
            low = v.lower()
            if low in ("null", "~", ""):
                out[k] = None
            elif low in ("true", "false"):
                out[k] = low == "true"
            else:
                try:
                    out[k] = int(v)
                except ValueError:
                    try:
                        out[k] = float(v)
                    except ValueError:
                        out[k] = v
        return out


def model_config(a):
    path = a.model_config
    if path and not os.path.exists(path) and os.path.exists(os.path.join(ROOT, "configs/model", path + ".yaml")):
        path = os.path.join(ROOT, "configs/model", path + ".yaml")  # a name, like meshtrain's model=<name>
    c = load_yaml(path) if path else {}
    for k in CONFIG_KEYS:  # --hidden-size etc. override the file (or give the whole config without one)
        v = getattr(a, k)
        if v is not None:
            c[k] = v
    c.setdefault("rope_theta", 500000.0)
    c.setdefault("rms_norm_eps", 1e-5)
    c.setdefault("tie_word_embeddings", False)
    c.setdefault("initializer_range", 0.02)
    missing = [k for k in CONFIG_KEYS if k != "head_dim" and c.get(k) is None]
    if missing:
        sys.exit(f"ddp_peer: the model config lacks {missing} (give --model-config or the flags)")
    if c.get("head_dim") is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if c.get("rope_scaling"):
        sys.exit("ddp_peer: rope_scaling is not supported by the peer model (bench/model_step_peer.py)")
    return c


def lr_factor(step, a):  # meshtrain's LrSchedule::at (cosine): linear warm-up from 0, then cosine to min_lr_ratio
    if step < a.lr_warmup_steps:
        return step / a.lr_warmup_steps
    span = max(1, a.steps - a.lr_warmup_steps)
    progress = min(1.0, (step - a.lr_warmup_steps) / span)
    return a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def initialize(model, c, seed):  # meshtrain's initialize_parameters
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, c["initializer_range"], generator=g)


def worker(rank, a, c, port, result_queue):
    world = a.world_size
    torch.set_num_threads(a.threads_per_rank)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    model = Llama(c)
    initialize(model, c, a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, a))
    data = torch.Generator().manual_seed(a.seed + 1)
    rows = a.global_batch // world
    V = c["vocab_size"]
    bf16 = a.dtype == "bf16"

    def forward_backward(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = ddp(x)
        loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        loss.backward()
        return loss

    timings = {k: [] for k in ("step", "data", "fwd_bwd", "opt")}
    probe_fb, losses = [], []
    probes = 0 if world == 1 else min(a.comm_probes, a.steps - a.warmup)
    for step in range(a.steps):
        t0 = time.perf_counter()
        batch = torch.randint(0, V, (a.global_batch, a.block_size + 1), generator=data)
        mine = batch[rank * rows:(rank + 1) * rows]
        x, y = mine[:, :-1].contiguous(), mine[:, 1:].contiguous()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(x, y)
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
        opt.step()
        sched.step()
        t3 = time.perf_counter()
        for k, v in zip(timings, (t3 - t0, t1 - t0, t2 - t1, t3 - t2)):
            timings[k].append(v)
        losses.append(loss.item())
        if step >= a.steps - probes:  # the same forward+backward without the all-reduce; the grads are dropped
            dist.barrier()
            opt.zero_grad(set_to_none=True)
            p0 = time.perf_counter()
            with ddp.no_sync():
                forward_backward(x, y)
            probe_fb.append(time.perf_counter() - p0)
            opt.zero_grad(set_to_none=True)
            dist.barrier()

    def reduce(values, op):  # per-step values over ranks: the slowest rank's time, the mean loss
        t = torch.tensor(values, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(t, op=op)
        return t.tolist()

    mx = dist.ReduceOp.MAX if world > 1 else None
    timings = {k: reduce(v, mx) for k, v in timings.items()}
    probe_fb = reduce(probe_fb, mx) if probe_fb else []
    losses = [v / world for v in reduce(losses, dist.ReduceOp.SUM if world > 1 else None)]
    if world > 1:
        dist.destroy_process_group()
    if rank != 0:
        return
    med = lambda v: statistics.median(v[a.warmup:]) if len(v) > a.warmup else None  # noqa: E731
    step_s, data_s = med(timings["step"]), med(timings["data"])
    if world == 1:
        comm = 0.0
    elif probe_fb:
        # synced fwd+bwd of the same steps as the probes, to compare like with like
        synced = statistics.median(timings["fwd_bwd"][a.steps - len(probe_fb):])
        comm = max(0.0, synced - statistics.median(probe_fb))
    else:
        comm = None
    result = {
        "peer": "pytorch-ddp-gloo" if world > 1 else "pytorch-single",
        "torch": torch.__version__, "world_size": world, "threads_per_rank": a.threads_per_rank,
        "params": n_params, "dtype": a.dtype, "data": "random tokens (seeded, uniform over the vocabulary)",
        "global_batch": a.global_batch, "block_size": a.block_size, "steps": a.steps, "warmup_steps": a.warmup,
        "tokens_per_s": a.global_batch * a.block_size / step_s if step_s else None,
        "step_time_s": step_s, "data_wait_s": data_s,
        "compute_s": step_s - data_s - comm if comm is not None and step_s else None,
        "comm_s": comm,
        "fwd_bwd_s": med(timings["fwd_bwd"]), "optimizer_s": med(timings["opt"]),
        "fwd_bwd_no_sync_s": statistics.median(probe_fb) if probe_fb else None,
        "step_times_s": timings["step"], "losses": losses,
    }
    result_queue.put(result)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-config", help="a model YAML (configs/model/llama-100m.yaml) or its name (llama-100m)")
    for k in CONFIG_KEYS:
        kind = {"rope_theta": float, "rms_norm_eps": float, "initializer_range": float,
                "tie_word_embeddings": lambda s: s.lower() in ("1", "true", "yes")}.get(k, int)
        ap.add_argument("--" + k.replace("_", "-"), dest=k, type=kind, help="overrides the model config")
    ap.add_argument("--world-size", type=int, default=1, help="ranks (processes); 1: no DDP wrapper")
    ap.add_argument("--global-batch", type=int, default=8, help="rows per optimizer step over all ranks")
    ap.add_argument("--block-size", type=int, default=256, help="tokens per row")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="cores to split between the ranks")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--lr-warmup-steps", type=int, default=5)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's gradient bucket size (its default)")
    ap.add_argument("--comm-probes", type=int, default=2,
                    help="no_sync forward+backward probes for comm_s (world > 1; 0: comm_s is null)")
    a = ap.parse_args()
    if a.global_batch % a.world_size:
        sys.exit(f"ddp_peer: global batch {a.global_batch} is not divisible by world size {a.world_size}")
    if a.steps <= a.warmup:
        sys.exit(f"ddp_peer: --steps {a.steps} leaves nothing after --warmup {a.warmup}")
    a.threads_per_rank = max(1, a.cores // a.world_size)
    c = model_config(a)
    if a.world_size == 1:
        import queue
        q = queue.Queue()
        worker(0, a, c, None, q)
    else:
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        mp.spawn(worker, args=(a, c, free_port(), q), nprocs=a.world_size, join=True)
    print(json.dumps(q.get()), flush=True)


if __name__ == "__main__":
    main()
