#!/usr/bin/env bash
# parallel_bench.sh — meshtrain's training throughput on 1 device and on 2 virtual devices (ici_mesh.fsdp=2), against
# PyTorch's own data-parallel training from Python (bench/ddp_peer.py: Debian's python3-torch, Gloo,
# DistributedDataParallel; world 1 without the wrapper) on the same model, device count and global batch, in one run.
# Prints a table of medians over the steps after the warm-up: tokens/s, step time and its split (compute, comm, data
# wait), and the ratios meshtrain/peer at each degree and 2-device/1-device.
#
#   bench/parallel_bench.sh [BUILD_DIR]          default BUILD_DIR: build
#
# Environment (defaults):
#   MODEL=llama-100m GBS=8 BLOCK=256 STEPS=6   the model config name (configs/model/<MODEL>.yaml), global batch
#                                               rows, tokens per row, optimizer steps per run
#   WARMUP=2                                    first steps left out of the medians
#   DTYPE=fp32                                  or bf16 (meshtrain compute_dtype=bfloat16; the peer's torch.autocast)
#   CORES=$(nproc)                              cores split between the devices/ranks (threads = CORES / degree)
#   SKIP_MESHTRAIN=1                            run only the PyTorch peer (c, d)
#   MESHTRAIN_ARGS="k=v ..."                    extra overrides for `meshtrain train`
#   KEEP_DIR=path                               keep the runs' logs, metrics and the peer's JSON there
#
# The runs alternate meshtrain and the peer at each degree (1 then 2 devices) so that the pairs compared share the
# machine's state as far as possible. Cost: llama-100m at GBS=8 BLOCK=256 is ~1.2 TFLOP per step; on 2 cores that is
# tens of seconds per step, so the whole run takes minutes (llama-tiny: seconds).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
model=${MODEL:-llama-100m}
gbs=${GBS:-8}
block=${BLOCK:-256}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
dtype=${DTYPE:-fp32}
cores=${CORES:-$(nproc)}
python=/usr/bin/python3  # Debian's python3-torch

die() { echo "parallel_bench: $*" >&2; exit 1; }
[[ -f "$root/configs/model/$model.yaml" ]] || die "no model config configs/model/$model.yaml"
(( gbs % 2 == 0 )) || die "GBS=$gbs must be even (split over 2 devices)"
(( steps > warmup )) || die "STEPS=$steps leaves nothing after WARMUP=$warmup"
case $dtype in fp32) compute_dtype=float32 ;; bf16) compute_dtype=bfloat16 ;; *) die "DTYPE is fp32 or bf16" ;; esac
"$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
  die "$python lacks torch with Gloo (apt-get install python3-torch)"

if [[ ${SKIP_MESHTRAIN:-0} != 1 ]]; then
  meshtrain=$build/meshtrain
  [[ -x $meshtrain ]] || die "no meshtrain binary at $meshtrain (build it, or give the build dir as the argument)"
  if ! "$meshtrain" train --help >/dev/null 2>&1; then
    die "$meshtrain has no 'train' verb (its verbs: $("$meshtrain" --help 2>&1 | awk '/^  [a-z]/{printf "%s ", $1}'));
  rebuild it, or run only the PyTorch peer with SKIP_MESHTRAIN=1"
  fi
fi

if [[ -n ${KEEP_DIR:-} ]]; then
  tmp=$KEEP_DIR; mkdir -p "$tmp"
else
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fi

run_meshtrain() {  # $1 name, $2 devices
  local out=$tmp/meshtrain-$1
  rm -rf "$out"
  echo "== meshtrain, $2 device(s): model=$model global_batch_size=$gbs block_size=$block max_steps=$steps" >&2
  # shellcheck disable=SC2086
  if ! "$meshtrain" run --hosts 1 --devices-per-host "$2" -- train model="$model" global_batch_size="$gbs" \
      block_size="$block" max_steps="$steps" logging_steps=1 output_dir="$out" ici_mesh.fsdp="$2" \
      checkpoint.resume=false compute_dtype="$compute_dtype" runtime.threads_per_device=$((cores / $2)) \
      ${MESHTRAIN_ARGS:-} >"$tmp/meshtrain-$1.log" 2>&1; then
    tail -n 30 "$tmp/meshtrain-$1.log" >&2
    die "meshtrain on $2 device(s) failed (log above)"
  fi
  [[ -s $out/metrics.jsonl ]] ||
    { tail -n 30 "$tmp/meshtrain-$1.log" >&2; die "meshtrain wrote no $out/metrics.jsonl"; }
}

