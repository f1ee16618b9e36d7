#!/usr/bin/env bash
# The cost of structured outputs in `serve`: decode speed of answers held to a JSON schema
# (`response_format`) against free answers, same server, same prompts, alternated, on Gemma 3 270M
# (the demo pack), greedy and sampled. The schema asks for one long string, so both answers run
# to the same token budget. Also prints what the first constrained request costs (it builds the
# grammar engine over the vocabulary, once per server).
# usage: scripts/bench-structured.sh [ROUNDS] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
threads="${2:-2}"
# shellcheck source=scripts/serve-demo.sh
. scripts/serve-demo.sh
serve_demo server -t "$threads" --parallel 1
addr=$(demo_addr server)
python3 - "$addr" "$rounds" <<'PY'
import statistics, sys, time

sys.path.insert(0, "scripts")
from serve_client import complete  # noqa: E402

addr, rounds = sys.argv[1], int(sys.argv[2])
N = 128
schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}},
          "required": ["story"], "additionalProperties": False}


def run(prompt, constrained, sampled, seed):
    body = {"prompt": prompt, "max_tokens": N}
    body.update({"temperature": 0.8, "seed": seed} if sampled else {"temperature": 0})
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    r = complete(addr, body, stream=True)
    tokens = r["usage"]["completion_tokens"]
    assert tokens == N, f"{tokens} tokens, not {N}"
    return r["decode"]


prompts = ["Once upon a time, in a small village by the sea,",
           "The history of the printing press begins",
           "Here is a short story about a robot who learns to paint:"]
t0 = time.perf_counter()
run(prompts[0], True, False, 0)  # builds the grammar engine once
t1 = time.perf_counter()
run(prompts[0], True, False, 0)
t2 = time.perf_counter()
print(f"first constrained request {t1 - t0:.2f} s (builds the grammar engine), the same again "
      f"{t2 - t1:.2f} s")
for sampled in (False, True):
    free, held = [], []
    for r in range(rounds):
        p = prompts[r % len(prompts)]
        order = (False, True) if r % 2 == 0 else (True, False)
        for constrained in order:
            tps = run(p, constrained, sampled, r)
            (held if constrained else free).append(tps)
    f, h = statistics.median(free), statistics.median(held)
    print(f"{'sampled (T=0.8)' if sampled else 'greedy'}: decode {f:.1f} tok/s free, {h:.1f} tok/s "
          f"held to the schema ({100 * (h / f - 1):+.1f}%) "
          f"(free {min(free):.1f}-{max(free):.1f}, held {min(held):.1f}-{max(held):.1f})")
PY
