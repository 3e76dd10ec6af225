#!/usr/bin/env bash
# prepare_default_shards.sh — prepares the default token shards from the embedded corpus with a built meshtrain:
# assets/shards/moby-dick-gpt2 (GPT-2 BPE, uint16) and assets/shards/moby-dick-byte (byte tokenizer). A directory
# that already has its index.json is kept (prepare renames a finished directory into place, so one with an index
# is complete). Needs scripts/fetch_assets.sh to have run.
#
#   scripts/prepare_default_shards.sh [MESHTRAIN_BINARY]        default: build/meshtrain
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
meshtrain=${1:-$root/build/meshtrain}
assets=${MESHTRAIN_ASSETS_DIR:-$root/assets}
corpus="$assets/corpus/moby-dick.jsonl"

if [[ ! -f "$corpus" ]]; then
  echo "prepare_default_shards: $corpus is missing; run scripts/fetch_assets.sh first" >&2
  exit 1
fi
for tokenizer in gpt2 byte; do
  out="$assets/shards/moby-dick-$tokenizer"
  [[ -f "$out/index.json" ]] && continue
  "$meshtrain" prepare --tokenizer "$tokenizer" --output "$out" --force "$corpus"
done
