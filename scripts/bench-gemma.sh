#!/usr/bin/env bash
# Host runtime vs llama.cpp on Gemma 3 270M, side by side, same machine, same thread counts:
# prefill and decode tokens/s at 1 and 2 threads, plus perplexity at context 512 on the fixed
# essay. llama.cpp is built once from the PyPI `llama-cpp-python` source package (its vendored
# llama.cpp, AVX2, no AMX) into ~/.cache/onebit-models/llama.cpp. Needs the demo pack
# (scripts/demo.sh) or builds it. Folders written by `onebit-pipe convert` given as arguments are
# measured in the same sitting after the demo pack (e.g. one with 8-bit v/up/down projections).
# usage: scripts/bench-gemma.sh [PACK_REPO_DIR...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
bin=target/release/onebit-pipe
gguf=$(scripts/fetch-gemma.sh)
cache="$HOME/.cache/onebit-models"
ll=$(scripts/llama-cpp.sh avx2)
mirror="${ONEBIT_DEMO_MIRROR:-$cache/mirror}"
repo=FastFlowLM/Gemma3-270M-NPU2
[ -f "$mirror/$repo/model.q4nx" ] || scripts/demo.sh >&2
src=(--repo "$repo" --endpoint "$mirror" --reference "$gguf")
"$bin" -q run "${src[@]}" >&2
prompt=$(head -c 1200 tests/fixtures/text/calibration.txt | tr '\n' ' ')
packs=("$@")
for t in 1 2; do
  "$ll/llama-bench" -m "$gguf" -t "$t" -p 64 -n 64 -r 3 -o md 2>/dev/null | grep -E "pp64|tg64" |
    sed "s/^/llama.cpp t=$t /"
  for pack in demo "${packs[@]}"; do
    if [ "$pack" = demo ]; then args=("${src[@]}"); else args=(--path "$pack" --reference "$gguf"); fi
    for r in 1 2 3; do
      "$bin" -q --json generate "${args[@]}" --prompt "$prompt" --max-tokens 64 --ctx-size 1024 -t "$t" |
        tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"onebit {sys.argv[1]} t=$t run $r: prefill {d['prefill_tokens_per_s']:.1f} tok/s ({d['prompt_tokens']} tokens), decode {d['decode_tokens_per_s']:.1f} tok/s\")" "$pack"
    done
  done
done
essay="${ONEBIT_ESSAY:-../shared/eval/english-essay.txt}"
if [ -f "$essay" ]; then
  "$ll/llama-perplexity" -m "$gguf" -f "$essay" -c 512 -t 2 2>&1 | grep -E "Final estimate" |
    sed 's/^/llama.cpp perplexity: /'
  "$bin" -q eval "${src[@]}" --file "$essay" --ctx 512 -t 2 |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"onebit perplexity: {d['perplexity']:.4f} over {d['scored']} tokens\")"
fi
