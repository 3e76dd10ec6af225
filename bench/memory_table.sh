#!/usr/bin/env bash
# memory_table.sh — issue 12's memory protocol: peak resident memory of the largest host process for llama-100m
# (global batch 8 x 128, 2 steps and the final save) on 1 device, 1 host x 2 (fsdp=2), 1 host x 4 (fsdp=4) and
# 2 hosts x 4 (fsdp=8), without and with activation checkpointing. One line per run: the load average when it
# started, the peak RSS (`/usr/bin/time -f %M` around `meshtrain run`, which reports the largest waited-for child),
# host 0's block-cache figures (the trainer's `Memory used on host 0` line) and step 2's time from metrics.jsonl.
#
#   bench/memory_table.sh [MESHTRAIN_BINARY] [LABEL] [extra overrides...]   default binary: build/meshtrain
set -u
BIN=${1:-build/meshtrain}
LABEL=${2:-$(git rev-parse --short HEAD 2>/dev/null || echo meshtrain)}
shift $(( $# > 2 ? 2 : $# ))
for checkpointing in none full; do
  for layout in "1 1 ici_mesh.fsdp=1" "1 2 ici_mesh.fsdp=2" "1 4 ici_mesh.fsdp=4" "2 4 ici_mesh.fsdp=4 dcn_mesh.fsdp=2"; do
    read -r hosts devices mesh <<<"$layout"
    out=$(mktemp -d /tmp/memory_table.XXXXXX)
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086  # $mesh holds one or two overrides
    /usr/bin/time -f %M -o "$out/peak_kb" "$BIN" run --hosts "$hosts" --devices-per-host "$devices" -- train \
      model=llama-100m dataset=moby-dick-byte global_batch_size=8 block_size=128 max_steps=2 \
      output_dir="$out/run" checkpoint.resume=false activation_checkpointing="$checkpointing" $mesh "$@" \
      >"$out/log" 2>&1
    rc=$?
    cache=$(grep -o "peak live [0-9.]* GB, peak mapped [0-9.]* GB" "$out/log" | head -1)
    step=$(find "$out/run" -name metrics.jsonl -exec tail -1 {} \; | grep -o '"step_time_s":[0-9.]*' | cut -d: -f2)
    printf '%s  %-4s %d x %d  rc=%d  load %s  peak RSS %.2f GB  %s  step 2 %.2f s\n' "$LABEL" "$checkpointing" \
      "$hosts" "$devices" "$rc" "$load" "$(awk '{print $1 / 1e6}' "$out/peak_kb")" "$cache" "${step:-0}"
    rm -rf "$out"
  done
done
