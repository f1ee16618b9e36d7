#!/usr/bin/env bash
# What llama.cpp's own requantization of the same GGUF gives, for comparison with our packs:
# `llama-quantize --allow-requantize --pure` to Q4_0, Q4_1, Q5_1 and Q8_0 (every tensor, no
# importance matrix), then `llama-perplexity --kl-divergence` at context 512 on the essay against
# the GGUF's own logits: perplexity and "same top" (how often the argmax is the GGUF's).
# Needs llama.cpp built by scripts/bench-gemma.sh.
# usage: scripts/quality-llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=$(scripts/fetch-gemma.sh)
essay="${ONEBIT_ESSAY:-../shared/eval/english-essay.txt}"
ll="$HOME/.cache/onebit-models/llama.cpp/build/bin"
[ -x "$ll/llama-quantize" ] ||
  cmake --build "$HOME/.cache/onebit-models/llama.cpp/build" --target llama-quantize >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ll/llama-perplexity" -m "$gguf" -f "$essay" -c 512 -t 2 --kl-divergence-base "$tmp/base.kld" \
  2>&1 | grep -E "Final estimate" | sed 's/^/GGUF: /'
for q in Q4_0 Q4_1 Q5_1 Q8_0; do
  "$ll/llama-quantize" --allow-requantize --pure "$gguf" "$tmp/$q.gguf" "$q" > /dev/null 2>&1
  "$ll/llama-perplexity" -m "$tmp/$q.gguf" -f "$essay" -c 512 -t 2 --kl-divergence-base \
    "$tmp/base.kld" --kl-divergence 2>&1 |
    grep -E "Mean PPL\(Q\) |Mean +KLD|Same top p" | tr -s ' ' | paste -sd ' ' | sed "s/^/$q: /"
  rm -f "$tmp/$q.gguf"
done
