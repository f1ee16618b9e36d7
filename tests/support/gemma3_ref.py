"""A plain numpy Gemma 3 forward pass on a GGUF's own weights (dequantized with gguf-py), written
from the Hugging Face modeling code: the independent reference for the host runtime's tests.

usage: gemma3_ref.py MODEL.gguf IDS_JSON [N_GREEDY]
prints JSON: {"argmax": [top-1 after each prompt position], "greedy": [N_GREEDY continued ids],
              "logits_last": [first 16 logits after the prompt]}
"""
import json
import sys

import numpy as np
import gguf
from gguf.quants import dequantize


def main():
    r = gguf.GGUFReader(sys.argv[1])
    ids = json.loads(sys.argv[2])
    n_new = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    f = r.fields
    A = "gemma3"
    H = int(f[f"{A}.embedding_length"].contents())
    L = int(f[f"{A}.block_count"].contents())
    NH = int(f[f"{A}.attention.head_count"].contents())
    NKV = int(f[f"{A}.attention.head_count_kv"].contents())
    D = int(f[f"{A}.attention.key_length"].contents())
    eps = float(f[f"{A}.attention.layer_norm_rms_epsilon"].contents())
    base = float(f[f"{A}.rope.freq_base"].contents())
    window = int(f[f"{A}.attention.sliding_window"].contents())
    T = {t.name: t for t in r.tensors}

    def w(name):
        t = T[name]
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        return a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a

    emb = w("token_embd.weight").reshape(-1, H)
    layers = []
    for i in range(L):
        g = lambda s: w(f"blk.{i}.{s}")
        layers.append({k: g(k + ".weight") for k in [
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
            "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]})
    out_norm = w("output_norm.weight")

    def norm(x, wt):  # GGUF gemma norms already hold 1 + w
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * wt

    def rope(x, pos, b):  # x [T, n, D], rotate-half
        half = D // 2
        inv = b ** (-np.arange(0, half, dtype=np.float64) * 2 / D)
        ang = np.outer(pos, inv)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    def forward(tok):
        n = len(tok)
        x = emb[tok].astype(np.float64) * np.sqrt(H)
        pos = np.arange(n)
        for i, l in enumerate(layers):
            full = (i + 1) % 6 == 0
            h = norm(x, l["attn_norm"])
            q = (h @ l["attn_q"].T).reshape(n, NH, D)
            k = (h @ l["attn_k"].T).reshape(n, NKV, D)
            v = (h @ l["attn_v"].T).reshape(n, NKV, D)
            q = norm(q, l["attn_q_norm"])
            k = norm(k, l["attn_k_norm"])
            b = base if full else 10000.0
            q, k = rope(q, pos, b), rope(k, pos, b)
            att = np.zeros((n, NH, D))
            for hh in range(NH):
                kv = hh // (NH // NKV)
                sc = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(256.0)
                mask = np.tril(np.ones((n, n), dtype=bool))
                if not full:
                    mask &= (pos[:, None] - pos[None, :]) < window
                sc = np.where(mask, sc, -np.inf)
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                sc /= sc.sum(axis=1, keepdims=True)
                att[:, hh, :] = sc @ v[:, kv, :]
            o = att.reshape(n, NH * D) @ l["attn_output"].T
            x = x + norm(o, l["post_attention_norm"])
            h = norm(x, l["ffn_norm"])
            ff = (gelu(h @ l["ffn_gate"].T) * (h @ l["ffn_up"].T)) @ l["ffn_down"].T
            x = x + norm(ff, l["post_ffw_norm"])
        return norm(x, out_norm) @ emb.T

    logits = forward(ids)
    res = {"argmax": [int(a) for a in logits.argmax(axis=1)], "logits_last": [float(v) for v in logits[-1][:16]]}
    seq = list(ids)
    new = []
    for _ in range(n_new):
        nxt = int(forward(seq)[-1].argmax())
        new.append(nxt)
        seq.append(nxt)
    res["greedy"] = new
    print(json.dumps(res))


if __name__ == "__main__":
    main()
