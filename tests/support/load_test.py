"""A load test of `onebit-pipe serve` from a separate process: CLIENTS concurrent streaming
clients (the official `openai` async client) send chat requests back to back for SECONDS, then
finish what is in flight. Reports requests/s, time to first token (p50/p99), tokens/s per stream
and in total, and the server's resident memory sampled each second. Fails if any request failed
or did not finish, or if memory grew over the second half of the run (a leak grows with
requests served; the allocator's warm-up levels off).

usage: load_test.py BASE_URL MODEL API_KEY SERVER_PID [CLIENTS] [SECONDS] [MAX_TOKENS]
"""
import asyncio
import json
import statistics
import sys
import time

import openai

base, model, key, pid = sys.argv[1:5]
clients = int(sys.argv[5]) if len(sys.argv) > 5 else 16
seconds = float(sys.argv[6]) if len(sys.argv) > 6 else 60.0
max_tokens = int(sys.argv[7]) if len(sys.argv) > 7 else 48

TOPICS = ["the sea", "a mountain", "bread", "trains", "winter", "a library", "rivers", "music",
          "bees", "the moon", "glass", "maps", "tea", "bridges", "snow", "clocks"]


def rss_mib():
    """(anonymous, file-backed) resident MiB. The file-backed part is the memory-mapped pack,
    paged in as new token ids reach the embedding: bounded by the pack's size and reclaimable.
    The anonymous part (heap, KV caches) is what a leak would grow."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                got[line.split(":")[0]] = int(line.split()[1]) / 1024.0
    return got.get("RssAnon", float("nan")), got.get("RssFile", float("nan"))


async def one(client, i, n, out):
    t0 = time.perf_counter()
    first, pieces, finish, usage = None, 0, None, None
    stream = await client.chat.completions.create(
        model=model, max_tokens=max_tokens, temperature=0.8, seed=i * 1000 + n, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"Write about {TOPICS[(i + n) % len(TOPICS)]}."}])
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                pieces += 1
                if first is None:
                    first = time.perf_counter() - t0
            if ch.finish_reason:
                finish = ch.finish_reason
    total = time.perf_counter() - t0
    out.append({"ttft": first if first is not None else total, "total": total,
                "tokens": usage.completion_tokens if usage else 0, "finish": finish})


async def client_loop(i, deadline, out, errors):
    client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)
    n = 0
    while time.perf_counter() < deadline:
        try:
            await one(client, i, n, out)
        except Exception as e:  # every failure is reported, none is retried
            errors.append(f"client {i}: {type(e).__name__}: {e}")
        n += 1
    await client.close()


async def sample_rss(stop, samples):
    while not stop.is_set():
        samples.append((time.perf_counter(), rss_mib()))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def main():
    out, errors, samples = [], [], []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(stop, samples))
    t0 = time.perf_counter()
    await asyncio.gather(*(client_loop(i, t0 + seconds, out, errors) for i in range(clients)))
    wall = time.perf_counter() - t0
    stop.set()
    await sampler
    done = [r for r in out if r["finish"] in ("stop", "length")]
    ttft = sorted(r["ttft"] for r in out)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
    per_stream = [r["tokens"] / max(r["total"] - r["ttft"], 1e-9) for r in out if r["tokens"] > 1]
    # Memory: a leak grows with requests served; allocator warm-up levels off. Compare the
    # second half of the run with its start, on anonymous memory.
    warm = [m[0] for t, m in samples if t - t0 >= 0.5 * seconds]
    report = {
        "clients": clients, "seconds": round(wall, 1), "requests": len(out), "errors": len(errors),
        "completed": len(done), "requests_per_s": round(len(out) / wall, 3),
        "ttft_p50_s": round(q(ttft, 0.50), 3), "ttft_p99_s": round(q(ttft, 0.99), 3),
        "stream_tokens_per_s_p50": round(statistics.median(per_stream), 2) if per_stream else 0,
        "total_tokens_per_s": round(sum(r["tokens"] for r in out) / wall, 2),
        "anon_mib_start": round(samples[0][1][0], 1),
        "anon_mib_half": round(warm[0], 1) if warm else None,
        "anon_mib_max": round(max(m[0] for _, m in samples), 1),
        "anon_mib_end": round(samples[-1][1][0], 1),
        "file_mib_start": round(samples[0][1][1], 1),
        "file_mib_end": round(samples[-1][1][1], 1),
    }
    print(json.dumps(report))
    assert not errors, errors[:5]
    assert len(done) == len(out) and out, f"{len(out) - len(done)} responses did not finish"
    assert warm and max(warm) - warm[0] < 32, f"anonymous memory grew in the second half: {report}"


asyncio.run(main())
