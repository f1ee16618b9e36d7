#!/usr/bin/env bash
# Prompt-prefix reuse in `serve`: time to first token of a conversation's second turn whose
# prompt starts with a 1,000-token system text, on a server with the prefix cache against one
# started with --no-prefix-cache, side by side on Gemma 3 270M (the demo pack; it is a base model
# without a chat template, so the turns are plain completions: turn 2's prompt is turn 1's prompt,
# its answer and a new question). Rounds alternate between the two servers, each with a new first
# question, and every answer is compared between them.
# usage: scripts/bench-prefix.sh [ROUNDS] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
threads="${2:-2}"
# shellcheck source=scripts/serve-demo.sh
. scripts/serve-demo.sh
serve_demo warm -t "$threads" --parallel 1 --ctx-size 2048
serve_demo cold -t "$threads" --parallel 1 --ctx-size 2048 --no-prefix-cache
warm=$(demo_addr warm)
cold=$(demo_addr cold)
python3 - "$warm" "$cold" "$rounds" <<'EOF'
import statistics, sys

sys.path.insert(0, "scripts")
from serve_client import complete  # noqa: E402

warm, cold, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = open("tests/fixtures/text/calibration.txt").read().split()


# A system text of at least 1,000 tokens, as the server counts them.
k = 500
while True:
    system = " ".join(words[:k])
    probe = complete(cold, {"prompt": system, "max_tokens": 1})
    n = probe["usage"]["prompt_tokens"]
    if n >= 1000:
        break
    k += max(5, (1000 - n) // 2)
times = {"warm": [], "cold": []}
for r in range(rounds):
    q1 = f"\n\nQuestion {r + 1}: what is the text above about, in {r + 3} words?\nAnswer:"
    turn1 = {"prompt": system + q1, "max_tokens": 24, "temperature": 0}
    seen = {}
    for name, addr in (("warm", warm), ("cold", cold)) if r % 2 == 0 else (("cold", cold), ("warm", warm)):
        a = complete(addr, turn1)
        turn2 = {
            "prompt": turn1["prompt"] + a["text"] + "\nQuestion: and who wrote it?\nAnswer:",
            "max_tokens": 8,
            "temperature": 0,
        }
        b = complete(addr, turn2, stream=True)
        ttft = b["ttft"]
        times[name].append(ttft)
        seen[name] = (a["text"], b["text"])
        u = b["usage"]
        print(
            f"round {r + 1} {name}: turn 2 of {u['prompt_tokens']} prompt tokens, "
            f"{u['prompt_tokens_details']['cached_tokens']} cached, first token after {ttft * 1000:.1f} ms"
        )
    assert seen["warm"] == seen["cold"], f"round {r + 1}: the answers differ: {seen}"
w, c = statistics.median(times["warm"]), statistics.median(times["cold"])
print(f"system text of {n} tokens; median time to first token of turn 2: "
      f"cold {c * 1000:.1f} ms, warm {w * 1000:.1f} ms, {c / w:.1f}x "
      f"(range {min(times['cold']) / max(times['warm']):.1f}-{max(times['cold']) / min(times['warm']):.1f}x)")
EOF
