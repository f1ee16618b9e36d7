#!/usr/bin/env python3
"""Independent oracles for the vision towers FastFlowLM's repositories ship (`vision_weight.q4nx`).

For each case: a tiny random-weight vision-language model made by HF transformers from a config
shaped like the real one (Gemma 3 with a SigLIP tower; Qwen3.5 with its ViT and merger), norms and
biases perturbed away from their defaults so a wrong reading shows; its mmproj GGUF made by
llama.cpp's own `convert_hf_to_gguf.py --mmproj` (the llama.cpp vendored in the
`llama-cpp-python==0.3.36` source package, with its gguf-py), in F16 as llama.cpp publishes them;
the tower file made from that GGUF by FastFlowLM's own converter (`convert.py -t vision`, from a
checkout of FastFlowLM/FLM_Q4NX_Converter; its code is not part of this repository); and, for
Gemma 3, a fixed image, the pixel values transformers' Gemma 3 processor makes of it and the image
features the model's tower and projector give from the weights as the tower file stores them.

Usage (needs torch, transformers, einops, safetensors, pillow, numpy; the outputs are committed,
CI never runs it):

    python scripts/oracle/towers.py --llama-cpp DIR/llama.cpp --flm DIR/FLM_Q4NX_Converter \
        --out tests/fixtures/towers [CASE ...]

Each case writes `tests/fixtures/towers/CASE/`: `hf/config.json` (the model's config as the hub
spells it), `mmproj-f16.gguf`, and `reference.json` (the converter's block geometry; for Gemma 3
the image's pixel values and features, beside `vision_weight.q4nx` itself; for Qwen3.5 the size
and sha256 of the converter's file, which is not kept: 5.6 MB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

SEED = 20261207

# The text side every case shares the dimensions of with tests/fixtures/oracle (the projector's
# output width is the text model's hidden size).
GEMMA3_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 320,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 32,
    "sliding_window": 8,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "max_position_embeddings": 32768,
    "vocab_size": 384,
    "rms_norm_eps": 1e-06,
    "model_type": "gemma3_text",
}


def gemma3_config() -> dict:
    """Gemma 3 4B's shape, shrunk: SigLIP (LayerNorm, GELU-tanh, biases), average pooling of the
    patch grid to `mm_tokens_per_image`, the soft-embedding RMS norm and the input projection.
    Widths 192 and 320 are not multiples of the converter's 256-wide blocks (neither are the real
    model's 1152 and 4304), so the zero padding is exercised."""
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "boi_token_index": 380,
        "eoi_token_index": 381,
        "image_token_index": 382,
        "mm_tokens_per_image": 4,
        "initializer_range": 0.035,
        "torch_dtype": "float32",
        "text_config": GEMMA3_TEXT,
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 192,
            "intermediate_size": 320,
            "num_attention_heads": 3,
            "num_hidden_layers": 2,
            "image_size": 56,
            "patch_size": 14,
            "layer_norm_eps": 1e-06,
            "vision_use_head": False,
            "hidden_act": "gelu_pytorch_tanh",
        },
    }


def gemma3_preprocessor() -> dict:
    """transformers' Gemma 3 processor settings of the real repository, at the tiny image size."""
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": 4,
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": 56, "width": 56},
    }


