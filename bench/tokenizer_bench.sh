#!/usr/bin/env bash
# tokenizer_bench.sh — meshtrain's tokenizer against gpt-tokenizer on Node.js, same text (Moby-Dick from the
# assets, repeated), same encoding, in one run; prints both lines and the ratios. Fails if the tokens differ.
#
#   bench/tokenizer_bench.sh [BUILD_DIR] [ENCODING] [REPEAT]     defaults: build cl100k_base 4
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
encoding=${2:-cl100k_base}
repeat=${3:-4}
assets=${MESHTRAIN_ASSETS_DIR:-$root/assets}

text=$(mktemp --suffix=.txt)
trap 'rm -f "$text"' EXIT
python3 - "$assets/corpus/moby-dick.jsonl" "$text" "$repeat" <<'PY'
import json, sys
docs = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    f.write("\n".join(docs * int(sys.argv[3])))
PY

ours=$("$build/bench/tokenizer_bench" --tokenizer "$encoding" --text "$text" --runs 5)
peer=$(node "$root/bench/tokenizer_peer.mjs" "$assets" "$encoding" "$text" 5)
echo "$ours"
echo "$peer"
python3 - "$ours" "$peer" <<'PY'
import re, sys
ours, peer = sys.argv[1], sys.argv[2]
field = lambda line, key: re.search(key + r"=(\S+)", line).group(1)
if (field(ours, "tokens"), field(ours, "hash")) != (field(peer, "tokens"), field(peer, "hash")):
    sys.exit("tokens differ between meshtrain and gpt-tokenizer")
one = float(field(ours, "1-thread")); many = re.search(r"(\d+)-thread=(\S+) tokens/s$", ours)
peer_rate = float(field(peer, "1-thread"))
print(f"ratio 1 thread: {one / peer_rate:.2f}x gpt-tokenizer; {many.group(1)} threads: {float(many.group(2)) / peer_rate:.2f}x")
PY
