#!/usr/bin/env bash
# parallel_bench.sh — meshtrain's training throughput on 1 device and on 2 virtual devices (ici_mesh.fsdp=2), against
# PyTorch's own data-parallel training from Python (bench/ddp_peer.py: Debian's python3-torch, Gloo,
# DistributedDataParallel; world 1 without the wrapper) doing the same work: the same model, initial weights, token
# batches, AdamW, schedule and clipping, device count and global batch, in one run. The bench proves the work equal
# before it compares speed: every step's loss of each peer run must match the meshtrain runs of its degree within
# LOSS_RTOL (relative), or it prints the losses and exits 1 without a ratio. Then it prints a table of medians over the
# steps after the warm-up (tokens/s, step time and its split: compute, comm, data wait) and the ratios meshtrain/peer
# at each degree and 2-device/1-device, under a header naming the CPU (model and SIMD flags), the commit, the load
# average and each side's process settings.
#
#   bench/parallel_bench.sh [BUILD_DIR]          default BUILD_DIR: build
#   QUICK=1 bench/parallel_bench.sh              the same checks on a small run (about 1-2 minutes on 2 cores)
#
# Equal work, how: the peer writes freshly initialised weights once (meshtrain's initialisation: normal(0,
# initializer_range) matrices, ones for RMSNorm weights) as a Hugging Face directory; every meshtrain run starts from
# it (checkpoint.init_from) and every peer run loads it. `meshtrain plan --step S --json` lists the sample ids of each
# step's global batch; the peer reads those samples from the same token shards. The peer takes optimizer, schedule
# and clipping from configs/defaults.yaml.
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
# Environment (defaults; QUICK=1 changes the defaults marked q: to those values):
#   MODEL=llama-10m GBS=8 BLOCK=256 STEPS=8    the model config name (configs/model/<MODEL>.yaml), global batch
#     (q: llama-10m 4 128 4)                    rows, tokens per row, optimizer steps per run
#   WARMUP=2 (q: 1)                             first steps left out of the medians
#   DATASET=moby-dick-byte                      dataset.path of both sides (a token-shard directory, or its name
#                                               under assets/shards)
#   DTYPE=fp32                                  or bf16 (meshtrain compute_dtype=bfloat16; the peer's torch.autocast)
#   LOSS_RTOL=1e-4 (bf16: 2e-2)                 the largest relative difference allowed between the two sides' loss
#                                               at any step (fp32 measured: 4e-6 over 4 steps, BENCHMARKS.md; bf16 as
#                                               model_step_bench's)
#   CORES=$(nproc)                              cores split between the devices/ranks (threads = CORES / degree,
#                                               meshtrain's runtime.threads_per_device, the peer's set_num_threads,
#                                               OMP_NUM_THREADS and OPENBLAS_NUM_THREADS)
#   PEER_MALLOC=tcmalloc                        the peer's allocator: tcmalloc or jemalloc (Debian's
#                                               libtcmalloc-minimal4 / libjemalloc2 by LD_PRELOAD; scripts/setup.sh
#                                               installs both), glibc-tuned (GLIBC_TUNABLES: one arena, no mmap'd
#                                               chunks, no trimming: what meshtrain sets for itself), or glibc (its
#                                               defaults). tcmalloc took the least CPU time and page faults
#                                               (BENCHMARKS.md, issue 7's section)
#   PEER_OMP_WAIT=PASSIVE                       the peer's OMP_WAIT_POLICY (idle OpenMP threads sleep, as meshtrain's)
#   HOSTS2=1 NORESHARD=1 (q: 0 0)               the two extra meshtrain 2-device variants above (0: skip)
#   MAX_LOAD=1.5 (q: empty) LOAD_WAIT_S=600     first wait (polling every 30 s, at most LOAD_WAIT_S) until the 1-minute
#                                               load average is below MAX_LOAD, then measure anyway (MAX_LOAD=: no wait);
#                                               the load before and after is printed with the table
#   SKIP_MESHTRAIN=1                            run only the PyTorch peer (no loss check, no ratios)
#   MESHTRAIN_ARGS="k=v ..."                    extra overrides for `meshtrain train` and `plan` (an override that
#                                               changes the work, such as the learning rate, fails the loss check)
#   KEEP_DIR=path                               keep the runs' logs, metrics, the peer's JSON, the initial weights and
#                                               the batches there
#   PEER_TIMEOUT_S=900                          give up on a peer run after this long
#
# Cost: llama-10m (8.9M parameters with vocab 8192) at GBS=8 BLOCK=256 is ~0.12 TFLOP per step, a few seconds per step
# on 2 cores; the whole run takes about 5 minutes. llama-100m is ~1.2 TFLOP per step (~90 s per step on 2 cores):
# MODEL=llama-100m takes an hour.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/bench_common.sh
source "$root/bench/bench_common.sh"
build=${1:-$root/build}
[[ -d $build ]] && build=$(cd "$build" && pwd)  # absolute: the runs start from the repository root
model=${MODEL:-llama-10m}
gbs=${GBS:-$(q 4 8)}
block=${BLOCK:-$(q 128 256)}
steps=${STEPS:-$(q 4 8)}
warmup=${WARMUP:-$(q 1 2)}
dataset=${DATASET:-moby-dick-byte}
dtype=${DTYPE:-fp32}
cores=${CORES:-$(nproc)}
hosts2=${HOSTS2:-$(q 0 1)}
noreshard=${NORESHARD:-$(q 0 1)}
max_load=${MAX_LOAD-$(q "" 1.5)}
load_wait=${LOAD_WAIT_S:-600}
peer_malloc=${PEER_MALLOC:-tcmalloc}
python=/usr/bin/python3  # Debian's python3-torch