def perturb(model: torch.nn.Module) -> None:
    """Norm weights 1 + 0.05·N(0,1), biases 0.02·N(0,1), matrices left at zero 0.035·N(0,1): the
    defaults (1 and 0) would hide a misplaced or missing norm, bias or projection."""
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln" in name) and name.endswith("weight"):
                p.copy_(1 + 0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif p.ndim >= 2 and not bool(p.any()):
                # Left at zero by the model's init (Gemma 3's input projection): random like the
                # other projections, or the features would all be zero.
                p.copy_(0.035 * torch.randn(p.shape, generator=g))
            elif "soft_emb_norm" in name:
                # Gemma3RMSNorm multiplies by (1 + w): perturb w around 0.
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def run_converter(llama_cpp: Path, hf: Path, dest: Path) -> None:
    """llama.cpp's convert_hf_to_gguf.py --mmproj, F16 (llama.cpp's published mmproj files)."""
    wrapper = f"""
import sys
sys.path.insert(0, {str(llama_cpp)!r})
sys.path.insert(0, {str(llama_cpp / 'gguf-py')!r})
sys.argv = ['convert_hf_to_gguf.py', {str(hf)!r}, '--mmproj', '--outtype', 'f16', '--outfile', {str(dest)!r}]
import runpy
runpy.run_path({str(llama_cpp / 'convert_hf_to_gguf.py')!r}, run_name='__main__')
"""
    subprocess.run([sys.executable, "-c", wrapper], check=True)


def run_flm(flm: Path, gguf: Path, dest: Path, arch: str) -> None:
    """FastFlowLM's converter, `-t vision`, from its own folder (it reads `configs/` there); it
    always writes `model.q4nx`, which the repositories ship as `vision_weight.q4nx`."""
    # convert.py's `__main__` replaces the command line with a debugging one at this commit
    # (dd0993c), so its conversion function is called as `main()` would.
    call = (
        "import sys; sys.path.insert(0, '.'); from q4nx import create_converter; "
        f"create_converter({str(gguf)!r}, {arch!r}).convert(q4nx_path=sys.argv[1], weights_type='vision')"
    )
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-c", call, out], cwd=flm, check=True)
        shutil.copyfile(Path(out) / "model.q4nx", dest)


def hub_names(path: Path) -> None:
    """Renames the checkpoint's tensors to the hub's spelling (`vision_tower.vision_model.…`, as
    google/gemma-3-4b-it has them and llama.cpp's converter maps them); transformers 5 saves the
    tower without the `vision_model` level."""
    from safetensors.torch import load_file, save_file

    t = load_file(path)
    renamed = {}
    for k, v in t.items():
        if k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model."):
            k = "vision_tower.vision_model." + k[len("vision_tower."):]
        renamed[k] = v.contiguous()
    save_file(renamed, path, metadata={"format": "pt"})


def bf16_weights_from_gguf(path: Path) -> dict[str, torch.Tensor]:
    """The mmproj's tensors as the tower stores them: rounded to bf16 (round to nearest even, as
    torch does), then widened to f32 for the reference computation."""
    import gguf

    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape.tolist())])
        out[t.name] = torch.from_numpy(a).to(torch.bfloat16).to(torch.float32)
    return out


def fixed_image():
    """An 80×60 RGB image with gradients and a block of colour: not square (the processor
    resizes), and different in each channel (a channel-order mix-up shows)."""
    from PIL import Image

    x = np.arange(80)[None, :].repeat(60, 0)
    y = np.arange(60)[:, None].repeat(80, 1)
    rgb = np.stack([(x * 3) % 256, (y * 4) % 256, ((x + y) * 2) % 256], axis=-1).astype(np.uint8)
    rgb[10:30, 20:50] = [200, 30, 90]
    return Image.fromarray(rgb, "RGB")


def gemma3_processor():
    """transformers' Gemma 3 image processor with the tiny tower's settings."""
    from transformers import Gemma3ImageProcessor

    skip = ("image_processor_type", "processor_class", "image_seq_length")
    return Gemma3ImageProcessor(**{k: v for k, v in gemma3_preprocessor().items() if k not in skip})


def load_stored_tower(sd: dict, cfg: dict, mmproj: Path) -> None:
    """The tower's parameters of state dict `sd` as the tower file stores them: the mmproj's
    values rounded to bf16; the soft-embedding norm less the 1 llama.cpp's converter adds."""
    w = bf16_weights_from_gguf(mmproj)
    for gname, h in gguf_to_hf_gemma3(cfg).items():
        v = w[gname]
        if gname == "mm.soft_emb_norm.weight":
            v = v - 1
        sd[h] = v.reshape(sd[h].shape).clone()


