#!/usr/bin/env bash
# context_bench.sh — the seed's 8192-token rows (llama-tiny, global batch 8, fp32) on 2 hosts x 4 devices, with the
# rows whole on each device (fsdp=8) and split over context (dcn context=2 x ici fsdp=4; ici context=4 x dcn fsdp=2),
# layouts alternated ROUNDS times. Prints, per run: step time of steps 2..STEPS (ms), the time device 0 spent in the
# K/V exchange (kv_exchange_s, ms), its bytes per step, each host's peak resident memory, and the losses (which must
# be the same in every layout up to reduction order).
#
#   bench/context_bench.sh [BUILD_DIR]      default BUILD_DIR: build
# Environment: ROUNDS=2 STEPS=4 BLOCK=8192 KEEP_DIR= (keep the runs' output folders there)
# QUICK=1: ROUNDS=1 STEPS=3 BLOCK=2048 (19 s on 2 cores at 0a461d9), the same layouts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/bench_common.sh
source "$root/bench/bench_common.sh"
build=$(cd "${1:-$root/build}" && pwd)
rounds=${ROUNDS:-$(q 1 2)}
steps=${STEPS:-$(q 3 4)}
block=${BLOCK:-$(q 2048 8192)}
keep=${KEEP_DIR:-$(mktemp -d)}
mkdir -p "$keep"
cd "$root"

layouts=("fsdp=8|ici_mesh.fsdp=4 dcn_mesh.fsdp=2"
         "dcn context=2 x ici fsdp=4|ici_mesh.fsdp=4 dcn_mesh.context=2"
         "ici context=4 x dcn fsdp=2|ici_mesh.fsdp=1 ici_mesh.context=4 dcn_mesh.fsdp=2")
echo "context_bench: llama-tiny, global batch 8 x $block, fp32, 2 hosts x 4 devices, $steps steps, $rounds rounds"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'); commit $(source_commit "$root"); $(cpu_description); $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  for layout in "${layouts[@]}"; do
    name=${layout%%|*}
    read -r -a mesh <<<"${layout#*|}"
    out="$keep/r$round-${name// /_}"
    rm -rf "$out"
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$build/meshtrain" run --hosts 2 --devices-per-host 4 -- train "${mesh[@]}" global_batch_size=8 \
      block_size="$block" model.max_position_embeddings="$block" max_steps="$steps" logging_steps=1 \
      output_dir="$out" checkpoint.resume=false >"$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
    python3 - "$out" "$out.log" "$name" "$round" "$load" <<'EOF'
import json, re, sys
out, log, name, round_, load = sys.argv[1:]
records = [json.loads(line) for line in open(f"{out}/metrics.jsonl") if '"loss"' in line]
later = records[1:]
rss = re.findall(r"\[host (\d)\].*Memory used on host \d: peak resident ([0-9.]+) GB", open(log).read())
print(f"round {round_} | {name:28} | load {load} | step ms " +
      ", ".join(f"{1000 * r['step_time_s']:.0f}" for r in later) +
      " | kv_exchange ms " + ", ".join(f"{1000 * r.get('kv_exchange_s', 0):.0f}" for r in later) +
      f" | kv_exchange MB/step {later[-1]['comm_bytes'].get('kv_exchange', 0) / 1e6:.1f}" +
      " | peak GB " + " / ".join(g for _, g in sorted(rss)) +
      " | losses " + ", ".join(f"{r['loss']:.4f}" for r in records))
EOF
  done
done
