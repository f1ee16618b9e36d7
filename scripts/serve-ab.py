"""A/B of two running `onebit-pipe serve` builds on plain requests: streamed completions without
tools or response_format, a different 200-word prompt each round (so no prefix is shared),
alternated between the servers; prints each side's time to first token and decode speed.

usage: scripts/serve-ab.py HOST:PORT_A HOST:PORT_B ROUNDS   (A is reported as "old", B as "new")
"""
import http.client, json, os, statistics, sys, time
a, b, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests/fixtures/text/calibration.txt")).read().split()
def run(addr, prompt):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    body = {"prompt": prompt, "max_tokens": 128, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); first = last = None; n = 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]": continue
        ch = json.loads(line[6:])
        if ch.get("choices") and ch["choices"][0].get("text"):
            now = time.perf_counter(); first = first or now; last = now
        if ch.get("usage"): n = ch["usage"]["completion_tokens"]
    return (first - t0), (n - 1) / (last - first), n
res = {a: [], b: []}
for r in range(rounds):
    start = 37 * r
    prompt = " ".join(words[start:start + 200])
    for addr in ((a, b) if r % 2 == 0 else (b, a)):
        res[addr].append(run(addr, prompt))
for name, addr in (("old", a), ("new", b)):
    t = [x[0] for x in res[addr]]; d = [x[1] for x in res[addr]]
    print(f"{name}: ttft median {statistics.median(t)*1000:.1f} ms ({min(t)*1000:.1f}-{max(t)*1000:.1f}), decode median {statistics.median(d):.1f} tok/s ({min(d):.1f}-{max(d):.1f}), tokens {[x[2] for x in res[addr]]}")