def image_features(model, pixels):
    """The projected image features of `pixels` (transformers 5 returns them in an output
    object's `pooler_output`, one tensor per image)."""
    with torch.no_grad():
        feats = model.model.get_image_features(pixel_values=pixels)
    if hasattr(feats, "pooler_output"):
        feats = feats.pooler_output
    if isinstance(feats, (list, tuple)):
        feats = feats[0]
    return feats


def q8(x):
    """Activations as the runtime quantizes them: int8 in blocks of 32, one scale a block."""
    y = x.reshape(*x.shape[:-1], -1, 32)
    s = y.abs().amax(-1, keepdim=True) / 127
    return (torch.round(y / s.clamp_min(1e-30)) * s).reshape(x.shape)


class Int8Activations:
    """Within it, the language model's linear layers (not the tower's) take int8 activations:
    what the runtime's products cost against transformers' f32."""

    def __init__(self, model):
        self.parts = [model.model.language_model, model.lm_head]

    def __enter__(self):
        self.hooks = [
            m.register_forward_pre_hook(lambda mod, args: (q8(args[0]),))
            for part in self.parts for m in part.modules() if isinstance(m, torch.nn.Linear)
        ]

    def __exit__(self, *exc):
        for hk in self.hooks:
            hk.remove()


def gemma3_case(out: Path, llama_cpp: Path, flm: Path) -> None:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(SEED)
    cfg = gemma3_config()
    model = Gemma3ForConditionalGeneration(Gemma3Config(**cfg)).eval()
    perturb(model)
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "hf"
        model.save_pretrained(full)
        hub_names(full / "model.safetensors")
        (full / "preprocessor_config.json").write_text(json.dumps(gemma3_preprocessor(), indent=2))
        run_converter(llama_cpp, full, out / "mmproj-f16.gguf")
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (hf / "preprocessor_config.json").write_text(json.dumps(gemma3_preprocessor(), indent=2) + "\n")
    run_flm(flm, out / "mmproj-f16.gguf", out / "vision_weight.q4nx", "gemma3")

    # The reference: the tower and projector of transformers on the weights as the tower stores
    # them (the mmproj's F16 values rounded to bf16).
    sd = model.state_dict()
    load_stored_tower(sd, cfg, out / "mmproj-f16.gguf")
    model.load_state_dict(sd)
    image = fixed_image()
    image.save(out / "image.png")
    proc = gemma3_processor()
    pixels = proc(images=image, return_tensors="pt")["pixel_values"]
    feats = image_features(model, pixels)
    ref = {
        "family": "gemma3",
        "converter": {"vision_MM_K": 256, "vision_MM_N": 64},
        "image": "image.png",
        "pixel_values_shape": list(pixels.shape),
        "pixel_values": [round(float(x), 6) for x in pixels.flatten()],
        "features_shape": list(feats.shape),
        "features": [round(float(x), 6) for x in feats.flatten()],
    }
    (out / "reference.json").write_text(json.dumps(ref) + "\n")


def gguf_to_hf_gemma3(cfg: dict) -> dict[str, str]:
    """The mmproj's tensor names and the transformers parameters they come from (llama.cpp's
    MMPROJ name table, for the tensors a Gemma 3 tower has)."""
    v = "model.vision_tower"
    m = {
        "v.patch_embd.weight": f"{v}.embeddings.patch_embedding.weight",
        "v.patch_embd.bias": f"{v}.embeddings.patch_embedding.bias",
        "v.position_embd.weight": f"{v}.embeddings.position_embedding.weight",
        "v.post_ln.weight": f"{v}.post_layernorm.weight",
        "v.post_ln.bias": f"{v}.post_layernorm.bias",
        "mm.input_projection.weight": "model.multi_modal_projector.mm_input_projection_weight",
        "mm.soft_emb_norm.weight": "model.multi_modal_projector.mm_soft_emb_norm.weight",
    }
    per = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_out": "self_attn.out_proj",
        "ffn_up": "mlp.fc1",
        "ffn_down": "mlp.fc2",
        "ln1": "layer_norm1",
        "ln2": "layer_norm2",
    }
    for i in range(cfg["vision_config"]["num_hidden_layers"]):
        for g, h in per.items():
            for s in ("weight", "bias"):
                m[f"v.blk.{i}.{g}.{s}"] = f"{v}.encoder.layers.{i}.{h}.{s}"
    return m


