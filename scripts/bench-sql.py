#!/usr/bin/env python3
"""Catalog query latency of two (or more) onebit-pipe binaries side by side, on the same store:
whole `onebit-pipe sql QUERY --format csv` processes, runs alternating, median (min-max) ms, and
a check that every binary printed the same bytes.

    scripts/bench-sql.py NAME=BINARY NAME=BINARY [--runs 15] [--pack NAME] [--tensor NAME]

The store is the binaries' default (ONEBIT_STORE or ~/.cache/onebit-pipe); run scripts/demo.sh
first so that it holds the Gemma pack. Used to weigh the release profile's opt-levels of the SQL
engine (docs/benchmarks.md, "Per-crate optimization levels")."""

import argparse
import statistics
import subprocess
import sys
import time


def queries(pack, tensor):
    return {
        "packs": "SELECT name, verdict FROM packs",
        "tensor_stats group": "SELECT pack, count(*) AS tensors, sum(count) AS n, max(absmax) AS absmax "
        "FROM tensor_stats GROUP BY pack",
        "verification join": "SELECT v.pack, v.tensor, v.verdict, round(v.corr, 3) AS c, t.kind, t.bytes "
        "FROM verification v JOIN tensors t ON t.pack = v.pack AND t.name = v.tensor ORDER BY v.corr LIMIT 5",
        "tensor_values agg": "SELECT count(*) AS n, avg(value) AS mean, min(value) AS lo, max(value) AS hi "
        f"FROM tensor_values('{pack}', '{tensor}')",
        "block_stats top": "SELECT pack, name, block, round(absmax, 4) AS absmax FROM block_stats "
        "ORDER BY absmax DESC, pack, name, block LIMIT 5",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bins", nargs="+", metavar="NAME=BINARY")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--pack", default="FastFlowLM/Gemma3-270M-NPU2")
    ap.add_argument("--tensor", default="model.layers.0.mlp.gate_proj.weight", help="for tensor_values")
    args = ap.parse_args()
    bins = dict(b.split("=", 1) for b in args.bins)
    names = list(bins)
    for qname, q in queries(args.pack, args.tensor).items():
        times = {n: [] for n in names}
        outputs = {}
        for _ in range(args.runs):
            for n in names:
                t0 = time.perf_counter()
                r = subprocess.run([bins[n], "sql", q, "--format", "csv"], capture_output=True, text=True)
                times[n].append(time.perf_counter() - t0)
                if r.returncode != 0:
                    sys.exit(f"{n}: {qname}: {r.stderr.strip()}")
                outputs[n] = r.stdout
        line = f"{qname:<20}"
        for n in names:
            v = times[n]
            line += f" | {n} {statistics.median(v) * 1e3:7.1f} ms ({min(v) * 1e3:.1f}-{max(v) * 1e3:.1f})"
        if len(names) >= 2:
            ratio = statistics.median(times[names[1]]) / statistics.median(times[names[0]])
            line += f" | {names[1]}/{names[0]} {ratio:.2f}"
        if len(set(outputs.values())) > 1:
            line += " | OUTPUTS DIFFER"
        print(line, flush=True)


if __name__ == "__main__":
    main()
