#!/usr/bin/env bash
# parallel_bench.sh — meshtrain's training throughput on 1 device and on 2 virtual devices (ici_mesh.fsdp=2), against
# PyTorch's own data-parallel training from Python (bench/ddp_peer.py: Debian's python3-torch, Gloo,
# DistributedDataParallel; world 1 without the wrapper) on the same model, device count and global batch, in one run.
# Prints a table of medians over the steps after the warm-up: tokens/s, step time and its split (compute, comm, data
# wait), and the ratios meshtrain/peer at each degree and 2-device/1-device.
#
#   bench/parallel_bench.sh [BUILD_DIR]          default BUILD_DIR: build
#
# Runs, in this order (alternating meshtrain and the peer so that the pairs compared share the machine's state as
# far as possible):
#   meshtrain 1 device                      run --hosts 1 --devices-per-host 1 -- train ... ici_mesh.fsdp=1
#   pytorch world 1                         one process, no DDP wrapper
#   meshtrain 2 devices, 1 host             run --hosts 1 --devices-per-host 2 -- train ... ici_mesh.fsdp=2
#   pytorch world 2                         DDP over Gloo, 2 processes
#   meshtrain 2 hosts x 1 device            run --hosts 2 --devices-per-host 1 -- train ... ici_mesh.fsdp=2
#                                           (2 processes, like the peer; HOSTS2=0 skips it)
#   meshtrain 2 devices, no reshard         the 1-host 2-device run with parallel.reshard_after_forward=false (no
#                                           second all-gather in backward; NORESHARD=0 skips it)
# Every meshtrain run gets a fresh output_dir and checkpoint.resume=false, so reruns never resume.
#
# Environment (defaults):
#   MODEL=llama-10m GBS=8 BLOCK=256 STEPS=8    the model config name (configs/model/<MODEL>.yaml), global batch
#                                               rows, tokens per row, optimizer steps per run
#   WARMUP=2                                    first steps left out of the medians
#   DTYPE=fp32                                  or bf16 (meshtrain compute_dtype=bfloat16; the peer's torch.autocast)
#   CORES=$(nproc)                              cores split between the devices/ranks (threads = CORES / degree,
#                                               meshtrain's runtime.threads_per_device, the peer's set_num_threads)
#   HOSTS2=1 NORESHARD=1                        the two extra meshtrain 2-device variants above (0: skip)
#   MAX_LOAD=1.5 LOAD_WAIT_S=600                first wait (polling every 30 s, at most LOAD_WAIT_S) until the 1-minute
#                                               load average is below MAX_LOAD, then measure anyway (MAX_LOAD=: no wait);
#                                               the load before and after is printed with the table
#   SKIP_MESHTRAIN=1                            run only the PyTorch peer
#   MESHTRAIN_ARGS="k=v ..."                    extra overrides for `meshtrain train`
#   KEEP_DIR=path                               keep the runs' logs, metrics and the peer's JSON there
#   PEER_TIMEOUT_S=900                          give up on a peer run after this long
#
# The meshtrain data is its configured dataset (moby-dick-byte by default: byte tokens, so only 256 of the model's
# vocabulary occur), the peer's is random tokens over the whole vocabulary: the work per step is the same (the
# embedding and LM head are full size either way), the losses are not comparable. Cost: llama-10m (8.9M parameters
# with vocab 8192) at GBS=8 BLOCK=256 is ~0.12 TFLOP per step, a few seconds per step on 2 cores; the whole run takes
# about 5 minutes. llama-100m is ~1.2 TFLOP per step (~90 s per step on 2 cores): MODEL=llama-100m takes an hour.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
[[ -d $build ]] && build=$(cd "$build" && pwd)  # absolute: the runs start from the repository root
model=${MODEL:-llama-10m}
gbs=${GBS:-8}
block=${BLOCK:-256}
steps=${STEPS:-8}
warmup=${WARMUP:-2}
dtype=${DTYPE:-fp32}
cores=${CORES:-$(nproc)}
hosts2=${HOSTS2:-1}
noreshard=${NORESHARD:-1}
max_load=${MAX_LOAD-1.5}
load_wait=${LOAD_WAIT_S:-600}
python=/usr/bin/python3  # Debian's python3-torch