def qwen35_config() -> dict:
    """Qwen3.5 2B's shape, shrunk: the ViT (16-pixel patches, two frames per temporal patch,
    2 × 2 merge, learned positions on a 4 × 4 grid) and the merger into the text model of the
    `qwen35` oracle (hidden 128). FastFlowLM converts a 2B's tower in 512 × 64 blocks: every
    width here (128, 320, 384, 512) pads to 512, so the file stays a few megabytes."""
    sys.path.insert(0, str(Path(__file__).parent))
    from generate import qwen35_config as text

    t = text()
    t.pop("architectures", None)
    t["model_type"] = "qwen3_5_text"
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 380,
        "video_token_id": 381,
        "vision_start_token_id": 382,
        "vision_end_token_id": 383,
        "tie_word_embeddings": True,
        "text_config": t,
        "vision_config": {
            "model_type": "qwen3_5",
            "deepstack_visual_indexes": [],
            "depth": 2,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 128,
            "in_channels": 3,
            "initializer_range": 0.035,
            "intermediate_size": 320,
            "num_heads": 2,
            "num_position_embeddings": 16,
            "out_hidden_size": t["hidden_size"],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }


def qwen35_preprocessor() -> dict:
    """Qwen's image processor settings (Qwen3.5's repositories), small images."""
    return {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": 2,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "size": {"longest_edge": 16384, "shortest_edge": 4096},
    }


