#!/usr/bin/env python3
"""Independent reference for `/v1/embeddings`: the final hidden states transformers computed,
recovered from its reference logits.

An oracle's `reference.json` holds transformers' logits at every position of its ids, computed
from the weights as the GGUF dequantizes them. The logits are the head times the final hidden
state (no soft-capping in these configs), and the head (the GGUF's `output.weight`, else the tied
`token_embd.weight`, dequantized by gguf-py) has more rows than columns, so least squares gives
back each position's hidden state. They are pooled (mean, last, or cls: the first) and
L2-normalized, as the server must pool its own.

usage: embed_ref.py MODEL.gguf reference.json QUANT POOLING
Prints one JSON object: {"embedding": [...], "residual": relative least-squares residual}.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

gguf_path, ref_path, quant, pooling = sys.argv[1:5]
reader = GGUFReader(gguf_path)
tensors = {t.name: t for t in reader.tensors}
head = tensors.get("output.weight") or tensors["token_embd.weight"]
E = dequantize(head.data, head.tensor_type).astype(np.float64)  # [vocab][hidden]
L = np.array(json.load(open(ref_path))["logits"][quant], dtype=np.float64)  # [pos][vocab]
assert E.shape[0] == L.shape[1], (E.shape, L.shape)
H, _, rank, _ = np.linalg.lstsq(E, L.T, rcond=None)  # [hidden][pos]
assert rank == E.shape[1], f"the head has rank {rank} < {E.shape[1]}"
residual = float(np.linalg.norm(E @ H - L.T) / np.linalg.norm(L))
H = H.T
v = {"mean": H.mean(axis=0), "last": H[-1], "cls": H[0]}[pooling]
v = v / np.linalg.norm(v)
print(json.dumps({"embedding": v.tolist(), "residual": residual}))
