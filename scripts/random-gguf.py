#!/usr/bin/env python3
"""A random-weight GGUF at the exact dimensions of a model's `config.json`, for benchmarks at real
size: llama.cpp runs the same file, so the two runtimes are compared on identical bytes.

Every family `onebit-pipe convert` accepts: llama (Llama 3.x, SmolLM2), qwen2, qwen3, gemma3,
hunyuan (dense), lfm2 and qwen35. The file's metadata and tensor names are llama.cpp's own: each
family's GGUF from the oracle fixtures (`tests/fixtures/oracle/*/model-q4_0.gguf`, written by
llama.cpp's `convert_hf_to_gguf.py`) is the template, its dimensions replaced by the config's.
Before writing, the tensor shapes this script derives from a config are checked against the
template's own tensors derived from the template's config, so a shape rule that llama.cpp does not
follow fails here and not in a benchmark.

Weights: 2-D matrices are random Q4_0 or Q4_1 blocks written directly (uniform 4-bit codes, scales
such that each row's values have a standard deviation of about 1/sqrt(K)); norms are 1 plus a little
noise, biases 0, convolution taps small, Qwen3.5's decays in range. The vocabulary is the
template's tokenizer extended with unreachable filler tokens up to the config's size. Nothing here
is a trained model: the text it generates is noise, its speed is the real model's.

Usage (needs numpy and gguf-py, as scripts/test.sh installs them):

    python scripts/random-gguf.py CONFIG_DIR_OR_JSON --quant q4_0 --out FILE.gguf [--seed N]

The files are large (about 0.56 bytes per parameter) and never committed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_meta import copy_metadata, field_value  # noqa: E402  (scripts/gguf_meta.py)

ORACLES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "oracle"


# transformers' `Gemma3TextConfig` defaults: a config saved by transformers leaves out what equals
# them (Gemma 3 4B's `text_config` names only its hidden size, FFN, layers and window).
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "tie_word_embeddings": True,
}


def text_config(cfg: dict) -> dict:
    """The language model's config (vision-language configs nest it under `text_config`)."""
    t = dict(cfg.get("text_config") or cfg)
    for k in ("architectures", "model_type", "tie_word_embeddings"):
        if k not in t and k in cfg:
            t[k] = cfg[k]
    if t.get("model_type") == "gemma3_text":
        for k, v in GEMMA3_TEXT_DEFAULTS.items():
            t.setdefault(k, v)
    return t


def family(cfg: dict) -> str:
    arch = " ".join(cfg.get("architectures") or []) + " " + str(cfg.get("model_type", ""))
    for pat, fam in [
        (r"HunYuanDense|hunyuan_v1_dense", "hunyuan"),
        (r"Qwen3_5|qwen3_5", "qwen35"),
        (r"Qwen3ForCausalLM|\bqwen3\b", "qwen3"),
        (r"Qwen2ForCausalLM|\bqwen2\b", "qwen2"),
        (r"Gemma3|gemma3", "gemma3"),
        (r"Lfm2|lfm2", "lfm2"),
        (r"LlamaForCausalLM|\bllama\b", "llama"),
    ]:
        if re.search(pat, arch):
            return fam
    sys.exit(f"no template for {arch.strip()!r}: convert accepts llama, qwen2, qwen3, gemma3, hunyuan, lfm2, qwen35")


def template_case(fam: str, cfg: dict) -> str:
    if fam == "hunyuan":
        alpha = (cfg.get("rope_scaling") or {}).get("alpha")
        return "hunyuan-alpha" if alpha else "hunyuan-plain"
    return fam