def qwen35_case(out: Path, llama_cpp: Path, flm: Path) -> None:
    """The tower only (its mmproj and FastFlowLM's file, as a 2B's): Qwen3.5's images are not
    served yet, so no image reference."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(SEED + 2)
    cfg = qwen35_config()
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**cfg)).eval()
    perturb(model)
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "hf"
        model.save_pretrained(full)
        (full / "preprocessor_config.json").write_text(json.dumps(qwen35_preprocessor(), indent=2))
        run_converter(llama_cpp, full, out / "mmproj-f16.gguf")
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # The converter's file is 5.6 MB (every width pads to 512): its size and sha256 are kept, and
    # the test checks that ours, written from the same mmproj, is that file.
    import hashlib

    with tempfile.TemporaryDirectory() as tmp:
        tower = Path(tmp) / "vision_weight.q4nx"
        run_flm(flm, out / "mmproj-f16.gguf", tower, "qwen3.5-2B")
        data = tower.read_bytes()
    ref = {
        "family": "qwen35",
        "converter": {"vision_MM_K": 512, "vision_MM_N": 64},
        "flm_vision_weight": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    }
    (out / "reference.json").write_text(json.dumps(ref) + "\n")


# The Gemma 3 image case's prompt: text, the image's full sequence as the processor writes it
# (start, `mm_tokens_per_image` soft tokens, end), more text; 16 ids, longer than the sliding
# window of 8, so later rows see the image only through the rows after it.
GEMMA3_SPECIALS = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_image>", "<end_of_image>", "<image_soft_token>",
]


def gemma3_image_case(out: Path, llama_cpp: Path, flm: Path) -> None:
    """The language model beside the tower, and logits with an image in the prompt.

    The same tiny Gemma 3 (the tower's weights loaded from the committed mmproj, so the case does
    not depend on rebuilding it bit for bit) with a toy SentencePiece vocabulary carrying Gemma's
    image tokens; its text GGUF made by llama.cpp's converter and requantized to Q4_0 by gguf-py
    (scripts/oracle/generate.py's code); the logits transformers computes at every position of a
    prompt holding the image, from the text weights as the Q4_0 GGUF dequantizes them and the
    tower's as it stores them, with the image's tokens attending to each other both ways as Gemma 3
    does; and what that bidirectional attention moves (the same run with a causal mask only)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gguf
    import generate as g
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(SEED)
    cfg = gemma3_config()
    text = (Path(__file__).resolve().parents[2] / "tests/fixtures/text/multilingual.txt").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        hf.mkdir()
        n, ids_of = g.toy_sentencepiece(text, GEMMA3_SPECIALS, cfg["text_config"]["vocab_size"], hf)
        assert n == cfg["text_config"]["vocab_size"], n
        cfg["boi_token_index"] = ids_of["<start_of_image>"]
        cfg["eoi_token_index"] = ids_of["<end_of_image>"]
        cfg["image_token_index"] = ids_of["<image_soft_token>"]
        model = Gemma3ForConditionalGeneration(Gemma3Config(**cfg)).eval()
        perturb(model)
        model.save_pretrained(hf)
        hub_names(hf / "model.safetensors")
        # As google/gemma-3-4b-it has them: the turn markers special (CONTROL in the GGUF), the
        # image tokens added tokens that are not special (USER_DEFINED, as the real Gemma 3
        # GGUFs carry `<start_of_image>`).
        turns = ["<start_of_turn>", "<end_of_turn>"]
        (hf / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
            "pad_token": "<pad>", "add_bos_token": True, "clean_up_tokenization_spaces": False,
            "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>",
            "added_tokens_decoder": {str(ids_of[t]): {"content": t, "special": True} for t in turns},
        }))
        images = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
        (hf / "added_tokens.json").write_text(json.dumps({t: ids_of[t] for t in images}))
        f32 = Path(tmp) / "model-f32.gguf"
        g.run_converter(llama_cpp, hf, f32, "default")
        dest = out / "model-q4_0.gguf"
        g.requantize(f32, dest, gguf.GGMLQuantizationType.Q4_0)
        f32w, q4w = g.gguf_weights(f32), g.gguf_weights(dest)
    (out / "hf" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    # The tower as it is stored (the committed mmproj, bf16).
    sd = model.state_dict()
    load_stored_tower(sd, cfg, out / "mmproj-f16.gguf")
    # The language model as the Q4_0 GGUF dequantizes it (norms stored as 1 + w).
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, cfg["text_config"]["num_hidden_layers"])
    for name in list(sd):
        if not name.startswith("model.language_model."):
            continue
        gname = g.gguf_name(names, "model." + name[len("model.language_model."):])
        q, ref, hf_w = q4w[gname], f32w[gname], sd[name].numpy()
        shift = np.float32(1.0) if gname.endswith("norm.weight") else np.float32(0.0)
        q = g.match_order(gname, q, ref, hf_w + shift) - shift
        sd[name] = torch.from_numpy(q.copy()).reshape(sd[name].shape)
    sd["lm_head.weight"] = sd["model.language_model.embed_tokens.weight"]
    model.load_state_dict(sd)
    model.config._attn_implementation = "eager"
    model.config.text_config._attn_implementation = "eager"

    boi, eoi, img = cfg["boi_token_index"], cfg["eoi_token_index"], cfg["image_token_index"]
    tokens = cfg["mm_tokens_per_image"]
    rng = np.random.default_rng(SEED)
    words = [int(x) for x in rng.integers(12, cfg["text_config"]["vocab_size"] - 8, 9)]
    ids = [2, 4] + words[:3] + [boi] + [img] * tokens + [eoi] + words[3:]
    image = fixed_image()
    proc = gemma3_processor()
    pixels = proc(images=image, return_tensors="pt")["pixel_values"]
    input_ids = torch.tensor([ids])
    types = (input_ids == img).long()
    with torch.no_grad():
        logits = model(input_ids=input_ids, pixel_values=pixels, token_type_ids=types, use_cache=False).logits[0]
        causal = model(input_ids=input_ids, pixel_values=pixels, use_cache=False).logits[0]
        with Int8Activations(model):
            int8 = model(input_ids=input_ids, pixel_values=pixels, token_type_ids=types, use_cache=False).logits[0]
    ref = {
        "family": "gemma3",
        "tokens": {"start_of_image": boi, "end_of_image": eoi, "image_soft_token": img},
        "ids": ids,
        "image_start": ids.index(img),
        "image_tokens": tokens,
        "logits": [[round(float(x), 6) for x in row] for row in logits],
        "int8_activation_cost": round(float((int8 - logits).abs().max()), 6),
        "bidirectional_effect": round(float((causal - logits).abs().max()), 6),
    }
    (out / "image_reference.json").write_text(json.dumps(ref) + "\n")


