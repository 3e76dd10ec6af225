#!/usr/bin/env bash
# moe_bench.sh — a small Mixtral's training throughput on 1 device and on 2 devices with expert=2, the exposed
# all-to-all time, and the dense Llama with the same active parameters per token, in one run.
#
#   bench/moe_bench.sh [BUILD_DIR]          default BUILD_DIR: build
#
# The MoE model is mixtral-tiny widened to D=256, 4 layers, 8 / 4 heads, E=8 experts of F=512, top-2 (byte
# vocabulary); the dense peer is the same Llama with intermediate_size = k x F = 1024, so a token passes through the
# same matmul parameters (the Mixtral adds its router, 8 x 256 per layer). Four runs per round, alternated so the
# pairs compared share the machine's state:
#   dense 1 device | moe 1 device | moe 2 devices expert=2 | dense 2 devices data=2     (1 host, 2 devices: 1 thread each)
# ROUNDS rounds; each run's figure is the median over its steps after the warm-up; the table prints the median over
# rounds and the spread (min..max), with the ratios moe/dense at each degree and the all-to-all share of a step.
#
# Environment (defaults): ROUNDS=3 STEPS=12 WARMUP=3 GBS=8 BLOCK=256 CORES=$(nproc) KEEP_DIR=path (keep the runs)
# QUICK=1: ROUNDS=1 STEPS=6 WARMUP=2 BLOCK=128 (27 s on 2 cores at 0a461d9), the same table; its short rows
# make the exchange a larger share of the step than at the defaults.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/bench_common.sh
source "$root/bench/bench_common.sh"
build=${1:-$root/build}
[[ -d $build ]] && build=$(cd "$build" && pwd)
rounds=${ROUNDS:-$(q 1 3)}
steps=${STEPS:-$(q 6 12)}
warmup=${WARMUP:-$(q 2 3)}
gbs=${GBS:-8}
block=${BLOCK:-$(q 128 256)}
cores=${CORES:-$(nproc)}
work=${KEEP_DIR:-$(mktemp -d)}
mkdir -p "$work"

shape=(model.hidden_size=256 model.num_hidden_layers=4 model.num_attention_heads=8 model.num_key_value_heads=4)
moe=(model=mixtral-tiny "${shape[@]}" model.intermediate_size=512 model.num_local_experts=8 model.num_experts_per_tok=2)
dense=(model=llama-tiny "${shape[@]}" model.intermediate_size=1024)
common=(dataset=moby-dick-byte "global_batch_size=$gbs" "block_size=$block" "max_steps=$steps" logging_steps=1
        checkpoint.resume=false metrics.tensorboard=false lr_scheduler.warmup_steps=2)

run() {  # NAME DEVICES overrides...
  local name=$1 devices=$2; shift 2
  local out="$work/$name"
  rm -rf "$out"
  "$build/meshtrain" run --hosts 1 --devices-per-host "$devices" -- train "${common[@]}" "output_dir=$out" \
    "runtime.threads_per_device=$((cores / devices))" "$@" > "$out.log" 2>&1 ||
    { tail -20 "$out.log" >&2; echo "moe_bench: $name failed" >&2; exit 1; }
  cp "$out/metrics.jsonl" "$work/$name.$round.jsonl"
}

echo "moe_bench $(date -u '+%Y-%m-%d %H:%M UTC'): global batch $gbs x $block, $steps steps (medians after $warmup)," \
  "$rounds round(s); commit $(source_commit "$root"); $(cpu_description); $cores cores"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  run dense1 1 "${dense[@]}" ici_mesh.fsdp=1
  run moe1 1 "${moe[@]}" ici_mesh.fsdp=1
  run moe2 2 "${moe[@]}" ici_mesh.fsdp=1 ici_mesh.expert=2
  run dense2 2 "${dense[@]}" ici_mesh.fsdp=1 ici_mesh.data=2
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$work" "$rounds" "$warmup" <<'EOF'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def per_round(name, key):
    values = []
    for r in range(1, rounds + 1):
        lines = [json.loads(l) for l in open(f"{work}/{name}.{r}.jsonl")]
        steps = [l for l in lines if "loss" in l and l["step"] > warmup]
        values.append(statistics.median(l[key] for l in steps))
    return values

def show(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"

tps = {n: per_round(n, "tokens_per_s") for n in ("dense1", "moe1", "moe2", "dense2")}
step = {n: per_round(n, "step_time_s") for n in ("moe1", "moe2")}
a2a = per_round("moe2", "alltoall_s")
comm = per_round("moe2", "comm_s")
print(f"{'run':<28} {'tokens/s: median (min..max)':>32}")
for name, label in (("dense1", "dense Llama, 1 device"), ("moe1", "Mixtral, 1 device"),
                    ("moe2", "Mixtral, 2 devices expert=2"), ("dense2", "dense Llama, 2 devices data=2")):
    print(f"{label:<28} {show(tps[name], '{:.0f}'):>32}")
ratio = lambda a, b: [x / y for x, y in zip(a, b)]
print(f"Mixtral / dense, 1 device:              {show(ratio(tps['moe1'], tps['dense1']), '{:.2f}')}")
print(f"Mixtral / dense, 2 devices:             {show(ratio(tps['moe2'], tps['dense2']), '{:.2f}')}")
print(f"Mixtral 2 devices / 1 device:           {show(ratio(tps['moe2'], tps['moe1']), '{:.2f}')}")
print(f"expert=2 step time, ms:                 {show([1e3 * s for s in step['moe2']], '{:.1f}')}")
print(f"  of which all-to-all (exposed), ms:    {show([1e3 * s for s in a2a], '{:.1f}')}")
print(f"  of which all collectives, ms:         {show([1e3 * s for s in comm], '{:.1f}')}")
print(f"  all-to-all share of the step:         {show(ratio(a2a, step['moe2']), '{:.1%}')}")
EOF
