#!/usr/bin/env python3
"""An oracle case whose vocabulary is off every tile's row block, derived exactly from another.

Real Hunyuan vocabularies (120,818 rows; 128,167 for Hunyuan-7B) are not multiples of the 16- or
32-row tiles, so a converter pads the embedding with zero rows and every reader must crop them.
This makes such a case from an existing tied-head oracle without re-running transformers: it
appends `--extra` rows to `token_embd.weight` that are byte-for-byte copies of existing rows (the
rows whose logits stay lowest at every position, so no argmax and no top-2 margin changes), and
matching tokens `<extra_i>` to the vocabulary. With a tied head, logit j is `h · e_j`, so the
copies' logits are exactly the copied rows' logits: the reference logits gain those columns and
nothing else changes (the ids and the greedy continuation are the source case's).

Usage (needs gguf-py and numpy, as scripts/test.sh installs them):

    python scripts/oracle/pad_vocab.py --src tests/fixtures/oracle/hunyuan-plain \
        --out tests/fixtures/oracle/hunyuan-vocab --extra 13
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gguf_meta import copy_metadata  # noqa: E402  (scripts/gguf_meta.py)


def low_rows(reference: dict, extra: int, avoid: set[int]) -> list[int]:
    """The `extra` rows whose logits sit furthest below each position's best, in every quant."""
    worst = None
    for quant in ("f32", "q4_0", "q4_1"):
        logits = np.array(reference["logits"][quant], dtype=np.float64)
        gap = logits - logits.max(axis=1, keepdims=True)
        m = gap.max(axis=0)
        worst = m if worst is None else np.maximum(worst, m)
    order = [int(i) for i in np.argsort(worst) if int(i) not in avoid]
    return order[:extra]


def pad_gguf(src: Path, dest: Path, rows: list[int]) -> None:
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"]
    w = gguf.GGUFWriter(dest, bytes(arch.parts[arch.data[0]]).decode())
    n0 = len(r.fields["tokenizer.ggml.tokens"].data)
    extra = len(rows)
    fill = {
        "tokenizer.ggml.tokens": [f"<extra_{i}>" for i in range(extra)],
        "tokenizer.ggml.token_type": [int(gguf.TokenType.USER_DEFINED)] * extra,
        "tokenizer.ggml.scores": [0.0] * extra,
    }
    copy_metadata(r, w, lambda name, value: value + fill[name] if name in fill else value)
    for t in r.tensors:
        data = np.array(t.data)
        if t.name == "token_embd.weight":
            assert data.shape[0] == n0, (t.name, data.shape, n0)
            # Whole rows of blocks, copied as stored: the copies dequantize exactly as the rows.
            data = np.concatenate([data, data[rows]], axis=0)
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--extra", type=int, default=13)
    a = ap.parse_args()
    reference = json.loads((a.src / "reference.json").read_text())
    cfg = json.loads((a.src / "hf/config.json").read_text())
    vocab = int(cfg["vocab_size"])
    specials = {int(cfg[k]) for k in cfg if k.endswith("token_id") or k.endswith("_id")}
    rows = low_rows(reference, a.extra, specials | set(reference["ids"]))
    if a.out.exists():
        shutil.rmtree(a.out)
    (a.out / "hf").mkdir(parents=True)
    for quant in ("q4_0", "q4_1"):
        pad_gguf(a.src / f"model-{quant}.gguf", a.out / f"model-{quant}.gguf", rows)
    for quant in ("f32", "q4_0", "q4_1"):
        reference["logits"][quant] = [
            row + [row[j] for j in rows] for row in reference["logits"][quant]
        ]
    reference["padded_vocab"] = {
        "source": str(a.src.name),
        "copied_rows": rows,
        "vocab": vocab + len(rows),
    }
    (a.out / "reference.json").write_text(json.dumps(reference))
    cfg["vocab_size"] = vocab + len(rows)
    if "org_vocab_size" in cfg:
        cfg["org_vocab_size"] = vocab + len(rows)
    (a.out / "hf/config.json").write_text(json.dumps(cfg, indent=2))
    tok = json.loads((a.src / "hf/tokenizer.json").read_text())
    for i in range(len(rows)):
        tok["added_tokens"].append(
            {
                "id": vocab + i,
                "content": f"<extra_{i}>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    (a.out / "hf/tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    for name in ("generation_config.json", "tokenizer_config.json"):
        shutil.copy(a.src / "hf" / name, a.out / "hf" / name)
    print(f"{a.out}: vocabulary {vocab} + {len(rows)} copies of rows {rows}")


if __name__ == "__main__":
    main()