die() { echo "parallel_bench: $*" >&2; exit 1; }
[[ -f "$root/configs/model/$model.yaml" ]] || die "no model config configs/model/$model.yaml"
(( gbs % 2 == 0 )) || die "GBS=$gbs must be even (split over 2 devices)"
(( cores >= 2 )) || die "CORES=$cores: 2 devices need at least 2 cores (one thread each)"
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
  mkdir -p "$KEEP_DIR"; tmp=$(cd "$KEEP_DIR" && pwd)
else
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fi

load1() { cut -d' ' -f1 /proc/loadavg; }
if [[ -n $max_load ]]; then
  waited=0
  while awk -v l="$(load1)" -v m="$max_load" 'BEGIN{exit !(l >= m)}' && (( waited < load_wait )); do
    echo "== load average $(load1) >= $max_load; waiting (${waited}s of at most ${load_wait}s)" >&2
    sleep 30; waited=$((waited + 30))
  done
fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== load average before: $load_before" >&2
cd "$root"

run_meshtrain() {  # $1 name, $2 hosts, $3 devices per host, then extra overrides
  local name=$1 hosts=$2 dph=$3 out=$tmp/meshtrain-$1
  shift 3
  local devices=$((hosts * dph))
  rm -rf "$out"
  echo "== meshtrain, $hosts host(s) x $dph device(s) $*: model=$model global_batch_size=$gbs block_size=$block" \
    "max_steps=$steps" >&2
  # shellcheck disable=SC2086
  if ! "$meshtrain" run --hosts "$hosts" --devices-per-host "$dph" -- train model="$model" global_batch_size="$gbs" \
      block_size="$block" max_steps="$steps" logging_steps=1 output_dir="$out" ici_mesh.fsdp="$devices" \
      checkpoint.resume=false compute_dtype="$compute_dtype" runtime.threads_per_device=$((cores / devices)) \
      "$@" ${MESHTRAIN_ARGS:-} >"$tmp/meshtrain-$name.log" 2>&1; then
    tail -n 30 "$tmp/meshtrain-$name.log" >&2
    die "meshtrain $name failed (log above)"
  fi
  [[ -s $out/metrics.jsonl ]] ||
    { tail -n 30 "$tmp/meshtrain-$name.log" >&2; die "meshtrain wrote no $out/metrics.jsonl"; }
}

run_peer() {  # $1 world size
  echo "== PyTorch peer, world $1 ($([[ $1 == 1 ]] && echo 'no DDP' || echo 'DDP over Gloo'))" >&2
  # A time limit: once (2026-12-05) one DDP rank was left spinning in Gloo after the other had gone, for 20 minutes.
  timeout --kill-after=10 "${PEER_TIMEOUT_S:-900}" "$python" "$root/bench/ddp_peer.py" --model-config "$root/configs/model/$model.yaml" --world-size "$1" \
    --global-batch "$gbs" --block-size "$block" --steps "$steps" --warmup "$warmup" --dtype "$dtype" \
    --cores "$cores" >"$tmp/peer-$1.json" 2>"$tmp/peer-$1.log" ||
    { tail -n 30 "$tmp/peer-$1.log" >&2; die "the PyTorch peer at world $1 failed or ran past ${PEER_TIMEOUT_S:-900} s (log above)"; }
}

