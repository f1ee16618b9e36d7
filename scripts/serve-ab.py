"""A/B of two running `onebit-pipe serve` builds on plain requests: streamed completions without
tools or response_format, a different 200-word prompt each round (so no prefix is shared),
alternated between the servers; prints each side's time to first token and decode speed.

usage: scripts/serve-ab.py HOST:PORT_A HOST:PORT_B ROUNDS   (A is reported as "old", B as "new")
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import complete  # noqa: E402

a, b, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
here = os.path.dirname(os.path.abspath(__file__))
words = open(os.path.join(here, "..", "tests/fixtures/text/calibration.txt")).read().split()


def run(addr, prompt):
    r = complete(addr, {"prompt": prompt, "max_tokens": 128, "temperature": 0}, stream=True)
    return r["ttft"], r["decode"], r["usage"]["completion_tokens"]


res = {a: [], b: []}
for r in range(rounds):
    start = 37 * r
    prompt = " ".join(words[start:start + 200])
    for addr in ((a, b) if r % 2 == 0 else (b, a)):
        res[addr].append(run(addr, prompt))
for name, addr in (("old", a), ("new", b)):
    t = [x[0] for x in res[addr]]; d = [x[1] for x in res[addr]]
    print(f"{name}: ttft median {statistics.median(t)*1000:.1f} ms ({min(t)*1000:.1f}-{max(t)*1000:.1f}), decode median {statistics.median(d):.1f} tok/s ({min(d):.1f}-{max(d):.1f}), tokens {[x[2] for x in res[addr]]}")
