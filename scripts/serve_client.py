"""A completion from `onebit-pipe serve` for the serve benchmarks (bench-prefix.sh,
bench-structured.sh, serve-ab.py), whole or streamed, with the stream's timings."""
import http.client
import json
import time


def complete(addr, body, stream=False):
    """POSTs `body` to /v1/completions at HOST:PORT `addr`. Returns a dict: `text`, `usage`,
    and when streamed `ttft` (seconds to the first text), `decode` (tokens/s after the first
    text: completion tokens − 1 over the time from the first text to the last)."""
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    body = dict(body, stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        v = json.loads(r.read())
        return {"text": v["choices"][0]["text"], "usage": v["usage"]}
    text, usage, first, last = "", None, None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
        if piece:
            last = time.perf_counter()
            first = first or last
            text += piece
        if chunk.get("usage"):
            usage = chunk["usage"]
    n = usage["completion_tokens"] if usage else 0
    return {
        "text": text,
        "usage": usage,
        "ttft": (first - t0) if first else None,
        "decode": (n - 1) / (last - first) if first and last > first else None,
    }
