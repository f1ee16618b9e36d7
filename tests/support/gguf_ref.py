#!/usr/bin/env python3
"""Independent reference for onebit-pipe's GGUF dequantization: gguf-py (PyPI `gguf`).

  gguf_ref.py dequant FILE OUTDIR         every tensor gguf-py can dequantize -> OUTDIR/<i>.f32,
                                          listed in OUTDIR/manifest.json
  gguf_ref.py random OUTDIR [SEED]        random blocks of every type -> <type>.bin + <type>.f32
  gguf_ref.py bench FILE                  seconds gguf-py takes to dequantize each type (JSON)
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize
from gguf.constants import GGML_QUANT_SIZES

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"]


def dequant(path, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    r = GGUFReader(path)
    listing = []
    for i, t in enumerate(r.tensors):
        if t.tensor_type.name not in TYPES:
            continue
        v = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        f = out / f"{i}.f32"
        v.reshape(-1).tofile(f)
        listing.append({"name": t.name, "type": t.tensor_type.name, "file": f.name, "n": int(v.size)})
    (out / "manifest.json").write_text(json.dumps(listing))


def random_blocks(out, seed=7):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in TYPES:
        qt = T[name]
        bs, ts = GGML_QUANT_SIZES[qt]
        n_blocks = 512 if bs > 1 else 8192
        raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
        # Keep half-precision scale fields finite so the comparison is about layout, not NaN bits:
        # clear the top exponent bit of every 16-bit little-endian word's high byte.
        if name not in ("F32", "BF16", "MXFP4"):
            raw[:, 1::2] &= 0xBF
        if name == "F32":
            raw[:, 3] &= 0xBF
        if name == "BF16":
            raw[:, 1] &= 0xBF
        v = dequantize(raw.reshape(-1), qt).astype(np.float32, copy=False)
        (out / f"{name}.bin").write_bytes(raw.tobytes())
        v.reshape(-1).tofile(out / f"{name}.f32")


def bench(path):
    r = GGUFReader(path)
    by_type = {}
    for t in r.tensors:
        if t.tensor_type.name not in TYPES:
            continue
        t0 = time.perf_counter()
        dequantize(t.data, t.tensor_type)
        dt = time.perf_counter() - t0
        e = by_type.setdefault(t.tensor_type.name, {"seconds": 0.0, "bytes": 0, "tensors": 0})
        e["seconds"] += dt
        e["bytes"] += int(t.n_bytes)
        e["tensors"] += 1
    print(json.dumps(by_type))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "dequant":
        dequant(sys.argv[2], sys.argv[3])
    elif cmd == "random":
        random_blocks(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 7)
    elif cmd == "bench":
        bench(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")
