#!/usr/bin/env bash
# Quality of Gemma 3 270M packs against independent references, one row per pack:
#   perplexity at context 512 on the fixed essay (llama.cpp's chunking), and teacher-forced top-1
#   agreement over the essay's first 511 positions with tests/support/gemma3_ref.py (numpy f64 on
#   the GGUF's exact weights), as a reader of the whole distribution sees it and as greedy decoding
#   does (`eval --argmax-only`: ranked by the pack's scan head when it has one). Ids:
#   tests/support/spm_ref.py, first 512 with the first replaced by BOS (llama.cpp perplexity's
#   first chunk).
# usage: scripts/quality-gemma.sh PACK_REPO_DIR...   (folders written by `onebit-pipe convert`)
# The reference argmax is computed once and cached in ~/.cache/onebit-models.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ONEBIT_BIN:-target/release/onebit-pipe}
gguf=$(scripts/fetch-gemma.sh)
essay="${ONEBIT_ESSAY:-../shared/eval/english-essay.txt}"
cache="$HOME/.cache/onebit-models"
ids="$cache/essay-chunk0-ids.json"
ref="$cache/essay-chunk0-ref.json"
if [ ! -f "$ids" ]; then
  python3 tests/support/spm_ref.py "$gguf" "$essay" |
    python3 -c "import json,sys; print(json.dumps([2] + json.load(sys.stdin)[1:512]))" > "$ids.tmp"
  mv "$ids.tmp" "$ids"
fi
if [ ! -f "$ref" ]; then
  python3 tests/support/gemma3_ref.py "$gguf" "$(cat "$ids")" > "$ref.tmp"
  mv "$ref.tmp" "$ref"
fi
for repo in "$@"; do
  args=(--path "$repo" --reference "$gguf")
  ppl=$("$bin" -q eval "${args[@]}" --file "$essay" --ctx 512 -t 2)
  top=$("$bin" -q eval "${args[@]}" --ids "$(cat "$ids")" -t 2)
  greedy=$("$bin" -q eval "${args[@]}" --ids "$(cat "$ids")" -t 2 --argmax-only)
  python3 - "$repo" "$ppl" "$top" "$greedy" "$ref" <<'PY'
import json, sys
repo, ppl, top, greedy = sys.argv[1], *(json.loads(a) for a in sys.argv[2:5])
b = json.load(open(sys.argv[5]))["argmax"][:511]
agree = lambda r: sum(x == y for x, y in zip(r["argmax"][:511], b))
print(f"{repo}: perplexity {ppl['perplexity']:.3f} over {ppl['scored']} tokens, top-1 agreement "
      f"{agree(top)}/511 = {100 * agree(top) / 511:.1f} % (greedy reader: {100 * agree(greedy) / 511:.1f} %)")
PY
done