def gemma3_4b_tower_case(out: Path, llama_cpp: Path, flm: Path) -> None:
    """Gemma 3 4B's tower at its real shape, random (SigLIP: 27 layers of width 1152 and FFN 4304,
    16 heads, 896×896 pixels in 14-pixel patches, pooled to 256 tokens projected to the text width
    2560), as llama.cpp's converter writes its mmproj: `mmproj-f16.gguf`, about 0.8 GB, never
    committed. scripts/mtmd-compare.py runs it beside a random text GGUF at the same model's shape
    (scripts/random-gguf.py) against llama.cpp's mtmd. The text half here is only what the
    converter needs to size the projector (one layer of width 2560, a tiny vocabulary); the mmproj
    holds none of it."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(SEED)
    cfg = gemma3_config()
    cfg["mm_tokens_per_image"] = 256
    cfg["initializer_range"] = 0.02
    cfg["text_config"] = dict(GEMMA3_TEXT, hidden_size=2560, intermediate_size=256, num_hidden_layers=1)
    cfg["vision_config"] = dict(
        cfg["vision_config"], hidden_size=1152, intermediate_size=4304, num_attention_heads=16,
        num_hidden_layers=27, image_size=896,
    )
    model = Gemma3ForConditionalGeneration(Gemma3Config(**cfg)).eval()
    perturb(model)
    out.mkdir(parents=True, exist_ok=True)
    pre = dict(gemma3_preprocessor(), image_seq_length=256, size={"height": 896, "width": 896})
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "hf"
        model.save_pretrained(full)
        del model
        hub_names(full / "model.safetensors")
        (full / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
        run_converter(llama_cpp, full, out / "mmproj-f16.gguf")


def sizes_images() -> dict:
    """Images of several sizes and aspect ratios for the Gemma 3 processor: the tower's own
    square (no resize), wide and tall ones, one smaller than the tower (upscaled) and one much
    larger (downscaled), each with its own pattern so a mix-up of two shows."""
    from PIL import Image

    def pattern(w: int, h: int, seed: int) -> Image.Image:
        x = np.arange(w)[None, :].repeat(h, 0)
        y = np.arange(h)[:, None].repeat(w, 1)
        rgb = np.stack([(x * (3 + seed)) % 256, (y * (5 - seed)) % 256, ((x + 2 * y) * (seed + 1)) % 256], axis=-1)
        rgb = rgb.astype(np.uint8)
        rgb[h // 4: h // 2, w // 3: w // 2] = [30 * seed % 256, 200, 90]
        return Image.fromarray(rgb, "RGB")

    return {
        "square-56": pattern(56, 56, 1),
        "wide-200x50": pattern(200, 50, 2),
        "tall-37x120": pattern(37, 120, 3),
        "small-20x15": pattern(20, 15, 4),
        "large-640x480": pattern(640, 480, 0),
    }


def gemma3_sizes_case(out: Path, llama_cpp: Path, flm: Path) -> None:
    """The committed tiny Gemma 3 (its tower from `mmproj-f16.gguf` as the tower stores it, its
    language half from `model-q4_0.gguf` as it dequantizes) on images of several sizes and
    aspect ratios (`sizes/*.png`): for each, the processor's pixel values, transformers' image
    features and the logits at the last position of `image_reference.json`'s prompt with the
    image in it, and what int8 activations into the language model's products cost there.
    Checked first: the same model reproduces `image_reference.json`'s logits for its image."""
    import gguf
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import generate as g

    cfg = json.loads((out / "hf" / "config.json").read_text())
    model = Gemma3ForConditionalGeneration(Gemma3Config(**cfg)).eval()
    sd = model.state_dict()
    load_stored_tower(sd, cfg, out / "mmproj-f16.gguf")
    q4w = g.gguf_weights(out / "model-q4_0.gguf")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, cfg["text_config"]["num_hidden_layers"])
    for name in list(sd):
        if not name.startswith("model.language_model."):
            continue
        gname = g.gguf_name(names, "model." + name[len("model.language_model."):])
        # llama.cpp's converter keeps Gemma 3's rows in order and stores norms as 1 + w.
        shift = np.float32(1.0) if gname.endswith("norm.weight") else np.float32(0.0)
        sd[name] = torch.from_numpy((q4w[gname] - shift).copy()).reshape(sd[name].shape)
    sd["lm_head.weight"] = sd["model.language_model.embed_tokens.weight"]
    model.load_state_dict(sd)
    model.config._attn_implementation = "eager"
    model.config.text_config._attn_implementation = "eager"

    ref = json.loads((out / "image_reference.json").read_text())
    ids = ref["ids"]
    input_ids = torch.tensor([ids])
    types = (input_ids == cfg["image_token_index"]).long()
    proc = gemma3_processor()

    def run(image, int8: bool = False):
        pixels = proc(images=image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            if int8:
                with Int8Activations(model):
                    logits = model(input_ids=input_ids, pixel_values=pixels, token_type_ids=types, use_cache=False).logits[0]
            else:
                logits = model(input_ids=input_ids, pixel_values=pixels, token_type_ids=types, use_cache=False).logits[0]
        return pixels, image_features(model, pixels), logits

    _, _, logits = run(fixed_image())
    check = float((logits - torch.tensor(ref["logits"])).abs().max())
    assert check < 1e-4, f"the committed model does not reproduce image_reference.json: {check}"

    (out / "sizes").mkdir(exist_ok=True)
    rows = []
    for name, image in sizes_images().items():
        image.save(out / "sizes" / f"{name}.png")
        pixels, feats, logits = run(image)
        _, _, int8 = run(image, int8=True)
        rows.append({
            "file": f"sizes/{name}.png",
            "size": list(image.size),
            "pixel_values": [round(float(x), 6) for x in pixels.flatten()],
            "features": [round(float(x), 6) for x in feats.flatten()],
            "last_logits": [round(float(x), 6) for x in logits[-1]],
            "int8_activation_cost": round(float((int8[-1] - logits[-1]).abs().max()), 6),
        })
    (out / "sizes.json").write_text(json.dumps({"ids": ids, "reproduces_image_reference": check, "images": rows}) + "\n")


def bf16(x):
    """`x` rounded to bf16 (to nearest even, as torch and the runtime's bf16 products round)."""
    return x.to(torch.bfloat16).to(torch.float32)


class Bf16Operands:
    """Within it, every product of the tower and projector takes bf16 operands and sums in f32,
    as the runtime's `Precision::Bf16` does: the inputs of the patch convolution, the linear
    layers and the input projection rounded (their weights already are); attention's scaled
    queries, keys, unnormalized probabilities and values rounded, the division by the sum after
    the product. Norms, softmax's exponentials, GELU and the residual stream stay f32."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        import transformers.models.siglip.modeling_siglip as siglip

        tower = self.model.model.vision_tower
        proj = self.model.model.multi_modal_projector
        round_in = lambda mod, args: (bf16(args[0]),) + tuple(args[1:])
        self.hooks = [
            m.register_forward_pre_hook(round_in)
            for m in tower.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
        ]
        self.hooks.append(proj.mm_soft_emb_norm.register_forward_hook(lambda mod, args, out: bf16(out)))
        self.eager = siglip.eager_attention_forward

        def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
            s = torch.matmul(bf16(query * scaling), bf16(key).transpose(-1, -2))
            if attention_mask is not None:
                s = s + attention_mask
            e = torch.exp(s - s.amax(-1, keepdim=True))
            out = torch.matmul(bf16(e), bf16(value)) / e.sum(-1, keepdim=True)
            return out.transpose(1, 2).contiguous(), None

        siglip.eager_attention_forward = attention
        return self

    def __exit__(self, *exc):
        import transformers.models.siglip.modeling_siglip as siglip

        siglip.eager_attention_forward = self.eager
        for hk in self.hooks:
            hk.remove()


def gemma3_bf16_case(out: Path, llama_cpp: Path, flm: Path) -> None:
    """The committed tiny Gemma 3 tower (from `mmproj-f16.gguf` as the tower stores it) on the
    fixed image and the sizes images, with bf16 operands in every product (`Bf16Operands`):
    the features, and what the rounding costs against the f32 features `reference.json` and
    `sizes.json` hold (checked first to be reproduced in f32)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    cfg = json.loads((out / "hf" / "config.json").read_text())
    model = Gemma3ForConditionalGeneration(Gemma3Config(**cfg)).eval()
    sd = model.state_dict()
    load_stored_tower(sd, cfg, out / "mmproj-f16.gguf")
    model.load_state_dict(sd)
    model.config.vision_config._attn_implementation = "eager"

    def features(pixels):
        return image_features(model, pixels).flatten()

    ref = json.loads((out / "reference.json").read_text())
    sizes = json.loads((out / "sizes.json").read_text())
    shape = ref["pixel_values_shape"]
    cases = [("image.png", ref["pixel_values"], ref["features"])]
    cases += [(r["file"], r["pixel_values"], r["features"]) for r in sizes["images"]]
    rows = []
    for name, pv, want in cases:
        pixels = torch.tensor(pv, dtype=torch.float32).reshape(shape)
        f32 = features(pixels)
        check = float((f32 - torch.tensor(want)).abs().max())
        assert check < 1e-5, f"{name}: the committed tower does not reproduce its f32 features: {check}"
        with Bf16Operands(model):
            b = features(pixels)
        rows.append({
            "file": name,
            "features": [round(float(x), 6) for x in b],
            "cost_max_abs": round(float((b - f32).abs().max()), 6),
            "cost_rel_rms": round(float((b - f32).norm() / f32.norm()), 7),
        })
    (out / "bf16.json").write_text(json.dumps({"images": rows}) + "\n")


CASES = {"gemma3": gemma3_case, "gemma3-image": gemma3_image_case, "qwen35": qwen35_case, "gemma3-4b-tower": gemma3_4b_tower_case, "gemma3-sizes": gemma3_sizes_case, "gemma3-bf16": gemma3_bf16_case}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-cpp", type=Path, required=True)
    p.add_argument("--flm", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    # The real-shape tower is large and never committed: only when named.
    p.add_argument("cases", nargs="*", default=[c for c in CASES if c != "gemma3-4b-tower"])
    a = p.parse_args()
    sys.path.insert(0, str(a.llama_cpp / "gguf-py"))
    for case in a.cases:
        # The image, sizes and bf16 cases add their files to the Gemma 3 tower's folder.
        CASES[case](a.out / case.removesuffix("-image").removesuffix("-sizes").removesuffix("-bf16"), a.llama_cpp, a.flm)


if __name__ == "__main__":
    main()
