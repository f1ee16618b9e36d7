#!/usr/bin/env python3
"""Independent oracles for the families onebit-pipe converts and runs.

For each case: a tiny random-weight model made by HF transformers from a config shaped like the
real one (norms perturbed away from 1, so a wrong norm shows), a toy byte-level BPE tokenizer that
carries the family's real special-token strings and pre-tokenizer, its GGUF made by llama.cpp's
own `convert_hf_to_gguf.py` (the llama.cpp vendored in the `llama-cpp-python` source package, with
its gguf-py), requantized to Q4_0 and Q4_1 by gguf-py, and reference logits by transformers in fp32
(eager attention, no cache) from the weights as each GGUF dequantizes them.

The toy tokenizer's pre-tokenizer hash is unknown to llama.cpp's converter (it hashes the ids of a
fixed text against a list of real vocabularies), so the converter is run from a wrapper that makes
`get_vocab_base_pre` return the family's llama.cpp name; everything else is llama.cpp's code as is.

Usage (needs torch, transformers, tokenizers, numpy; the outputs are committed, CI never runs it):

    python scripts/oracle/generate.py --llama-cpp DIR/llama.cpp --out tests/fixtures/oracle [CASE ...]

Each case writes `tests/fixtures/oracle/CASE/`: `hf/` (config.json as the hub spells it,
tokenizer files), `model-q4_0.gguf`, `model-q4_1.gguf`, and `reference.json` (ids, and per quant
the logits at every position, and the greedy continuation of a translation request rendered by the
chat template, with each step's top-2 margin).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

SEED = 20261201
# Fixed ids the references are computed on (the same for every case; all < the toy vocab).
IDS_LEN = 24
# Greedy steps of the translation reference.
GREEDY_STEPS = 8


def hunyuan_config(alpha: float | None) -> dict:
    """A config shaped like Hunyuan-1.8B / Hy-MT2 (GQA 4:1, q/k norm, tied, dynamic-alpha RoPE)."""
    cfg = {
        "architectures": ["HunYuanDenseV1ForCausalLM"],
        "model_type": "hunyuan_v1_dense",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_head_dim": 32,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32768,
        "mlp_bias": False,
        "norm_type": "rms",
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "use_cla": False,
        "use_qk_norm": True,
        "use_rotary_pos_emb": True,
        "torch_dtype": "float32",
        "initializer_range": 0.04,
    }
    if alpha is not None:
        cfg["rope_scaling"] = {
            "alpha": alpha,
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "type": "dynamic",
        }
    return cfg


# The special tokens of Hunyuan-1.8B-Instruct / Hy-MT2, as strings (ids are the toy vocab's).
HUNYUAN_SPECIALS = [
    "<｜hy_begin▁of▁sentence｜>",
    "<｜hy_end▁of▁sentence｜>",
    "<｜hy_▁pad▁｜>",
    "<｜hy_User｜>",
    "<｜hy_Assistant｜>",
    "<｜hy_place▁holder▁no▁2｜>",
    "<｜hy_place▁holder▁no▁3｜>",
]
# llama.cpp's hunyuan-dense pre-tokenizer (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_HUNYUAN_DENSE).
HUNYUAN_DENSE_REGEXES = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
# Hunyuan's chat template (Hunyuan-1.8B-Instruct's, without tools): system text closed by the token
# `<｜hy_place▁holder▁no▁3｜>`, each user turn `<｜hy_User｜>…<｜hy_Assistant｜>`, each answer ended by EOS.
HY_TEMPLATE = (
    "{{- bos_token }}{%- set sys = namespace(p='') %}"
    "{%- for m in messages %}{%- if m['role'] == 'system' %}{%- set sys.p = sys.p + m['content'] %}{%- endif %}{%- endfor %}"
    "{{- sys.p }}{%- if sys.p != '' %}{{- '<｜hy_place▁holder▁no▁3｜>' }}{%- endif %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{{- '<｜hy_User｜>' + m['content'] + '<｜hy_Assistant｜>' }}"
    "{%- elif m['role'] == 'assistant' %}{{- m['content'] + eos_token }}{%- endif %}{%- endfor %}"
)
# Hy-MT's translation prompt (the user message of a translation request), for a few sentences:
# the reference uses the first whose greedy steps all have a clear top-2 margin, so a reader within
# int8-activation noise of the oracle must pick the same tokens.
TRANSLATE = "Translate the following segment into German, without additional explanation.\n\n{}"
SENTENCES = [
    "The capital of France is Paris.",
    "Numbers 12345 and 3.14159.",
    "Tokyo is the capital of Japan.",
    "We meet at noon.",
    "The weather is nice today.",
    "Where is the station?",
    "Good morning, my friend.",
    "I like green tea.",
    "The book is on the table.",
    "Open the window, please.",
    "Rome is in Italy.",
    "The cat sleeps on the sofa.",
    "It is raining in London.",
    "Please close the door.",
    "The train leaves at eight.",
    "Water boils at 100 degrees.",
    "She reads a newspaper every morning.",
    "The museum opens at nine.",
    "We are going to the beach tomorrow.",
    "This apple is red.",
    "My brother plays the guitar.",
]
CLEAR_MARGIN = 0.08

LLAMA_BPE_REGEXES = [
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
QWEN2_REGEXES = [
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
CHATML_TEMPLATE = (
    "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages -%}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)

# LFM2's chat template (LiquidAI's, text content): BOS, then ChatML turns.
LFM2_TEMPLATE = (
    "{{- bos_token -}}{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)
LFM2_SPECIALS = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def lfm2_config() -> dict:
    """LFM2-1.2B's shape (hub keys, as LiquidAI spells them): gated short-convolution layers
    beside GQA attention layers (layer 0 conv, as in 1.2B), q/k RMSNorm before RoPE, the FFN width
    auto-adjusted from block_ff_dim (512 -> 64·ceil(int(2·512/3)/64) = 384, so a reader that
    skips the rule reads the wrong width), conv kernel 3, θ 10^6, tied."""
    c = small(
        architectures=["Lfm2ForCausalLM"],
        model_type="lfm2",
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        intermediate_size=512,
        block_ff_dim=512,
        block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0,
        block_multiple_of=64,
        conv_L_cache=3,
        conv_bias=False,
        norm_eps=1e-05,
        rope_theta=1000000.0,
        max_position_embeddings=128000,
    )
    # LFM2's config has neither key: its norms read norm_eps and its MLP is always SwiGLU.
    del c["rms_norm_eps"], c["hidden_act"]
    return c


QWEN35_REGEXES = [
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def qwen35_config() -> dict:
    """Qwen3.5's text shape (hub keys of Qwen3.5-0.8B/2B/4B): three gated-DeltaNet layers, then a
    gated full-attention layer (full_attention_interval 4); fewer key heads than value heads (2
    and 4, as 4B/9B have 16 and 32), so llama.cpp's tiled value-head order differs from
    transformers' grouped one; q/k norm, partial RoPE (0.25 of head_dim 64), θ 10^7, norms
    stored as w with gain 1 + w except the gated output norm, tied."""
    return small(
        architectures=["Qwen3_5ForCausalLM"],
        model_type="qwen3_5_text",
        num_hidden_layers=4,
        # The delta rule amplifies int8-activation noise as the weights grow (measured on this
        # shape, max |int8 − fp32| over the logits' std: 0.30 at 0.04, 0.15 at 0.03, 0.058 at
        # 0.02): the smaller scale keeps the oracle's int8 cost as small a share as the others'.
        initializer_range=0.02,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        full_attention_interval=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        attn_output_gate=True,
        attention_bias=False,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_value_head_dim=32,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [3, 3, 2],
        },
        max_position_embeddings=262144,
    )


# Gemma's chat template (as Google ships it for Gemma 3, text content).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' }}{{- message['content'] | trim }}{{- '<end_of_turn>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def small(**kw) -> dict:
    """The tiny geometry every case shares (GQA, head_dim ≠ hidden/heads where the family allows)."""
    base = {
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "torch_dtype": "float32",
        "initializer_range": 0.04,
        "tie_word_embeddings": True,
    }
    base.update(kw)
    return base


@dataclass
class Case:
    """One oracle: the config, the tokenizer's special tokens (bos/eos/pad among them), its
    llama.cpp pre-tokenizer, the chat template, the gguf-py architecture, and the family's extra
    config keys that name token ids."""

    config: dict
    specials: list[str]
    bos: str
    eos: str
    pad: str
    regexes: list[str]
    pre: str
    template: str
    arch: str
    id_keys: Callable[[dict[str, int]], dict] = field(default=lambda ids: {})
    # Extra arguments of convert_hf_to_gguf.py (Qwen3.5: no multi-token-prediction layers, as
    # FastFlowLM's packs have none).
    converter_args: tuple[str, ...] = ()
    # Parameters whose stored norm llama.cpp does not shift (Qwen3.5's gated output norm).
    unshifted: tuple[str, ...] = ()
    # A SentencePiece vocabulary (tokenizer.model) instead of byte-level BPE.
    spm: bool = False
    # What llama.cpp adds to every `*norm.weight` it writes (Gemma stores 1 + w).
    norm_shift: float = 0.0


def hunyuan_ids(c: "Case"):
    return lambda ids: {
        "org_vocab_size": None,
        "eod_token_id": ids[c.eos],
        "pad_id": ids[c.pad],
        "sep_token_id": ids[HUNYUAN_SPECIALS[4]],
    }


def hunyuan_case(alpha: float | None) -> Case:
    c = Case(
        config=hunyuan_config(alpha),
        specials=HUNYUAN_SPECIALS,
        bos=HUNYUAN_SPECIALS[0],
        eos=HUNYUAN_SPECIALS[5],
        pad=HUNYUAN_SPECIALS[2],
        regexes=HUNYUAN_DENSE_REGEXES,
        pre="hunyuan-dense",
        template=HY_TEMPLATE,
        arch="HUNYUAN_DENSE",
    )
    c.id_keys = hunyuan_ids(c)
    return c


def llama_case(theta: float, scaling: dict | None) -> Case:
    """Llama 3.2-1B's shape (GQA 4:1, tied), with `scaling` as its `rope_scaling` when given."""
    rope = {"rope_theta": theta}
    if scaling is not None:
        rope["rope_scaling"] = scaling
    return Case(
        config=small(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            head_dim=32,
            num_key_value_heads=1,
            attention_bias=False,
            mlp_bias=False,
            **rope,
            max_position_embeddings=131072,
        ),
        specials=LLAMA3_SPECIALS,
        bos=LLAMA3_SPECIALS[0],
        eos=LLAMA3_SPECIALS[2],
        pad=LLAMA3_SPECIALS[1],
        regexes=LLAMA_BPE_REGEXES,
        pre="llama-bpe",
        template=LLAMA3_TEMPLATE,
        arch="LLAMA",
    )


