#!/usr/bin/env python3
"""ddp_peer.py — the PyTorch peer of meshtrain's data-parallel training (bench/parallel_bench.sh):
DistributedDataParallel over Gloo, doing the work meshtrain's runs do, step for step.

The Llama of bench/model_step_peer.py (HF-style modules, as a PyTorch user writes it), trained as meshtrain trains
it, from the same start and on the same batches:
  weights    --init DIR: a Hugging Face checkpoint directory (config.json, model.safetensors) that meshtrain's runs
             start from too (checkpoint.init_from=DIR). `--write-init DIR` writes one, drawn as meshtrain's
             initialisation draws (normal(0, initializer_range) for matrices, ones for RMSNorm weights), and exits.
  data       --batches FILE: one `meshtrain plan --step S --json` object per line, S = 0, 1, ...: the sample ids of
             the global batch of training step S + 1. The tokens come from --dataset (a token-shard directory), read
             as meshtrain reads them (bench/loader_peer.py's PackedTokens: sample i is tokens [i*T, i*T + T + 1) of
             the shards' stream). Rank r trains on rows [r*B/N, (r+1)*B/N) of each global batch, the rows meshtrain's
             device r holds with the rows over fsdp.
  optimizer  meshtrain's config (--defaults, configs/defaults.yaml): AdamW (optimizer.*), its learning-rate schedule
             (lr_scheduler.*: linear warm-up from 0, then cosine, linear or constant, as LrSchedule::at with steps
             counted from 1), gradient clipping to max_grad_norm; fp32, or bf16 under torch.autocast.
So the loss of every step is meshtrain's up to summation order, and the bench compares them before any ratio.

No torchrun: the script spawns its N ranks itself (torch.multiprocessing, MASTER_ADDR=127.0.0.1, a free port), each
with torch.set_num_threads(cores // N) and init_process_group("gloo"). World 1 runs in-process with no DDP wrapper.
The process settings (allocator, OpenMP wait policy, BLAS threads) come from the environment the caller sets; the
result names them.

Prints one JSON line on stdout when done. Times are medians over the steps after the warm-up, each step's time the
slowest rank's:
  step_time_s   whole optimizer step (reading the rank's rows + forward + backward with DDP's all-reduce + clip + AdamW)
  data_wait_s   reading this rank's rows of the global batch from the token shards
  comm_s        exposed communication: (forward+backward with DDP's gradient all-reduce) - (the same forward+backward
                under DDP's no_sync(), which skips the all-reduce), the latter timed by probes run on the last
                --comm-probes training steps' batches (no optimizer step; they leave training unchanged);
                0 at world 1; null with --comm-probes 0
  compute_s     step_time_s - data_wait_s - comm_s (null when comm_s is)
  losses        the global loss of every step (the mean over all ranks' tokens)
  settings      threads per rank and the environment's allocator, OpenMP and BLAS settings

  /usr/bin/python3 bench/ddp_peer.py --model-config llama-10m --write-init /tmp/init
  /usr/bin/python3 bench/ddp_peer.py --init /tmp/init --batches /tmp/batches.jsonl \
      --dataset assets/shards/moby-dick-byte --world-size 2 --steps 6
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
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_peer import PackedTokens  # noqa: E402  (meshtrain's samples of a token-shard directory)
from model_step_peer import Llama, hf_name, module_name, read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS_ENV = ("GLIBC_TUNABLES", "LD_PRELOAD", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def model_config(path):
    """The Llama keys of a model YAML (configs/model/<name>.yaml), or of its name, with head_dim filled in."""
    if not os.path.exists(path):
        path = os.path.join(ROOT, "configs/model", path + ".yaml")  # a name, like meshtrain's model=<name>
    c = load_yaml(path)
    if c.get("head_dim") is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if c.get("rope_scaling") or c.get("num_local_experts"):
        sys.exit(f"ddp_peer: {path}: the peer model (bench/model_step_peer.py) is a Llama without rope_scaling")
    return c


def initialize(model, c, seed):  # meshtrain's initialize_parameters: the same distributions
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, c["initializer_range"], generator=g)


def write_init(directory, c, seed):
    """A Hugging Face checkpoint directory of freshly initialised weights, for both sides to start from."""
    model = Llama(c)
    initialize(model, c, seed)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**c, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "float32"}, f,
                  indent=2)
    write_safetensors(os.path.join(directory, "model.safetensors"),
                      {hf_name(name): p for name, p in model.named_parameters()})


class Schedule:
    """meshtrain's LrSchedule::at (train/lr_schedule.cpp) as a LambdaLR factor: a linear warm-up from 0 over
    warmup_steps, then cosine, linear or constant to min_lr_ratio at max_steps; training steps count from 1."""

    def __init__(self, cfg, max_steps):
        self.decay, self.warmup, self.min_ratio = cfg["type"], cfg["warmup_steps"], cfg["min_lr_ratio"]
        self.max_steps = max_steps

    def __call__(self, index):  # LambdaLR's index of the step about to run, from 0
        step = index + 1
        if step < self.warmup:
            return step / self.warmup
        if self.decay == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.max_steps - self.warmup))
        factor = 0.5 * (1 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1 - progress
        return self.min_ratio + (1 - self.min_ratio) * factor


def worker(rank, a, c, batches, port, result_queue):
    world = a.world_size
    torch.set_num_threads(a.threads_per_rank)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = Llama(c)
    start = read_safetensors(os.path.join(a.init, "model.safetensors"))
    model.load_state_dict({module_name(name): value for name, value in start.items()}, strict=True)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    train = load_yaml(a.defaults)
    o = train["optimizer"]
    opt = torch.optim.AdamW(model.parameters(), lr=o["learning_rate"], betas=(o["beta1"], o["beta2"]),
                            eps=o["epsilon"], weight_decay=o["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Schedule(train["lr_scheduler"], a.steps))
    max_grad_norm = train["max_grad_norm"]
    dataset = PackedTokens(a.dataset, a.block_size)
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
        mine = torch.stack([dataset[i] for i in batches[step][rank * rows:(rank + 1) * rows]]).long()
        x, y = mine[:, :-1].contiguous(), mine[:, 1:].contiguous()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(x, y)
        t2 = time.perf_counter()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
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
    if rank == 0:
        result_queue.put(result_of(a, n_params, timings, probe_fb, losses))
    if world > 1:
        # No teardown: with torch 1.13, destroying DDP's process group while a Gloo thread still releases the last
        # collective's tensors can deadlock (the main thread holds the GIL and waits for the group's lock, the Gloo
        # thread holds the lock and waits for the GIL; seen here, a rank hung for good). The ranks agree they are
        # done, then leave without it (the result is already in the pipe).
        dist.barrier()
        os._exit(0)


def result_of(a, n_params, timings, probe_fb, losses):
    """The JSON result: medians over the steps after the warm-up, the losses and the settings."""
    world = a.world_size
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
    return {
        "peer": "pytorch-ddp-gloo" if world > 1 else "pytorch-single",
        "torch": torch.__version__, "world_size": world, "params": n_params, "dtype": a.dtype,
        "settings": {"threads_per_rank": a.threads_per_rank, **{k: os.environ.get(k) for k in SETTINGS_ENV}},
        "global_batch": a.global_batch, "block_size": a.block_size, "steps": a.steps, "warmup_steps": a.warmup,
        "tokens_per_s": a.global_batch * a.block_size / step_s if step_s else None,
        "step_time_s": step_s, "data_wait_s": data_s,
        "compute_s": step_s - data_s - comm if comm is not None and step_s else None,
        "comm_s": comm,
        "fwd_bwd_s": med(timings["fwd_bwd"]), "optimizer_s": med(timings["opt"]),
        "fwd_bwd_no_sync_s": statistics.median(probe_fb) if probe_fb else None,
        "step_times_s": timings["step"], "losses": losses,
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_batches(path, steps, global_batch):
    """The global batches' sample ids, one `meshtrain plan --json` object per line, in step order."""
    plans = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    batches = [p["data"]["global_batch"] for p in plans]
    if len(batches) < steps or any(len(b) != global_batch for b in batches):
        sys.exit(f"ddp_peer: {path} has {len(batches)} global batches of {[len(b) for b in batches]} rows; "
                 f"{steps} of {global_batch} are needed")
    return batches


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-init", metavar="DIR", help="write initial weights there (and config.json), then exit")
    ap.add_argument("--model-config", default="llama-10m",
                    help="with --write-init: a model YAML (configs/model/llama-10m.yaml) or its name (llama-10m)")
    ap.add_argument("--seed", type=int, default=42, help="with --write-init: the initial weights' seed")
    ap.add_argument("--init", metavar="DIR", help="the checkpoint directory to start from (config.json, weights)")
    ap.add_argument("--batches", help="the global batches: `meshtrain plan --step S --json` lines, S = 0, 1, ...")
    ap.add_argument("--dataset", help="the token-shard directory the batches' sample ids index")
    ap.add_argument("--defaults", default=os.path.join(ROOT, "configs/defaults.yaml"),
                    help="meshtrain's config: optimizer, lr_scheduler, max_grad_norm")
    ap.add_argument("--world-size", type=int, default=1, help="ranks (processes); 1: no DDP wrapper")
    ap.add_argument("--global-batch", type=int, default=8, help="rows per optimizer step over all ranks")
    ap.add_argument("--block-size", type=int, default=256, help="tokens per row")
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps (meshtrain's max_steps)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="cores to split between the ranks")
    ap.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's gradient bucket size (its default)")
    ap.add_argument("--comm-probes", type=int, default=2,
                    help="no_sync forward+backward probes for comm_s (world > 1; 0: comm_s is null)")
    a = ap.parse_args()
    if a.write_init:
        write_init(a.write_init, model_config(a.model_config), a.seed)
        return
    if not (a.init and a.batches and a.dataset):
        sys.exit("ddp_peer: --init, --batches and --dataset are needed to train (or --write-init DIR)")
    if a.global_batch % a.world_size:
        sys.exit(f"ddp_peer: global batch {a.global_batch} is not divisible by world size {a.world_size}")
    if a.steps <= a.warmup:
        sys.exit(f"ddp_peer: --steps {a.steps} leaves nothing after --warmup {a.warmup}")
    a.threads_per_rank = max(1, a.cores // a.world_size)
    with open(os.path.join(a.init, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    batches = read_batches(a.batches, a.steps, a.global_batch)
    if a.world_size == 1:
        import queue
        q = queue.Queue()
        worker(0, a, c, batches, None, q)
    else:
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        mp.spawn(worker, args=(a, c, batches, free_port(), q), nprocs=a.world_size, join=True)
    print(json.dumps(q.get()), flush=True)


if __name__ == "__main__":
    main()
