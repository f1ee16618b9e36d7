#!/usr/bin/env python3
"""Every seed model at its real size, end to end: a random-weight Q4_0 GGUF at the config's exact
dimensions (`scripts/random-gguf.py`), then `convert` → `run` (every stage, verified against the
same GGUF) → `run` again (cached) → `generate` 32 tokens → a 128-token prefill (`generate --ids`)
→ one `serve` request, and llama.cpp's `llama-bench` decode and 128-token prefill on the same GGUF
beside it. With llama.cpp given, the logits are compared too: `llama-perplexity
--kl-divergence-base` saves llama.cpp's next-token distributions over a fixed text
(`tests/fixtures/text/calibration.txt`, chunks of 128 tokens) and `eval --kl-divergence-base`
scores the pack on the same tokens: the mean and largest KL divergence per position and how often
the two agree on the most likely token.

For each step: wall seconds, and the peak of the process's anonymous memory and of its file pages
(polled from /proc every 20 ms: mapped inputs are file pages), apart and together. The server is
measured idle (4 s after its ready line) and with four full slots (four requests of
`--ctx-size` − 105 distinct prompt tokens and 100 generated ones, at once). One markdown row per
model on stdout (docs/benchmarks.md, "Every seed model at its real size"), a JSON line per model on
stderr, and each budget checked:
- import ≤ 10 s per GB of `model.q4nx` on 2 cores;
- anonymous memory of convert and of import ≤ 1 GB + the largest tensor;
- `serve --parallel 4 --ctx-size 4096` with four full slots, anonymous memory and file pages
  together ≤ 1.05 × (the streamed weights + the KV cache of four full slots) + 0.3 GB; on the
  Hunyuan-1.8B shape also idle ≤ 1.2 GB and full ≤ 2.4 GB. The streamed weights are what a token
  reads whole (every tensor but the embedding where the head is its own tiles, plus the scan
  head); the cache's size is the one the ready line states.

Usage:

    cargo build --release
    python3 scripts/bench-real-size.py [--llama-bench PATH] [--only NAME ...] [--smoke]

Every config of `tests/fixtures/configs` (a copy of the shared fixtures) of a family `convert`
accepts, up to 4 B parameters, is in the matrix (Qwen3.5 0.8B from its real config's text fields).
Qwen3.5 2B is not: no config of it is among the fixtures, and FastFlowLM's converter config `qwen3.5_2b.json` (FLM_Q4NX_Converter @ dd0993c) holds
only its tile settings and tensor-name map, not the model's dimensions.

The GGUFs and packs go to `~/.cache/onebit-models/real-size/` (never into the repository).
`--smoke` runs the smallest config of each family and skips llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
# Prompt tokens of the prefill column (both sides get exactly this many).
PREFILL_TOKENS = 128
# The logits comparison: llama.cpp's chunking of this text (BOS per chunk where the model adds one).
KLD_TEXT = ROOT / "tests" / "fixtures" / "text" / "calibration.txt"
KLD_CTX, KLD_CHUNKS = 128, 4

# (name, config folder under tests/fixtures/configs, smallest of its family)
MATRIX = [
    ("SmolLM2-135M", "smollm2/SmolLM2-135M-Instruct-partial", True),
    ("SmolLM2-360M", "smollm2/SmolLM2-360M-Instruct-partial", False),
    ("Gemma3-270M", "gemma3/gemma-3-270m-it", True),
    ("Gemma3-1B", "gemma3/gemma-3-1b-it-partial", False),
    ("Gemma3-4B", "gemma3/gemma-3-4b-it-reconstructed-partial", False),
    ("LFM2-450M", "lfm2/LFM2-VL-450M", True),
    ("LFM2-450M-older", "lfm2/LFM2-VL-450M_older-revision", False),
    ("LFM2-1.6B", "lfm2/LFM2-VL-1.6B", False),
    ("Qwen2.5-0.5B", "qwen/Qwen2.5-0.5B-Instruct-resaved-partial", True),
    ("Qwen2.5-1.5B", "qwen/Qwen2.5-1.5B-Instruct-resaved-tf5-partial", False),
    ("Qwen2.5-3B", "qwen/Qwen2.5-3B-Instruct-partial", False),
    ("R1-Distill-Qwen-1.5B", "qwen/DeepSeek-R1-Distill-Qwen-1.5B-modified-partial", False),
    ("Qwen3-0.6B", "qwen/Qwen3-0.6B", True),
    ("Qwen3-1.7B", "qwen/Qwen3-1.7B", False),
    ("Qwen3-4B", "qwen/Qwen3-4B", False),
    ("Qwen3-4B-Instruct-2507", "qwen/Qwen3-4B-Instruct-2507", False),
    ("Qwen3-4B-Thinking-2507", "qwen/Qwen3-4B-Thinking-2507", False),
    ("Hunyuan-0.5B", "hunyuan/Hunyuan-0.5B-Pretrain", True),
    ("Hunyuan-1.8B", "hunyuan/Hunyuan-1.8B-Instruct", False),
    ("Hunyuan-4B", "hunyuan/Hunyuan-4B-Instruct", False),
    ("Qwen3.5-0.8B", "qwen/Qwen3.5-0.8B-partial", True),
    ("Llama3.2-1B", "llama/Llama-3.2-1B-Instruct-partial", False),
    ("Llama3.2-3B", "llama/Llama-3.2-3B-Instruct-partial", False),
]


def rss(pid: int) -> tuple[int, int] | None:
    """(RssAnon, RssFile) of a process in bytes, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    got = {}
    for line in text.splitlines():
        key = line.split(":")[0]
        if key in ("RssAnon", "RssFile"):
            got[key] = int(line.split()[1]) * 1024
    return got.get("RssAnon", 0), got.get("RssFile", 0)