def qwen_case(config: dict, arch: str) -> Case:
    """A Qwen2/Qwen3 config with Qwen's special tokens, pre-tokenizer and ChatML template."""
    return Case(
        config=config,
        specials=QWEN_SPECIALS,
        bos=QWEN_SPECIALS[0],
        eos=QWEN_SPECIALS[2],
        pad=QWEN_SPECIALS[0],
        regexes=QWEN2_REGEXES,
        pre="qwen2",
        template=CHATML_TEMPLATE,
        arch=arch,
    )


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]

CASES = {
    "hunyuan-alpha": hunyuan_case(1000.0),
    "hunyuan-plain": hunyuan_case(None),
    # Qwen3-0.6B's shape: q/k RMSNorm, head_dim set apart from hidden/heads (4 heads of 64 over
    # hidden 128, as 0.6B has 16 heads of 128 over 1024), θ 10^6, tied.
    "qwen3": qwen_case(
        small(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            head_dim=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=False,
            rope_theta=1000000.0,
            max_position_embeddings=40960,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=2,
        ),
        "QWEN3",
    ),
    # Qwen2.5-0.5B's shape: q/k/v biases (drawn away from 0), θ 10^6, tied.
    "qwen2": qwen_case(
        small(
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            rope_theta=1000000.0,
            max_position_embeddings=32768,
            use_sliding_window=False,
            sliding_window=32768,
            max_window_layers=2,
        ),
        "QWEN2",
    ),
    # Gemma 3 270M's shape: six layers (five sliding, window 8 < the 24 ids, the sixth full), q/k
    # norm before RoPE, local base 10^4 and global 10^6, GELU (tanh), √hidden embedding scale,
    # norms stored as 1 + w, a SentencePiece vocabulary.
    "gemma3": Case(
        config=small(
            architectures=["Gemma3ForCausalLM"],
            model_type="gemma3_text",
            num_hidden_layers=6,
            # Six layers with sandwich norms accumulate more int8-activation noise per unit of
            # logit than two: a smaller scale keeps that noise (0.03) under the 0.05 bound.
            initializer_range=0.035,
            num_key_value_heads=1,
            head_dim=32,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=32,
            sliding_window=8,
            sliding_window_pattern=6,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            max_position_embeddings=32768,
        ),
        specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        regexes=[],
        pre="default",
        template=GEMMA_TEMPLATE,
        arch="GEMMA3",
        spm=True,
        norm_shift=1.0,
    ),
    # Llama 3.2-1B's shape with llama3 RoPE scaling, original_max_position_embeddings small enough
    # (64) that the scaled and smoothed frequencies turn within the 24 ids; llama.cpp's converter
    # stores the per-frequency factors as rope_freqs.weight.
    "llama3": llama_case(
        10000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    # Llama 3.2-1B's shape without RoPE scaling (llama.cpp's converter permutes q/k rows).
    "llama": llama_case(500000.0, None),
    "lfm2": Case(
        config=lfm2_config(),
        specials=LFM2_SPECIALS,
        bos="<|startoftext|>",
        eos="<|im_end|>",
        pad="<|pad|>",
        regexes=LLAMA_BPE_REGEXES,
        pre="lfm2",
        template=LFM2_TEMPLATE,
        arch="LFM2",
    ),
    "qwen35": replace(
        qwen_case(qwen35_config(), "QWEN35"),
        regexes=QWEN35_REGEXES,
        pre="qwen35",
        norm_shift=1.0,
        unshifted=("linear_attn.norm.weight", "ssm_norm.weight"),
        converter_args=("--no-mtp",),
    ),
}


def toy_tokenizer(text: str, specials: list[str], regexes: list[str], vocab: int):
    """A byte-level BPE trained on `text`, with the family's pre-tokenizer and special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - len(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer)
    tok.add_special_tokens(specials)
    return tok


def toy_sentencepiece(text: str, specials: list[str], vocab: int, hf: Path) -> tuple[int, dict[str, int]]:
    """A SentencePiece BPE model (byte fallback) trained on `text`, Gemma's ids: pad 0, eos 1,
    bos 2, unk 3, then the family's other special tokens as user-defined pieces."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()),
        model_writer=model,
        vocab_size=vocab,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        user_defined_symbols=[s for s in specials if s not in ("<pad>", "<eos>", "<bos>", "<unk>")],
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_digits=True,
        minloglevel=2,
    )
    (hf / "tokenizer.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return sp.get_piece_size(), {s: sp.piece_to_id(s) for s in specials}


def write_hf(case: str, out: Path, text: str) -> tuple[dict, Path]:
    from transformers import AutoConfig, AutoModelForCausalLM

    c = CASES[case]
    cfg, specials, regexes, template = c.config, c.specials, c.regexes, c.template
    hf = out / "hf"
    if hf.exists():
        shutil.rmtree(hf)
    hf.mkdir(parents=True)
    if c.spm:
        vocab, ids = toy_sentencepiece(text, specials, 384, hf)
    else:
        tok = toy_tokenizer(text, specials, regexes, 384)
        vocab = tok.get_vocab_size()
        ids = {s: tok.token_to_id(s) for s in specials}
    cfg = dict(cfg)
    cfg.update(vocab_size=vocab)
    extra = c.id_keys(ids)
    if "org_vocab_size" in extra:
        extra["org_vocab_size"] = vocab
    cfg.update(extra)
    cfg.update(
        bos_token_id=ids[c.bos],
        eos_token_id=ids[c.eos],
        pad_token_id=ids[c.pad],
    )
    if not c.spm:
        tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GemmaTokenizer" if c.spm else "PreTrainedTokenizerFast",
                "bos_token": c.bos,
                "eos_token": c.eos,
                "pad_token": c.pad,
                "add_bos_token": True,
                "clean_up_tokenization_spaces": False,
                "model_max_length": cfg["max_position_embeddings"],
                "chat_template": template,
            },
            ensure_ascii=False,
            indent=2,
        )
    )
    (hf / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": cfg["bos_token_id"],
                "eos_token_id": cfg["eos_token_id"],
                "pad_token_id": cfg["pad_token_id"],
            },
            indent=2,
        )
    )
    torch.manual_seed(SEED)
    (hf / "config.json").write_text(json.dumps(cfg, indent=2))
    config = AutoConfig.from_pretrained(hf)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                # The gain the model applies is drawn from U(0.5, 1.5): w itself, or 1 + w for
                # families that store w and add 1 (Gemma, Qwen3.5 except its gated norm).
                shift = 0.0 if name.endswith(c.unshifted) else c.norm_shift
                p.copy_(torch.empty_like(p).uniform_(0.5 - shift, 1.5 - shift))
            elif name.endswith("A_log"):
                # Decays exp(−A·softplus(a + dt_bias)) of 0.5–0.95, so the state carries the
                # context across the ids (transformers draws A up to 16: everything forgotten).
                p.copy_(torch.empty_like(p).uniform_(0.05, 0.4).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty_like(p).uniform_(-0.5, 0.5))
            elif name.endswith(".bias"):
                p.copy_(torch.empty_like(p).uniform_(-0.5, 0.5))
    model.save_pretrained(hf, safe_serialization=True)
    # save_pretrained rewrites config.json in transformers' spelling: keep the hub's.
    (hf / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg, hf


def run_converter(llama_cpp: Path, hf: Path, dest: Path, pre: str, extra: tuple[str, ...] = ()) -> None:
    wrapper = f"""
import sys
sys.path.insert(0, {str(llama_cpp)!r})
sys.path.insert(0, {str(llama_cpp / 'gguf-py')!r})
sys.argv = ['convert_hf_to_gguf.py', {str(hf)!r}, '--outtype', 'f32', '--outfile', {str(dest)!r}, *{list(extra)!r}]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
import runpy
runpy.run_path({str(llama_cpp / 'convert_hf_to_gguf.py')!r}, run_name='__main__')
"""
    subprocess.run([sys.executable, "-c", wrapper], check=True)


def requantize(src: Path, dest: Path, qtype) -> None:
    """Every 2-D weight whose rows split into 32-blocks in `qtype`; 1-D tensors stay F32."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"]
    arch_name = bytes(arch.parts[arch.data[0]]).decode()
    w = gguf.GGUFWriter(dest, arch_name)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(f.name, val, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[f.data[0]]).decode("utf-8"), vtype)
        else:
            w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], vtype)
    for t in r.tensors:
        data = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        if data.ndim == 2 and data.shape[-1] % 32 == 0:
            q = bf16_exact_scales(gguf.quants.quantize(data, qtype), qtype)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def bf16_exact_scales(q: np.ndarray, qtype) -> np.ndarray:
    """Rounds every block's f16 scale (and Q4_1 min) to the nearest bf16 value. Every NPU2 tile
    kind stores bf16 scales, so a native copy of these blocks is then lossless and the oracle
    measures the reader and the runtime, not the format's scale rounding (which convert reports
    per tensor as its requantization error)."""
    import gguf

    size = {gguf.GGMLQuantizationType.Q4_0: 18, gguf.GGMLQuantizationType.Q4_1: 20}[qtype]
    fields = {gguf.GGMLQuantizationType.Q4_0: [0], gguf.GGMLQuantizationType.Q4_1: [0, 2]}[qtype]
    blocks = q.reshape(-1, size).copy()
    for at in fields:
        f16 = blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)
        bits = f16.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
        blocks[:, at : at + 2] = rounded.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(q.shape)


def gguf_weights(path: Path) -> dict[str, np.ndarray]:
    import gguf

    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def gguf_name(names, name: str) -> str:
    """The GGUF tensor llama.cpp writes for HF parameter `name`."""
    base, suffix = name.rsplit(".", 1)
    if suffix == "A_log":
        g = names.get_name(name)
        suffix = None
    elif suffix == "dt_bias":
        g, suffix = names.get_name(f"{base}.dt_proj"), "bias"
    else:
        g = names.get_name(base)
    if g is None:
        raise SystemExit(f"no GGUF name for {name}")
    return g if suffix is None else f"{g}.{suffix}"


def match_order(g: str, q: np.ndarray, ref: np.ndarray, hf_w: np.ndarray) -> np.ndarray:
    """`q` (the quantized GGUF tensor) in the HF tensor's order: rows, else columns (2-D), or
    elements (1-D) of the f32 GGUF tensor `ref` matched to `hf_w`'s by their exact bytes."""

    def perm(ref_items, hf_items):
        order = {x.tobytes(): i for i, x in enumerate(ref_items)}
        out = [order.get(x.astype(np.float32).tobytes()) for x in hf_items]
        return None if None in out or len(set(out)) != len(out) else out

    if q.ndim == 2:
        rows = perm(ref, hf_w)
        if rows is not None:
            return q[rows]
        cols = perm(ref.T.copy(), hf_w.T.copy())
        if cols is not None:
            return q[:, cols]
        raise SystemExit(f"{g}: HF rows/columns are not a permutation of the GGUF's")
    if q.ndim == 1:
        elems = perm(ref.reshape(-1, 1), hf_w.reshape(-1, 1))
        if elems is None:
            raise SystemExit(f"{g}: HF values are not a permutation of the GGUF's")
        return q[elems]
    return q


