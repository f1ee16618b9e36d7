#!/usr/bin/env python3
"""Two builds (or two settings of one build) of `onebit-pipe generate` side by side on the same
pack and prompt, the rounds alternated (A, B, A, B, ...), so that a drift of the machine touches
both sides alike. Prints each round's prefill and decode tokens/s and the medians, as markdown.

Each side imports the pack into a store of its own (`ONEBIT_HOME`), since two versions of the
stages key their entries differently.

Usage:

    python3 scripts/generate-ab.py --a OLD_BIN --b target/release/onebit-pipe \\
        --path REPO --reference GGUF --tokens 128 --rounds 5 --threads 2
    # one build, two cache types, at depth 4,000:
    python3 scripts/generate-ab.py --a target/release/onebit-pipe --a-args "--cache-type f32" \\
        --b target/release/onebit-pipe --b-args "--cache-type f16" --path REPO --reference GGUF \\
        --tokens 4000 --ctx-size 4200

The prompt is `--tokens` ids (`2`, then a fixed spread of ids below 21,000), fed with `--ids` so
both sides get exactly that many tokens; greedy decoding of `--max-tokens` tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path


def side(binary: str, extra: str, home: Path, src: list[str], a: argparse.Namespace, ids: str) -> dict:
    """One `generate` run: its JSON statistics line."""
    env = dict(os.environ, ONEBIT_HOME=str(home))
    cmd = [binary, "-q", "--json", "generate", *src, "--ids", ids, "--max-tokens", str(a.max_tokens),
           "--temperature", "0", "--ctx-size", str(a.ctx_size), "-t", str(a.threads), *shlex.split(extra)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def decoded(j: dict) -> int:
    """Tokens decoded: `tokens` is their list (or count)."""
    t = j.get("tokens", 0)
    return len(t) if isinstance(t, list) else int(t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="side A's binary")
    p.add_argument("--b", required=True, help="side B's binary")
    p.add_argument("--a-args", default="", help="extra `generate` arguments for side A")
    p.add_argument("--b-args", default="", help="extra `generate` arguments for side B")
    p.add_argument("--path", required=True, help="the repository folder (model.q4nx, config.json, ...)")
    p.add_argument("--reference", required=True, help="the GGUF the import verifies against")
    p.add_argument("--tokens", type=int, default=128, help="prompt tokens")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--ctx-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "onebit-models" / "ab")
    a = p.parse_args()
    if a.tokens + a.max_tokens > a.ctx_size:
        a.ctx_size = a.tokens + a.max_tokens
    ids = json.dumps([2] + [1000 + (i * 7919) % 20000 for i in range(a.tokens - 1)])
    src = ["--path", a.path, "--reference", a.reference]
    sides = [("A", a.a, a.a_args, a.work / "home-a"), ("B", a.b, a.b_args, a.work / "home-b")]
    for _, binary, _, home in sides:
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run([binary, "-q", "run", *src], env=dict(os.environ, ONEBIT_HOME=str(home)), check=True,
                       stdout=subprocess.DEVNULL)
    print(f"A: {a.a} {a.a_args}".rstrip())
    print(f"B: {a.b} {a.b_args}".rstrip())
    print(f"{a.tokens}-token prompt, {a.max_tokens} tokens decoded, {a.threads} threads, {a.rounds} rounds alternated")
    print()
    print("| round | side | prefill tok/s | decode tok/s | decoded | kernel |")
    print("|---|---|---|---|---|---|")
    got: dict[str, list[dict]] = {"A": [], "B": []}
    for r in range(1, a.rounds + 1):
        for name, binary, extra, home in sides:
            j = side(binary, extra, home, src, a, ids)
            got[name].append(j)
            print(f"| {r} | {name} | {j['prefill_tokens_per_s']:.1f} | {j['decode_tokens_per_s']:.1f} "
                  f"| {decoded(j)} | {j.get('kernel', '?')} |", flush=True)
    print()
    print("| side | prefill tok/s median (range) | decode tok/s median (range) |")
    print("|---|---|---|")
    for name in ("A", "B"):
        pf = [j["prefill_tokens_per_s"] for j in got[name]]
        dc = [j["decode_tokens_per_s"] for j in got[name]]
        print(f"| {name} | {statistics.median(pf):.1f} ({min(pf):.1f}–{max(pf):.1f}) "
              f"| {statistics.median(dc):.1f} ({min(dc):.1f}–{max(dc):.1f}) |")
    ma = statistics.median(j["decode_tokens_per_s"] for j in got["A"])
    mb = statistics.median(j["decode_tokens_per_s"] for j in got["B"])
    pa = statistics.median(j["prefill_tokens_per_s"] for j in got["A"])
    pb = statistics.median(j["prefill_tokens_per_s"] for j in got["B"])
    print(f"\nB / A: prefill {pb / pa:.3f}×, decode {mb / ma:.3f}×")


if __name__ == "__main__":
    main()