class Peak:
    """Polls a process's RssAnon and RssFile until it exits: the peak of each and of their sum."""

    def __init__(self, pid: int):
        self.pid, self.anon, self.file, self.both = pid, 0, 0, 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        self.anon, self.file, self.both = 0, 0, 0

    def run(self) -> None:
        while True:
            now = rss(self.pid)
            if now is None:
                return
            anon, file = now
            self.anon, self.file = max(self.anon, anon), max(self.file, file)
            self.both = max(self.both, anon + file)
            time.sleep(0.02)


def measured(cmd: list[str], env: dict) -> tuple[float, int, int, str]:
    """Runs `cmd`; returns (seconds, peak anonymous bytes, peak file bytes, stdout)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    peak = Peak(p.pid)
    out, err = p.communicate()
    dt = time.monotonic() - t0
    peak.thread.join(timeout=1)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    return dt, peak.anon, peak.file, out


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def serve_measured(bin_: str, repo: Path, gguf: Path, env: dict, ctx: int = 4096) -> dict:
    """Starts `serve --parallel 4 --ctx-size CTX`; measures it idle 4 s after its ready line, then
    with four full slots (four distinct prompts of CTX − 105 token ids and 100 tokens generated
    each, sent at once); returns the measures, the cache's full size from the ready line (bytes)
    and the seconds the four requests took."""
    cmd = [bin_, "serve", "--port", "0", "--parallel", "4", "--ctx-size", str(ctx), "--path", str(repo),
           "--reference", str(gguf)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    peak = Peak(p.pid)
    addr, ready = None, None
    try:
        for line in p.stderr:
            if "listening on http://" in line:
                addr = line.split("listening on http://")[1].split()[0]
            if line.startswith("ready: "):
                ready = line.strip()
                break
        if addr is None or ready is None:
            sys.exit(f"serve exited: {p.wait()}")
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        # "…; KV cache f16: 0 MiB now, 0 MiB at most so far, 1072 MiB with every sequence full"
        full_cache = int(ready.split(" MiB with every sequence full")[0].split()[-1]) << 20
        time.sleep(4)
        idle_anon, idle_file = rss(p.pid) or (0, 0)
        peak.reset()
        results = [None] * 4

        def ask(i: int) -> None:
            ids = [100 + (i * 7919 + j * 104729) % 5000 for j in range(ctx - 105)]
            body = json.dumps({"prompt": ids, "max_tokens": 100, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://{addr}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=3600) as r:
                    results[i] = json.loads(r.read())["choices"][0]["finish_reason"]
            except urllib.error.HTTPError as e:
                results[i] = f"HTTP {e.code}: {e.read()[:200]!r}"

        t0 = time.monotonic()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.monotonic() - t0
        return {"idle_anon": idle_anon, "idle_file": idle_file, "full_anon": peak.anon,
                "full_file": peak.file, "full_both": peak.both, "full_cache": full_cache,
                "full_s": dt, "finish": results}
    finally:
        p.terminate()
        p.wait()


def streamed_bytes(home: Path) -> int:
    """Bytes a token reads whole, from the pack the import made in the store `home`: every tensor
    of its `model.q4nx` but the embedding where the head is its own tensor (`lm_head.weight`),
    plus the scan head where the pack has one."""
    import struct

    packs = [m.parent for m in home.rglob("manifest.json") if (m.parent / "model.q4nx").exists()]
    if len(packs) != 1:
        sys.exit(f"expected one pack under {home}, found {packs}")
    repo = packs[0]
    with open(repo / "model.q4nx", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    size = lambda t: t["data_offsets"][1] - t["data_offsets"][0]
    total = sum(size(t) for t in header.values())
    if "lm_head.weight" in header:
        for name in ("model.embed_tokens.weight", "model.token_embd.weight",
                     "model.language_model.embed_tokens.weight"):
            if name in header:
                total -= size(header[name])
    scan = repo / "head-scan.bin"
    return total + (scan.stat().st_size if scan.exists() else 0)


def tensor_sizes(gguf: Path) -> tuple[int, int]:
    """(bytes of the largest tensor, parameters) of a GGUF."""
    import gguf as g

    ts = g.GGUFReader(gguf).tensors
    return max(int(t.n_bytes) for t in ts), sum(int(t.n_elements) for t in ts)


def compare_logits(a: argparse.Namespace, name: str, gguf: Path, src: list[str], env: dict) -> dict:
    """llama.cpp's next-token distributions on KLD_TEXT (`llama-perplexity`, beside `llama-bench`)
    against the pack's on the same tokens (`eval --kl-divergence-base`)."""
    ppl = Path(a.llama_bench).with_name("llama-perplexity")
    base = a.work / f"{name}.kld"
    subprocess.run([str(ppl), "-m", str(gguf), "-f", str(KLD_TEXT), "-c", str(KLD_CTX), "-b", str(KLD_CTX),
                    "--chunks", str(KLD_CHUNKS), "-t", str(a.threads), "--kl-divergence-base", str(base)],
                   capture_output=True, text=True, check=True)
    _, _, _, out = measured([a.bin, "-q", "eval", *src, "--kl-divergence-base", str(base), "-t", str(a.threads)],
                            env)
    base.unlink()
    return json.loads(out.strip().splitlines()[-1])