def reference_logits(hf: Path, weights: dict[str, np.ndarray], ids: list[int]) -> tuple[list[list[float]], object, float | None, float]:
    """transformers in fp32 with every weight replaced by the GGUF's dequantized tensor of the same
    shape and rows (llama.cpp may permute q/k rows; each row is matched by its f32 twin)."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(hf)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_pretrained(hf, config=config, torch_dtype=torch.float32)
    model.eval()
    alpha = (getattr(config, "rope_parameters", None) or {}).get("alpha")
    if alpha is not None and getattr(model.model.rotary_emb, "rope_type", None) != "ntk_alpha":
        raise SystemExit(f"transformers did not apply the alpha RoPE ({model.model.rotary_emb.rope_type})")
    arch = getattr(gguf.MODEL_ARCH, ARCH_OF[config.model_type])
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    f32 = gguf_weights_cache["f32"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = gguf_name(names, name)
            if g not in weights:
                raise SystemExit(f"{g} missing from the GGUF")
            q, ref = weights[g], f32[g]
            hf_w = p.detach().numpy()
            # What llama.cpp's converter does to the values (Qwen3.5: ssm_a = −exp(A_log); norms
            # + 1 where the family stores w), so the HF tensor meets its GGUF twin.
            shift = NORM_SHIFT.get(config.model_type, 0.0)
            if not g.endswith("norm.weight") or name.endswith(UNSHIFTED.get(config.model_type, ())):
                shift = 0.0
            if name.endswith("A_log"):
                # In torch, as the converter computes it (bit for bit).
                hf_w = (-torch.exp(p.detach().float())).numpy()
            else:
                hf_w = hf_w + np.float32(shift)
            if hf_w.ndim == 3 and hf_w.shape[1] == 1 and q.ndim == 2:
                # A depthwise conv kernel [C, 1, L]: llama.cpp stores it squeezed to [C, L].
                hf_w = hf_w[:, 0, :]
            if q.shape != hf_w.shape:
                raise SystemExit(f"{g}: GGUF shape {q.shape} vs HF {hf_w.shape}")
            # llama.cpp may permute rows (q/k interleave; Qwen3.5's tiled value-head order), the
            # columns of a value-indexed input (ssm_out) or a per-head vector (ssm_a, ssm_dt):
            # each HF row, column or element is matched to its f32 GGUF twin.
            q = match_order(g, q, ref, hf_w)
            if name.endswith("A_log"):
                q = np.log(-q)
            else:
                q = q - np.float32(shift)
            p.copy_(torch.from_numpy(q.copy()).reshape(p.shape))
        out = model(torch.tensor([ids]), use_cache=False).logits[0]
        logits = [[round(float(x), 6) for x in row] for row in out]
        # What int8 activations cost here: the same model with every linear layer's input
        # quantized to int8 per 32 columns (symmetric, absmax / 127: llama.cpp's Q8_0 activations,
        # and the runtime's), against the fp32 logits.
        def q8(x):
            y = x.reshape(*x.shape[:-1], -1, 32)
            s = y.abs().amax(-1, keepdim=True) / 127
            return (torch.round(y / s.clamp_min(1e-30)) * s).reshape(x.shape)

        hooks = [
            m.register_forward_pre_hook(lambda mod, args: (q8(args[0]),))
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        ]
        int8 = model(torch.tensor([ids]), use_cache=False).logits[0]
        for h in hooks:
            h.remove()
        int8_cost = round(float((int8 - out).abs().max()), 6)
        # How much the RoPE scaling moves these logits (the oracle must exercise it).
        effect = None
        params = dict(getattr(config, "rope_parameters", None) or {})
        if params.get("rope_type", "default") not in ("default", None):
            plain = AutoConfig.from_pretrained(hf)
            plain._attn_implementation = "eager"
            plain.rope_parameters = {"rope_type": "default", "rope_theta": params.get("rope_theta", 10000.0)}
            unscaled = AutoModelForCausalLM.from_config(plain, torch_dtype=torch.float32)
            unscaled.load_state_dict(model.state_dict())
            unscaled.eval()
            other = unscaled(torch.tensor([ids]), use_cache=False).logits[0]
            effect = round(float((other - out).abs().max()), 6)
    return logits, model, effect, int8_cost


def greedy(hf: Path, model, sentence: str) -> dict:
    """Greedy continuation of a translation request rendered by the chat template, with each
    step's top-2 margin."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf)
    content = TRANSLATE.format(sentence)
    prompt = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    seq = tok(prompt, add_special_tokens=False)["input_ids"]
    prompt_ids = list(seq)
    margins = []
    with torch.no_grad():
        for _ in range(GREEDY_STEPS):
            last = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
            top = torch.topk(last, 2)
            margins.append(round(float(top.values[0] - top.values[1]), 6))
            seq.append(int(top.indices[0]))
    return {
        "content": content,
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "ids": seq[len(prompt_ids):],
        "text": tok.decode(seq[len(prompt_ids):]),
        "margins": margins,
    }