run_peer() {  # $1 world size
  echo "== PyTorch peer, world $1 ($([[ $1 == 1 ]] && echo 'no DDP' || echo 'DDP over Gloo'))" >&2
  "$python" "$root/bench/ddp_peer.py" --model-config "$root/configs/model/$model.yaml" --world-size "$1" \
    --global-batch "$gbs" --block-size "$block" --steps "$steps" --warmup "$warmup" --dtype "$dtype" \
    --cores "$cores" >"$tmp/peer-$1.json" 2>"$tmp/peer-$1.log" ||
    { tail -n 30 "$tmp/peer-$1.log" >&2; die "the PyTorch peer at world $1 failed (log above)"; }
}

if [[ ${SKIP_MESHTRAIN:-0} != 1 ]]; then run_meshtrain one 1; fi
run_peer 1
if [[ ${SKIP_MESHTRAIN:-0} != 1 ]]; then run_meshtrain two 2; fi
run_peer 2

"$python" - "$tmp" "$model" "$gbs" "$block" "$steps" "$warmup" "$dtype" "$cores" <<'PY'
import json, os, statistics, sys
tmp, model, gbs, block, steps, warmup, dtype, cores = sys.argv[1:]
gbs, block, steps, warmup = int(gbs), int(block), int(steps), int(warmup)
tokens = gbs * block
keys = ("step_time_s", "compute_s", "comm_s", "data_wait_s")

def meshtrain(name):
    path = os.path.join(tmp, f"meshtrain-{name}", "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = sorted((r for r in rows if "step_time_s" in r), key=lambda r: r["step"])
    kept = rows[warmup:]
    if not kept:
        sys.exit(f"parallel_bench: {path} has {len(rows)} step rows, none after the {warmup} warm-up steps")
    med = {k: statistics.median(r[k] for r in kept) if all(r.get(k) is not None for r in kept) else None
           for k in keys}
    med["tokens_per_s"] = tokens / med["step_time_s"]
    own = [r["tokens_per_s"] for r in kept if r.get("tokens_per_s") is not None]
    if own and abs(statistics.median(own) / med["tokens_per_s"] - 1) > 0.05:
        print(f"note: meshtrain-{name} reports median tokens_per_s {statistics.median(own):.1f}, "
              f"global tokens / median step_time_s gives {med['tokens_per_s']:.1f}", file=sys.stderr)
    med["losses"] = [r.get("loss") for r in rows]
    med["steps"] = len(rows)
    return med

def peer(world):
    r = json.load(open(os.path.join(tmp, f"peer-{world}.json")))
    r["tokens_per_s"] = tokens / r["step_time_s"]
    return r

runs = [("meshtrain 1 device", meshtrain("one")), ("meshtrain 2 dev fsdp=2", meshtrain("two")),
        ("pytorch 1 proc", peer(1)), ("pytorch DDP 2 proc gloo", peer(2))]
fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
print(f"\nmodel={model} global_batch={gbs} block={block} steps={steps} (medians of steps {warmup + 1}..{steps}) "
      f"dtype={dtype} cores={cores}; peer data: random tokens, meshtrain data: its configured dataset")
print(f"{'run':<26}{'tokens/s':>10}{'step s':>10}{'compute s':>11}{'comm s':>9}{'data s':>9}{'last loss':>11}")
for name, r in runs:
    if r is None:
        print(f"{name:<26}{'(not run)':>10}")
        continue
    loss = r["losses"][-1] if r.get("losses") else None
    print(f"{name:<26}{fmt(r['tokens_per_s'], 1):>10}{fmt(r['step_time_s']):>10}{fmt(r['compute_s']):>11}"
          f"{fmt(r['comm_s']):>9}{fmt(r['data_wait_s'], 4):>9}{fmt(loss, 4):>11}")
m1, m2, p1, p2 = (r for _, r in runs)
ratio = lambda a, b: f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if a and b else "-"
print(f"\nmeshtrain / pytorch (tokens/s): 1 device {ratio(m1, p1)}, 2 devices {ratio(m2, p2)}")
print(f"2 devices / 1 device (tokens/s): meshtrain {ratio(m2, m1)}, pytorch {ratio(p2, p1)}")
d = max(abs(a - b) for a, b in zip(p1["losses"], p2["losses"]))
print(f"peer sanity: losses world 1 {[round(x, 5) for x in p1['losses']]}\n"
      f"                    world 2 {[round(x, 5) for x in p2['losses']]}  max |diff| {d:.2e}")
if d > 1e-3:
    sys.exit("parallel_bench: the peer's losses differ between world 1 and world 2")
if m1 and m2 and all(x is not None for x in m1["losses"] + m2["losses"]):
    d = max(abs(a - b) for a, b in zip(m1["losses"], m2["losses"]))
    print(f"meshtrain losses 1 vs 2 devices: max |diff| {d:.2e}")
PY