die() { echo "parallel_bench: $*" >&2; exit 1; }
[[ -f "$root/configs/model/$model.yaml" ]] || die "no model config configs/model/$model.yaml"
(( gbs % 2 == 0 )) || die "GBS=$gbs must be even (split over 2 devices)"
(( cores >= 2 )) || die "CORES=$cores: 2 devices need at least 2 cores (one thread each)"
(( steps > warmup )) || die "STEPS=$steps leaves nothing after WARMUP=$warmup"
case $dtype in
  fp32) compute_dtype=float32 loss_rtol=${LOSS_RTOL:-1e-4} ;;
  bf16) compute_dtype=bfloat16 loss_rtol=${LOSS_RTOL:-2e-2} ;;
  *) die "DTYPE is fp32 or bf16" ;;
esac
"$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
  die "$python lacks torch with Gloo (apt-get install python3-torch)"
dataset_dir=$dataset
[[ -d $dataset_dir ]] || dataset_dir=$root/assets/shards/$dataset
[[ -f $dataset_dir/index.json ]] ||
  die "no token-shard directory $dataset or $dataset_dir (bash scripts/prepare_default_shards.sh build/meshtrain)"

# The peer's process settings: allocator, OpenMP waits; the threads per rank are set per run.
lib=/usr/lib/x86_64-linux-gnu
tunables=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776
case $peer_malloc in
  jemalloc) peer_env=(LD_PRELOAD="$lib/libjemalloc.so.2") ;;
  tcmalloc) peer_env=(LD_PRELOAD="$lib/libtcmalloc_minimal.so.4") ;;
  glibc-tuned) peer_env=(GLIBC_TUNABLES="$tunables") ;;
  glibc) peer_env=() ;;
  *) die "PEER_MALLOC is tcmalloc, jemalloc, glibc-tuned or glibc" ;;