class Dims:
    """The dimensions llama.cpp's converter derives from a config."""

    def __init__(self, fam: str, c: dict):
        self.fam = fam
        self.h = int(c["hidden_size"])
        self.layers = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.kv = int(c.get("num_key_value_heads") or self.heads)
        self.d = int(c.get("head_dim") or c.get("attention_head_dim") or self.h // self.heads)
        self.vocab = int(c["vocab_size"])
        self.ctx = int(c.get("max_position_embeddings") or 4096)
        self.eps = float(c.get("rms_norm_eps") or c.get("norm_eps") or c.get("block_norm_eps") or 1e-6)
        self.theta = float(c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta") or 10000.0)
        self.tied = bool(c.get("tie_word_embeddings", True))
        if fam == "lfm2":
            ff = int(c.get("block_ff_dim") or c["intermediate_size"])
            if c.get("block_auto_adjust_ff_dim", True):
                ff = int(2 * ff / 3)
                ff = int(float(c.get("block_ffn_dim_multiplier") or 1.0) * ff)
                m = int(c.get("block_multiple_of") or 256)
                ff = m * ((ff + m - 1) // m)
            self.ffn = ff
            types = c.get("layer_types")
            if types is None:
                full = set(c.get("full_attn_idxs") or [])
                types = ["full_attention" if i in full else "conv" for i in range(self.layers)]
            self.attn = [t == "full_attention" for t in types]
            self.conv_l = int(c.get("conv_L_cache") or 3)
        else:
            self.ffn = int(c["intermediate_size"])
        if fam == "qwen35":
            types = c.get("layer_types")
            if types is None:
                every = int(c.get("full_attention_interval") or 4)
                types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(self.layers)]
            self.attn = [t == "full_attention" for t in types]
            self.interval = int(c.get("full_attention_interval") or 4)
            self.nk = int(c["linear_num_key_heads"])
            self.dk = int(c["linear_key_head_dim"])
            self.nv = int(c["linear_num_value_heads"])
            self.dv = int(c["linear_value_head_dim"])
            self.conv_k = int(c.get("linear_conv_kernel_dim") or 4)
            self.rot = int(self.d * float(c.get("partial_rotary_factor") or 0.25))
        if fam not in ("lfm2", "qwen35"):
            self.attn = [True] * self.layers
        if fam == "gemma3":
            self.window = int(c.get("sliding_window") or 512)
            self.theta_swa = float(c.get("rope_local_base_freq") or 10000.0)
        if fam == "hunyuan":
            alpha = (c.get("rope_scaling") or {}).get("alpha")
            if alpha:
                # llama.cpp folds the dynamic α into the base, θ·α^(d/(d−2)), and writes a
                # 262,144-token context (its α template shows it).
                self.theta = self.theta * float(alpha) ** (self.d / (self.d - 2))
                self.ctx = 262144

    def tensors(self) -> list[tuple[str, list[int], str]]:
        """(name, GGUF shape [ne0, ne1], kind) for every tensor; kind is `w` (a 4-bit matrix),
        `norm`, `bias`, `conv`, `ssm_a`, `dt`, in llama.cpp's order."""
        h, f, d = self.h, self.ffn, self.d
        out = [("token_embd.weight", [h, self.vocab], "w")]
        if self.fam == "lfm2":
            out.append(("token_embd_norm.weight", [h], "norm"))
        for i in range(self.layers):
            b = f"blk.{i}."
            t = []
            t.append((b + "attn_norm.weight", [h], "norm"))
            if self.attn[i]:
                q_rows = 2 * self.heads * d if self.fam == "qwen35" else self.heads * d
                t.append((b + "attn_q.weight", [h, q_rows], "w"))
                t.append((b + "attn_k.weight", [h, self.kv * d], "w"))
                t.append((b + "attn_v.weight", [h, self.kv * d], "w"))
                t.append((b + "attn_output.weight", [self.heads * d, h], "w"))
                if self.fam == "qwen2":
                    t.append((b + "attn_q.bias", [self.heads * d], "bias"))
                    t.append((b + "attn_k.bias", [self.kv * d], "bias"))
                    t.append((b + "attn_v.bias", [self.kv * d], "bias"))
                if self.fam in ("qwen3", "gemma3", "hunyuan", "lfm2", "qwen35"):
                    t.append((b + "attn_q_norm.weight", [d], "norm"))
                    t.append((b + "attn_k_norm.weight", [d], "norm"))
            elif self.fam == "lfm2":
                t.append((b + "shortconv.conv.weight", [self.conv_l, h], "conv"))
                t.append((b + "shortconv.in_proj.weight", [h, 3 * h], "w"))
                t.append((b + "shortconv.out_proj.weight", [h, h], "w"))
            else:  # qwen35's gated DeltaNet
                ch = 2 * self.nk * self.dk + self.nv * self.dv
                t.append((b + "ssm_a", [self.nv], "ssm_a"))
                t.append((b + "ssm_conv1d.weight", [self.conv_k, ch], "conv"))
                t.append((b + "ssm_dt.bias", [self.nv], "dt"))
                t.append((b + "ssm_alpha.weight", [h, self.nv], "w"))
                t.append((b + "ssm_beta.weight", [h, self.nv], "w"))
                t.append((b + "attn_qkv.weight", [h, ch], "w"))
                t.append((b + "attn_gate.weight", [h, self.nv * self.dv], "w"))
                t.append((b + "ssm_norm.weight", [self.dv], "norm"))
                t.append((b + "ssm_out.weight", [self.nv * self.dv, h], "w"))
            t.append((b + "ffn_gate.weight", [h, f], "w"))
            t.append((b + "ffn_up.weight", [h, f], "w"))
            t.append((b + "ffn_down.weight", [f, h], "w"))
            if self.fam == "gemma3":
                t.append((b + "post_attention_norm.weight", [h], "norm"))
                t.append((b + "post_ffw_norm.weight", [h], "norm"))
            if self.fam == "qwen35":
                t.append((b + "post_attention_norm.weight", [h], "norm"))
            else:
                t.append((b + "ffn_norm.weight", [h], "norm"))
            out.extend(t)
        if self.fam != "lfm2":
            out.append(("output_norm.weight", [h], "norm"))
        if not self.tied:
            out.append(("output.weight", [h, self.vocab], "w"))
        return out

    def params(self) -> int:
        return sum(int(np.prod(s)) for _, s, _ in self.tensors())

    def metadata(self, arch: str) -> dict[str, object]:
        """The `{arch}.*` keys this script sets (others are the template's)."""
        m = {
            "block_count": self.layers,
            "context_length": self.ctx,
            "embedding_length": self.h,
            "feed_forward_length": self.ffn,
            "attention.head_count": self.heads,
            "attention.head_count_kv": self.kv,
            "rope.freq_base": self.theta,
            "attention.layer_norm_rms_epsilon": self.eps,
            "attention.key_length": self.d,
            "attention.value_length": self.d,
            "vocab_size": self.vocab,
            "rope.dimension_count": self.d,
        }
        if self.fam == "lfm2":
            m["attention.head_count_kv"] = [self.kv if a else 0 for a in self.attn]
            m["shortconv.l_cache"] = self.conv_l
        if self.fam == "gemma3":
            m["attention.sliding_window"] = self.window
            m["rope.freq_base_swa"] = self.theta_swa
        if self.fam == "qwen35":
            m.update(
                {
                    "ssm.conv_kernel": self.conv_k,
                    "ssm.state_size": self.dk,
                    "ssm.group_count": self.nk,
                    "ssm.time_step_rank": self.nv,
                    "ssm.inner_size": self.nv * self.dv,
                    "attention.recurrent_layers": [not a for a in self.attn],
                    "full_attention_interval": self.interval,
                    "rope.dimension_count": self.rot,
                }
            )
        return {f"{arch}.{k}": v for k, v in m.items()}


def check_against_template(fam: str, path: Path) -> gguf.GGUFReader:
    """The template GGUF (`path/model-q4_0.gguf`), after checking that this script's tensors for
    the template's own config (`path/hf/config.json`) are exactly llama.cpp's (names, shapes, order
    of layers aside)."""
    case = path.name
    reader = gguf.GGUFReader(path / "model-q4_0.gguf")
    dims = Dims(fam, text_config(json.loads((path / "hf" / "config.json").read_text())))
    ours = {n: s for n, s, _ in dims.tensors()}
    theirs = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    if ours != theirs:
        missing = sorted(set(theirs) - set(ours))[:5]
        extra = sorted(set(ours) - set(theirs))[:5]
        wrong = sorted(n for n in set(ours) & set(theirs) if ours[n] != theirs[n])[:5]
        sys.exit(
            f"{case}: shape rules disagree with llama.cpp's GGUF: missing {missing}, extra {extra}, "
            f"shapes {[(n, ours[n], theirs[n]) for n in wrong]}"
        )
    return reader


def random_blocks(rng, rows: int, k: int, qtype) -> np.ndarray:
    """`rows × k` random weights in `qtype`'s blocks, as bytes (`rows × bytes per row`)."""
    blocks = k // 32
    # Uniform codes 0..15 have a standard deviation of 4.6 steps: d·4.6 ≈ 1/√k.
    d = np.float16(1.0 / (4.6 * math.sqrt(k)))
    codes = rng.integers(0, 256, size=(rows, blocks, 16), dtype=np.uint8)
    scale = np.full((rows, blocks, 1), d, dtype=np.float16).view(np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_0:
        parts = [scale, codes]
    else:  # Q4_1: value = d·q + m, with m = −8·d (zero mean)
        m = np.full((rows, blocks, 1), np.float16(-8.0 * float(d)), dtype=np.float16).view(np.uint8)
        parts = [scale, m, codes]
    return np.concatenate(parts, axis=2).reshape(rows, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, help="config.json, or the folder holding it")
    ap.add_argument("--quant", choices=["q4_0", "q4_1"], default="q4_0")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--template", type=Path,
        help="a folder with model-q4_0.gguf and hf/config.json of the same family to take the "
        "metadata and vocabulary from [default: the family's tests/fixtures/oracle case]; "
        "tests/fixtures/towers/gemma3 gives a Gemma 3 vocabulary with its image tokens",
    )
    a = ap.parse_args()
    cfg_path = a.config / "config.json" if a.config.is_dir() else a.config
    cfg = text_config(json.loads(cfg_path.read_text()))
    fam = family(cfg)
    template = a.template or ORACLES / template_case(fam, cfg)
    tpl = check_against_template(fam, template)
    dims = Dims(fam, cfg)
    qtype = gguf.GGMLQuantizationType.Q4_0 if a.quant == "q4_0" else gguf.GGMLQuantizationType.Q4_1
    arch = field_value(tpl.fields["general.architecture"])
    overrides = dims.metadata(arch)
    params = dims.params()
    overrides["general.size_label"] = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
    overrides["general.name"] = f"random {cfg_path.parent.name}"
    overrides["general.file_type"] = 2 if a.quant == "q4_0" else 3
    w = gguf.GGUFWriter(a.out, arch)
    n_tpl = len(field_value(tpl.fields["tokenizer.ggml.tokens"]))
    if dims.vocab < n_tpl:
        sys.exit(f"vocabulary {dims.vocab} is smaller than the template's {n_tpl}")
    fill = dims.vocab - n_tpl
    # Unreachable filler tokens up to the config's vocabulary (no merge produces them).
    fillers = {
        "tokenizer.ggml.tokens": [f"r{i}" for i in range(fill)],
        "tokenizer.ggml.token_type": [int(gguf.TokenType.NORMAL)] * fill,
        "tokenizer.ggml.scores": [-1e9] * fill,
    }

    def edit(name: str, value):
        value = overrides.get(name, value)
        return value + fillers[name] if name in fillers else value

    written = copy_metadata(tpl, w, edit)
    # Keys the template lacks are not llama.cpp's for this family: only the general ones are added.
    for k, v in overrides.items():
        if k not in written and k.startswith("general."):
            w.add_key_value(k, v, gguf.GGUFValueType.STRING if isinstance(v, str) else gguf.GGUFValueType.UINT32)
    rng = np.random.default_rng(a.seed)
    for name, shape, kind in dims.tensors():
        if kind == "w":
            k, rows = shape
            if k % 32:
                sys.exit(f"{name}: K = {k} is not a multiple of 32")
            data = random_blocks(rng, rows, k, qtype)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
            continue
        n = int(np.prod(shape))
        if kind == "norm":
            v = 1.0 + 0.05 * rng.standard_normal(n)
        elif kind == "bias":
            v = np.zeros(n)
        elif kind == "conv":
            v = 0.1 * rng.standard_normal(n)
        elif kind == "ssm_a":
            # llama.cpp stores −exp(A_log); decays of 0.5–0.95 per step.
            v = -rng.uniform(0.05, 0.4, n)
        else:
            v = rng.uniform(-0.5, 0.5, n)
        w.add_tensor(name, v.astype(np.float32).reshape(list(reversed(shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {fam} (template {template.name}), {params / 1e9:.3f} B parameters, {a.quant}")


if __name__ == "__main__":
    main()