ARCH_OF = {c.config["model_type"]: c.arch for c in CASES.values()}
NORM_SHIFT = {c.config["model_type"]: c.norm_shift for c in CASES.values()}
UNSHIFTED = {c.config["model_type"]: c.unshifted for c in CASES.values()}

gguf_weights_cache: dict[str, dict[str, np.ndarray]] = {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--text", type=Path, default=Path(__file__).resolve().parents[2] / "tests/fixtures/text/multilingual.txt")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    sys.path.insert(0, str(a.llama_cpp / "gguf-py"))
    import gguf

    text = a.text.read_text()
    for case in a.cases or list(CASES):
        out = a.out / case
        out.mkdir(parents=True, exist_ok=True)
        cfg, hf = write_hf(case, out, text)
        with tempfile.TemporaryDirectory() as tmp:
            f32 = Path(tmp) / "model-f32.gguf"
            run_converter(a.llama_cpp, hf, f32, CASES[case].pre, CASES[case].converter_args)
            gguf_weights_cache["f32"] = gguf_weights(f32)
            rng = np.random.default_rng(SEED)
            ids = [int(cfg["bos_token_id"])] + [int(x) for x in rng.integers(0, cfg["vocab_size"] - 8, IDS_LEN - 1)]
            ref = {"ids": ids, "logits": {}, "greedy": {}}
            models, effects = {}, []
            ref["int8_activation_cost"] = {}
            ref["logits"]["f32"], models["f32"], e, _ = reference_logits(hf, gguf_weights_cache["f32"], ids)
            effects.append(e)
            for qname, qtype in [("q4_0", gguf.GGMLQuantizationType.Q4_0), ("q4_1", gguf.GGMLQuantizationType.Q4_1)]:
                dest = out / f"model-{qname}.gguf"
                requantize(f32, dest, qtype)
                ref["logits"][qname], models[qname], e, cost = reference_logits(hf, gguf_weights(dest), ids)
                ref["int8_activation_cost"][qname] = cost
                effects.append(e)
            if any(e is not None for e in effects):
                # Max |logits(scaled RoPE) − logits(same weights, unscaled RoPE)|, least over quants.
                ref["rope_scaling_effect"] = min(e for e in effects if e is not None)
            # The first sentence whose greedy steps are clear on the Q4_0 model (the one served
            # end to end); the others' continuations of the same request are recorded beside it.
            for sentence in SENTENCES:
                g = {q: greedy(hf, m, sentence) for q, m in models.items()}
                if min(g["q4_0"]["margins"]) > CLEAR_MARGIN:
                    ref["greedy"] = g
                    break
            else:
                raise SystemExit(f"{case}: no sentence has clear greedy margins")
        # The safetensors are regenerated from the seed; only what the tests read is kept.
        for f in hf.glob("*.safetensors"):
            f.unlink()
        (out / "reference.json").write_text(json.dumps(ref))
        print(f"{case}: {out}")


if __name__ == "__main__":
    main()