mt=$([[ ${SKIP_MESHTRAIN:-0} != 1 ]] && echo 1 || echo 0)
if [[ $mt == 1 ]]; then run_meshtrain one 1 1; fi
run_peer 1
if [[ $mt == 1 ]]; then run_meshtrain two 1 2; fi
run_peer 2
if [[ $mt == 1 && $hosts2 == 1 ]]; then run_meshtrain two-hosts 2 1; fi
if [[ $mt == 1 && $noreshard == 1 ]]; then
  run_meshtrain two-noreshard 1 2 parallel.reshard_after_forward=false
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

"$python" - "$tmp" "$model" "$gbs" "$block" "$steps" "$warmup" "$dtype" "$cores" "$load_before" "$load_after" <<'PY'
import json, os, statistics, sys
tmp, model, gbs, block, steps, warmup, dtype, cores, load_before, load_after = sys.argv[1:]
gbs, block, steps, warmup, cores = int(gbs), int(block), int(steps), int(warmup), int(cores)
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

t = cores // 2
runs = [(f"meshtrain 1 dev ({cores} thr)", meshtrain("one")),
        (f"pytorch 1 proc ({cores} thr)", peer(1)),
        (f"meshtrain 1x2 dev fsdp=2 ({t} thr/dev)", meshtrain("two")),
        (f"pytorch DDP 2 proc gloo ({t} thr/rank)", peer(2)),
        (f"meshtrain 2 hosts x 1 dev fsdp=2 ({t} thr)", meshtrain("two-hosts")),
        (f"meshtrain 1x2 dev fsdp=2 no reshard", meshtrain("two-noreshard"))]
fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
print(f"\nmodel={model} global_batch={gbs} block={block} steps={steps} (medians of steps {warmup + 1}..{steps}) "
      f"dtype={dtype} cores={cores}; load average (1/5/15 min) before {load_before}, after {load_after}; "
      f"peer data: random tokens, meshtrain data: its configured dataset")
w = 38
print(f"{'run':<{w}}{'tokens/s':>10}{'step s':>9}{'compute s':>11}{'comm s':>9}{'data s':>9}{'last loss':>11}")
for name, r in runs:
    if r is None:
        print(f"{name:<{w}}{'(not run)':>10}")
        continue
    loss = r["losses"][-1] if r.get("losses") else None
    print(f"{name:<{w}}{fmt(r['tokens_per_s'], 1):>10}{fmt(r['step_time_s']):>9}{fmt(r['compute_s']):>11}"
          f"{fmt(r['comm_s']):>9}{fmt(r['data_wait_s'], 4):>9}{fmt(loss, 4):>11}")
m1, p1, m2, p2, m2h, m2n = (r for _, r in runs)
ratio = lambda a, b: f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if a and b else "-"
print(f"\nmeshtrain / pytorch (tokens/s): 1 device {ratio(m1, p1)}, 2 devices {ratio(m2, p2)} "
      f"(2 hosts x 1: {ratio(m2h, p2)}, no reshard: {ratio(m2n, p2)})")
print(f"2 devices / 1 device (tokens/s): meshtrain {ratio(m2, m1)} (2 hosts x 1: {ratio(m2h, m1)}, "
      f"no reshard: {ratio(m2n, m1)}), pytorch {ratio(p2, p1)}")
d = max(abs(a - b) for a, b in zip(p1["losses"], p2["losses"]))
print(f"peer sanity: losses world 1 {[round(x, 5) for x in p1['losses']]}\n"
      f"                    world 2 {[round(x, 5) for x in p2['losses']]}  max |diff| {d:.2e}")
for name, other in (("1x2 devices", m2), ("2 hosts x 1", m2h), ("1x2 no reshard", m2n)):
    if m1 and other and all(x is not None for x in m1["losses"] + other["losses"]):
        dm = max(abs(a - b) for a, b in zip(m1["losses"], other["losses"]))
        print(f"meshtrain losses 1 device vs {name}: max |diff| {dm:.2e}")
if d > 1e-3:
    sys.exit("parallel_bench: the peer's losses differ between world 1 and world 2")
PY