def kld_cell(k: dict | None) -> str:
    if not k:
        return ""
    return f"{k['kld_mean']:.1e} / {k['kld_max']:.1e}, {100 * k['same_top']:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "onebit-pipe"))
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "onebit-models" / "real-size")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ONEBIT_HOME=str(a.work / "home"), HF_HUB_OFFLINE="1")
    print("| model | params | pack GB | convert s / anon GB | import s (per stage) / anon GB / file GB | cached s | TTFT ms | prefill 128 tok/s | llama.cpp prefill 128 tok/s | decode tok/s | llama.cpp decode tok/s | streamed GB | serve idle anon+file GB | serve 4 full slots anon+file GB (cache GB) | vs llama.cpp logits: KLD mean / max, same top | budgets |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, cfg, smallest in MATRIX:
        if a.only and name not in a.only:
            continue
        if a.smoke and not smallest:
            continue
        gguf = a.work / f"{name}-q4_0.gguf"
        if not gguf.exists():
            subprocess.run([sys.executable, str(ROOT / "scripts" / "random-gguf.py"), str(CONFIGS / cfg),
                            "--out", str(gguf)], check=True, stdout=sys.stderr)
        repo = a.work / name
        if repo.exists():
            subprocess.run(["rm", "-rf", str(repo)], check=True)
        c_s, c_anon, _, _ = measured([a.bin, "-q", "convert", "--gguf", str(gguf), "--out", str(repo)], env)
        pack = (repo / "model.q4nx").stat().st_size
        # A fresh store per model: the import runs every stage.
        subprocess.run(["rm", "-rf", str(a.work / "home")], check=True)
        src = ["--path", str(repo), "--reference", str(gguf)]
        i_s, i_anon, i_file, out = measured([a.bin, "--json", "run", *src], env)
        stages = {}
        for line in out.splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "stage_finished":
                stages[e["stage"]] = e["duration_ms"] / 1000
        r_s, _, _, _ = measured([a.bin, "--json", "run", *src], env)
        _, _, _, gen = measured([a.bin, "-q", "--json", "generate", *src, "--prompt",
                                 "The capital of France is", "--max-tokens", "32", "--ctx-size", "1024",
                                 "-t", str(a.threads)], env)
        g = json.loads(gen.strip().splitlines()[-1])
        # Prefill of exactly 128 prompt tokens (ids, as llama-bench's -p 128 feeds its own).
        ids = json.dumps([2] + [1000 + (i * 7919) % 20000 for i in range(PREFILL_TOKENS - 1)])
        _, _, _, pre = measured([a.bin, "-q", "--json", "generate", *src, "--ids", ids, "--max-tokens", "1",
                                 "--ctx-size", "1024", "-t", str(a.threads)], env)
        prefill = json.loads(pre.strip().splitlines()[-1])["prefill_tokens_per_s"]
        streamed = streamed_bytes(a.work / "home")
        sv = serve_measured(a.bin, repo, gguf, env)
        ll = ll_pre = ""
        kld = None
        if a.llama_bench and not a.smoke:
            res = subprocess.run([a.llama_bench, "-m", str(gguf), "-t", str(a.threads), "-p", "0", "-n", "32",
                                  "-r", "3", "-o", "json"], capture_output=True, text=True, check=True)
            ll = f"{json.loads(res.stdout)[0]['avg_ts']:.1f}"
            res = subprocess.run([a.llama_bench, "-m", str(gguf), "-t", str(a.threads), "-p", str(PREFILL_TOKENS),
                                  "-n", "0", "-r", "3", "-o", "json"], capture_output=True, text=True, check=True)
            ll_pre = f"{json.loads(res.stdout)[0]['avg_ts']:.1f}"
            kld = compare_logits(a, name, gguf, src, env)
        big, params = tensor_sizes(gguf)
        budgets = []
        if i_s > 10 * pack / 1e9:
            budgets.append(f"import {i_s:.1f} s > {10 * pack / 1e9:.1f}")
        for what, anon in (("convert", c_anon), ("import", i_anon)):
            if anon > 1e9 + big:
                budgets.append(f"{what} anon {gb(anon)} > {gb(1e9 + big)}")
        serve_budget = 1.05 * (streamed + sv["full_cache"]) + 0.3e9
        if sv["full_both"] > serve_budget:
            budgets.append(f"serve full {gb(sv['full_both'])} > {gb(serve_budget)}")
        if name == "Hunyuan-1.8B":
            idle = sv["idle_anon"] + sv["idle_file"]
            if idle > 1.2e9:
                budgets.append(f"serve idle {gb(idle)} > 1.20")
            if sv["full_both"] > 2.4e9:
                budgets.append(f"serve full {gb(sv['full_both'])} > 2.40")
        if any(f != "length" and f != "stop" for f in sv["finish"]):
            budgets.append(f"serve answers {sv['finish']}")
        per_stage = ", ".join(f"{k} {v:.1f}" for k, v in stages.items() if v >= 0.05)
        row = {
            "model": name, "params": params, "pack_bytes": pack, "convert_s": c_s, "convert_anon": c_anon,
            "import_s": i_s, "import_stages": stages, "import_anon": i_anon, "import_file": i_file,
            "cached_s": r_s, "ttft_ms": g["time_to_first_token_ms"], "prefill_128_tps": prefill,
            "llama_prefill_128_tps": ll_pre, "decode_tps": g["decode_tokens_per_s"],
            "llama_decode_tps": ll, "streamed_bytes": streamed, "serve": sv, "vs_llama_logits": kld,
            "largest_tensor": big, "budgets_missed": budgets,
        }
        print(json.dumps(row), file=sys.stderr)
        print(f"| {name} | {params / 1e9:.2f} B | {gb(pack)} | {c_s:.1f} / {gb(c_anon)} | {i_s:.1f} ({per_stage}) / {gb(i_anon)} / {gb(i_file)} "
              f"| {r_s:.2f} | {g['time_to_first_token_ms']:.0f} | {prefill:.1f} | {ll_pre} | {g['decode_tokens_per_s']:.1f} | {ll} "
              f"| {gb(streamed)} | {gb(sv['idle_anon'])}+{gb(sv['idle_file'])} "
              f"| {gb(sv['full_anon'])}+{gb(sv['full_file'])} = {gb(sv['full_both'])} ({gb(sv['full_cache'])}) "
              f"| {kld_cell(kld)} | {'; '.join(budgets) or 'met'} |", flush=True)


if __name__ == "__main__":
    main()
