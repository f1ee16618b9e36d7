#!/usr/bin/env python3
"""Import, cached re-import and a catalog query against the local store and against a shared
store on S3-compatible object storage (s3s-fs on 127.0.0.1), side by side, runs alternating.

    scripts/bench-objstore.py [--bin target/release/onebit-pipe] [--runs 5]

Uses the Gemma 3 270M mirror scripts/demo.sh converts (~/.cache/onebit-models/mirror) and the
GGUF scripts/fetch-gemma.sh assembles; s3s-fs from `cargo install s3s-fs --version 0.14.1
--features binary --locked`. Prints one table (median, min-max seconds of the whole process)."""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = "FastFlowLM/Gemma3-270M-NPU2"
QUERY = "SELECT pack, count(*) AS tensors, sum(count) AS n, max(absmax) AS absmax FROM tensor_stats GROUP BY pack"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/onebit-pipe")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mirror", default=os.path.expanduser("~/.cache/onebit-models/mirror"))
    a = ap.parse_args()
    gguf = subprocess.run(["scripts/fetch-gemma.sh"], capture_output=True, text=True, check=True).stdout.strip()
    s3s = shutil.which("s3s-fs") or os.path.expanduser("~/.cargo/bin/s3s-fs")
    work = tempfile.mkdtemp(prefix="bench-objstore-")
    data = os.path.join(work, "s3")
    os.makedirs(os.path.join(data, "bench"))
    port = free_port()
    server = subprocess.Popen(
        [s3s, "--host", "127.0.0.1", "--port", str(port), "--access-key", "AK", "--secret-key", "SK-bench", data],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="AK", AWS_SECRET_ACCESS_KEY="SK-bench",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_REGION="us-east-1")
    env.pop("ONEBIT_STORE", None)
    run_args = ["run", "--repo", REPO, "--endpoint", a.mirror, "--reference", gguf, "--quiet"]

    def timed(home, store, args):
        cmd = [a.bin, "--home", home] + (["--store", store] if store else []) + args
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
        return dt

    rows = {}
    # First imports (one each: a second would be cached).
    local_home = os.path.join(work, "local")
    shared_home = os.path.join(work, "shared-a")
    store = "s3://bench/team"
    rows["first import"] = ([timed(local_home, None, run_args)], [timed(shared_home, store, run_args)])
    # A second machine: an empty cache importing what the shared store has.
    fetch = [timed(os.path.join(work, f"shared-b{i}"), store, run_args) for i in range(a.runs)]
    rows["import on an empty cache (shared: fetched)"] = (None, fetch)
    cached_l, cached_s, query_l, query_s, query_c = [], [], [], [], []
    for i in range(a.runs):
        cached_l.append(timed(local_home, None, run_args))
        cached_s.append(timed(shared_home, store, run_args))
        query_l.append(timed(local_home, None, ["sql", QUERY]))
        query_s.append(timed(shared_home, store, ["sql", QUERY]))
        query_c.append(timed(os.path.join(work, f"shared-c{i}"), store, ["sql", QUERY]))
    rows["cached re-import"] = (cached_l, cached_s)
    rows["sql (tensor_stats by pack)"] = (query_l, query_s)
    rows["sql from an empty cache"] = (None, query_c)
    server.terminate()
    server.wait()

    def fmt(xs):
        if not xs:
            return "-"
        if len(xs) == 1:
            return f"{xs[0]:.3f}"
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"

    print(f"# {REPO}, {a.bin}, s3s-fs 0.14.1 on 127.0.0.1, {a.runs} alternating runs; seconds, median (min-max)")
    print("| | local store | shared store (s3://) | shared / local |")
    print("|---|---|---|---|")
    for name, (l, s) in rows.items():
        ratio = f"{statistics.median(s) / statistics.median(l):.1f}x" if l and s else "-"
        print(f"| {name} | {fmt(l)} | {fmt(s)} | {ratio} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