esac
if [[ ${peer_env[0]:-} == LD_PRELOAD=* && ! -f ${peer_env[0]#LD_PRELOAD=} ]]; then
  die "PEER_MALLOC=$peer_malloc: ${peer_env[0]#LD_PRELOAD=} is missing (bash scripts/setup.sh installs it)"
fi
peer_env+=(OMP_WAIT_POLICY="${PEER_OMP_WAIT:-PASSIVE}")

meshtrain=$build/meshtrain
[[ -x $meshtrain ]] || die "no meshtrain binary at $meshtrain (build it, or give the build dir as the argument)"
if ! "$meshtrain" train --help >/dev/null 2>&1; then
  die "$meshtrain has no 'train' verb (its verbs: $("$meshtrain" --help 2>&1 | awk '/^  [a-z]/{printf "%s ", $1}'));
  rebuild it"
fi

if [[ -n ${KEEP_DIR:-} ]]; then
  mkdir -p "$KEEP_DIR"; tmp=$(cd "$KEEP_DIR" && pwd)
else
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fi

wait_for_load_below "$max_load" "$load_wait"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== load average before: $load_before" >&2
cd "$root"
# The record's header: the CPU (lscpu's model and the flags that decide matmul speed), the commit, the date.
cpu=$(cpu_description)
commit=$(source_commit "$root")
started=$(date -u '+%Y-%m-%d %H:%M UTC')

# The shared start: initial weights, and the sample ids of every step's global batch.
overrides=(model="$model" global_batch_size="$gbs" block_size="$block" dataset.path="$dataset")
# shellcheck disable=SC2206
extra=(${MESHTRAIN_ARGS:-})
echo "== initial weights and the global batches of steps 1..$steps" >&2
rm -rf "$tmp/init"
"$python" "$root/bench/ddp_peer.py" --model-config "$model" --write-init "$tmp/init" ||
  die "the peer could not write the initial weights"
: >"$tmp/batches.jsonl"
for ((s = 0; s < steps; s++)); do
  "$meshtrain" plan --step "$s" --json "${overrides[@]}" "${extra[@]}" >>"$tmp/batches.jsonl" ||
    die "meshtrain plan --step $s failed"
done

run_meshtrain() {  # $1 name, $2 hosts, $3 devices per host, then extra overrides
  local name=$1 hosts=$2 dph=$3 out=$tmp/meshtrain-$1
  shift 3
  local devices=$((hosts * dph))
  rm -rf "$out"
  echo "== meshtrain, $hosts host(s) x $dph device(s) $*: model=$model global_batch_size=$gbs block_size=$block" \
    "max_steps=$steps" >&2
  if ! "$meshtrain" run --hosts "$hosts" --devices-per-host "$dph" -- train "${overrides[@]}" max_steps="$steps" \
      logging_steps=1 output_dir="$out" ici_mesh.fsdp="$devices" checkpoint.resume=false \
      checkpoint.init_from="$tmp/init" compute_dtype="$compute_dtype" runtime.threads_per_device=$((cores / devices)) \
      "$@" "${extra[@]}" >"$tmp/meshtrain-$name.log" 2>&1; then
    tail -n 30 "$tmp/meshtrain-$name.log" >&2
    die "meshtrain $name failed (log above)"
  fi
  [[ -s $out/metrics.jsonl ]] ||
    { tail -n 30 "$tmp/meshtrain-$name.log" >&2; die "meshtrain wrote no $out/metrics.jsonl"; }
}

run_peer() {  # $1 world size
  local threads=$((cores / $1))
  echo "== PyTorch peer, world $1 ($([[ $1 == 1 ]] && echo 'no DDP' || echo 'DDP over Gloo')), ${peer_env[*]}" >&2
  # A time limit: once (2026-12-05) one DDP rank was left spinning in Gloo after the other had gone, for 20 minutes.
  env "${peer_env[@]}" OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads \
    timeout --kill-after=10 "${PEER_TIMEOUT_S:-900}" "$python" "$root/bench/ddp_peer.py" --init "$tmp/init" \
    --batches "$tmp/batches.jsonl" --dataset "$dataset_dir" --world-size "$1" --global-batch "$gbs" \
    --block-size "$block" --steps "$steps" --warmup "$warmup" --dtype "$dtype" --cores "$cores" \
    >"$tmp/peer-$1.json" 2>"$tmp/peer-$1.log" ||
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

"$python" - "$tmp" "$model" "$gbs" "$block" "$steps" "$warmup" "$dtype" "$cores" "$load_before" "$load_after" \
  "$loss_rtol" "$cpu" "$commit" "$started" "$dataset" <<'PY'
import json, os, re, statistics, sys
(tmp, model, gbs, block, steps, warmup, dtype, cores, load_before, load_after, loss_rtol, cpu, commit,
 started, dataset) = sys.argv[1:]
gbs, block, steps, warmup, cores, loss_rtol = int(gbs), int(block), int(steps), int(warmup), int(cores), float(loss_rtol)
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
    # Its settings, from host 0's start-up line: "... N torch threads per device (OpenBLAS ...; OpenMP: ...)"
    log = open(os.path.join(tmp, f"meshtrain-{name}.log"), errors="replace").read()
    m = re.search(r"(\d+ torch threads per device \(.*?\)),? coordinator", log)
    med["settings"] = m.group(1) if m else "(start-up line not found)"
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
m1, p1, m2, p2, m2h, m2n = (r for _, r in runs)
fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
losses = lambda xs: "[" + ", ".join(fmt(x, 6) for x in xs) + "]"

print(f"\nparallel_bench {started}; commit {commit}; CPU {cpu},"
      f" {cores} cores; load average (1/5/15 min) before {load_before}, after {load_after}")
print(f"model={model} global_batch={gbs} block={block} steps={steps} (medians of steps {warmup + 1}..{steps}) "
      f"dtype={dtype} data={dataset}")
# Equal work first: each peer run against the meshtrain runs of its degree, step by step.
worst, bad = 0.0, []
for peer_name, p, ours in (("world 1", p1, (("1 device", m1),)),
                           ("world 2", p2, (("1x2 devices", m2), ("2 hosts x 1", m2h), ("1x2 no reshard", m2n)))):
    for name, m in ours:
        if m is None:
            continue
        if len(m["losses"]) != len(p["losses"]) or any(x is None for x in m["losses"]):
            bad.append(f"meshtrain {name} logged losses {m['losses']}, the peer's {peer_name} {len(p['losses'])}")
            continue
        rel = max(abs(a - b) / abs(a) for a, b in zip(m["losses"], p["losses"]))
        worst = max(worst, rel)
        if rel > loss_rtol:
            bad.append(f"meshtrain {name} {losses(m['losses'])}\n  pytorch {peer_name}  {losses(p['losses'])}\n"
                       f"  relative difference up to {rel:.2e}")
if bad:
    print("\n".join(["parallel_bench: the two sides did not do the same work (losses beyond LOSS_RTOL="
                     f"{loss_rtol:.0e}); no ratios:"] + bad), file=sys.stderr)
    sys.exit(1)
if m1:
    print(f"equal work: both sides start from the same initial weights and train on the same global batches with the "
          f"same AdamW, schedule and clipping; every peer run's {steps} losses match meshtrain's of its degree within "
          f"{worst:.1e} relative (LOSS_RTOL {loss_rtol:.0e})")
env = lambda p: ", ".join(f"{k}={v}" for k, v in p["settings"].items() if v is not None)
print(f"settings: meshtrain 1 device {m1['settings'] if m1 else '-'}, 2 devices {m2['settings'] if m2 else '-'}, "
      f"its own allocator (runtime/block_cache_allocator.hpp)\n"
      f"          pytorch world 1 {env(p1)}; world 2 {env(p2)}")

w = 42
print(f"{'run':<{w}}{'tokens/s':>10}{'step s':>9}{'compute s':>11}{'comm s':>9}{'data s':>9}{'last loss':>11}")
for name, r in runs:
    if r is None:
        print(f"{name:<{w}}{'(not run)':>10}")
        continue
    print(f"{name:<{w}}{fmt(r['tokens_per_s'], 1):>10}{fmt(r['step_time_s']):>9}{fmt(r['compute_s']):>11}"
          f"{fmt(r['comm_s']):>9}{fmt(r['data_wait_s'], 4):>9}{fmt(r['losses'][-1], 4):>11}")
if m1:
    ratio = lambda a, b: f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if a and b else "-"
    print(f"\nmeshtrain / pytorch (tokens/s): 1 device {ratio(m1, p1)}, 2 devices {ratio(m2, p2)} "
          f"(2 hosts x 1: {ratio(m2h, p2)}, no reshard: {ratio(m2n, p2)})")
    print(f"2 devices / 1 device (tokens/s): meshtrain {ratio(m2, m1)} (2 hosts x 1: {ratio(m2h, m1)}, "
          f"no reshard: {ratio(m2n, m1)}), pytorch {ratio(p2, p1)}")
d = max(abs(a - b) for a, b in zip(p1["losses"], p2["losses"]))
print(f"peer world 1 vs world 2: losses max |diff| {d:.2e}")
if d > 1e-3:
    sys.exit("parallel_bench: the peer's losses differ between world 1 and world 2")
PY
