#!/usr/bin/env python3
"""Our image path against llama.cpp's multimodal library (mtmd) on the same GGUF, mmproj and image.

Both sides get the same prompt ids (mtmd's own tokenization: the text before the image, the
image's tokens, the text after) and the same image file. Each writes the projected image features,
the logits after the whole prompt and a greedy continuation; this script prints how far apart they
are and the time each took to encode the image, alternating the two sides `--rounds` times.

    python scripts/mtmd-compare.py --gguf MODEL.gguf --mmproj MMPROJ.gguf --image A.png [--image B.jpg] \
        [--llama-cpp SRC] [--threads 2] [--predict 8] [--json OUT.json]

Steps: llama.cpp's `mtmd` library and scripts/oracle/mtmd_logits.cpp built in SRC (default: the
native build of scripts/llama-cpp.sh); the GGUF and mmproj converted (`onebit-pipe convert
--mmproj`), imported and verified (`onebit-pipe run --reference --mmproj`) into a scratch home;
`cargo run --release --example image_logits` on the pack. Needs numpy. The real-shape case of
docs/towers.md: a random Gemma 3 4B (scripts/random-gguf.py with `--template
tests/fixtures/towers/gemma3`) and its random tower at the real shape (scripts/oracle/towers.py
gemma3-4b-tower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def sh(cmd: list, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def build_tool(src: Path) -> Path:
    """libmtmd and the reference tool, linked statically against the tree's build."""
    build = src / "build"
    sh(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target", "mtmd", "llama-mtmd-cli"])
    tool = build / "bin" / "mtmd-logits"
    source = ROOT / "scripts" / "oracle" / "mtmd_logits.cpp"
    if not tool.exists() or tool.stat().st_mtime < source.stat().st_mtime:
        # In one link group, so their order does not matter.
        libs = [build / "tools/mtmd/libmtmd.a", build / "src/libllama.a"]
        libs += sorted((build / "ggml/src").rglob("libggml*.a"))
        libs += sorted((build / "vendor").rglob("libvendor-*.a"))
        sh(["g++", "-O2", "-std=c++17", source, f"-I{src}/include", f"-I{src}/ggml/include",
            f"-I{src}/tools/mtmd", "-Wl,--start-group", *libs, "-Wl,--end-group",
            "-fopenmp", "-lpthread", "-ldl", "-o", tool])
    return tool


def import_pack(gguf: Path, mmproj: Path, home: Path, work: Path) -> Path:
    exe = ROOT / "target" / "release" / "onebit-pipe"
    sh(["cargo", "build", "--release", "--bin", "onebit-pipe", "--example", "image_logits"], cwd=ROOT)
    repo = work / "repo"
    sh([exe, "convert", "--gguf", gguf, "--mmproj", mmproj, "--out", repo])
    sh([exe, "run", "--home", home, "--path", repo, "--reference", gguf, "--mmproj", mmproj, "-q"])
    # The repack stage's output: the one `pack/` folder of the scratch home's store.
    packs = sorted({m.parent for m in home.rglob("pack/manifest.json")})
    if len(packs) != 1:
        sys.exit(f"expected one pack under {home}, found {packs}")
    return packs[0]


def f32(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.float32)


def kld(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(P || Q) of the softmaxes, P llama.cpp's."""
    p = p_logits - p_logits.max()
    q = q_logits - q_logits.max()
    lp = p - np.log(np.exp(p).sum())
    lq = q - np.log(np.exp(q).sum())
    return float((np.exp(lp) * (lp - lq)).sum())


def gemma3_encoder_flop(mmproj: Path, src: Path) -> float:
    """Multiply-adds × 2 of one image through a Gemma 3 (SigLIP) tower and its projector, from the
    mmproj's metadata: patch embedding, per layer the four attention projections, the two score
    products and the two FFN matrices, then the projection of the pooled tokens."""
    sys.path.insert(0, str(src / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(mmproj)

    def val(k):
        f = r.fields[k]
        return int(f.parts[f.data[0]][0])

    d, f, layers = val("clip.vision.embedding_length"), val("clip.vision.feed_forward_length"), val("clip.vision.block_count")
    size, patch = val("clip.vision.image_size"), val("clip.vision.patch_size")
    proj = next(t for t in r.tensors if t.name == "mm.input_projection.weight")
    out = int(max(proj.shape))
    p = (size // patch) ** 2
    per_layer = 2 * p * (4 * d * d + 2 * d * f) + 2 * 2 * p * p * d
    pooled = p // 16
    return 2 * p * 3 * patch * patch * d + layers * per_layer + 2 * pooled * d * out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--mmproj", type=Path, required=True)
    ap.add_argument("--image", type=Path, action="append", required=True)
    ap.add_argument("--llama-cpp", type=Path, help="a llama.cpp source tree with build/ [default: scripts/llama-cpp.sh native]")
    ap.add_argument("--prompt", default="Describe this image.\n\n<__media__>\n\nIt shows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--predict", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the two sides (timing)")
    ap.add_argument("--fa", default="auto", help="llama.cpp's flash attention: on, off or auto")
    ap.add_argument("--home", type=Path, help="where the pack is imported [default: a scratch folder]")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    a = ap.parse_args()

    src = a.llama_cpp
    if src is None:
        bin_dir = subprocess.run([ROOT / "scripts" / "llama-cpp.sh", "native"], check=True,
                                 capture_output=True, text=True).stdout.strip()
        src = Path(bin_dir).parent.parent
    tool = build_tool(src)
    flop = gemma3_encoder_flop(a.mmproj, src)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pack = import_pack(a.gguf, a.mmproj, a.home or work / "home", work)
        env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
        example = ROOT / "target" / "release" / "examples" / "image_logits"
        for image in a.image:
            runs = {"mtmd_ms": [], "ours_ms": []}
            for r in range(a.rounds):
                theirs, ours = work / f"theirs-{r}", work / f"ours-{r}"
                theirs.mkdir(exist_ok=True)
                ours.mkdir(exist_ok=True)
                sh([tool, a.gguf, a.mmproj, image, a.prompt, a.predict, a.threads, theirs, a.fa],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                sh([example, pack, image, theirs, ours, a.predict], env=env)
                t = json.loads((theirs / "tokens.json").read_text())
                o = json.loads((ours / "ours.json").read_text())
                runs["mtmd_ms"].append(t["encode_ms"])
                runs["ours_ms"].append(o["encode_ms"])
            ft, fo = f32(theirs / "features.f32"), f32(ours / "features.f32")
            lt, lo = f32(theirs / "logits.f32"), f32(ours / "logits.f32")
            n = min(len(lt), len(lo))
            row = {
                "image": image.name,
                "image_tokens": t["image_tokens"],
                "prompt_tokens": o["prompt_tokens"],
                "features_max_abs": float(np.abs(ft - fo).max()),
                "features_rel_rms": float(np.sqrt(((ft - fo) ** 2).mean() / (ft**2).mean())),
                "features_cosine": float(ft @ fo / np.linalg.norm(ft) / np.linalg.norm(fo)),
                "logits_max_abs": float(np.abs(lt[:n] - lo[:n]).max()),
                "logits_range": float(lt.max() - lt.min()),
                "kld": kld(lt[:n], lo[:n]),
                "same_top": int(np.argmax(lt)) == int(np.argmax(lo)),
                "greedy_mtmd": t["greedy"],
                "greedy_ours": o["greedy"],
                "same_greedy": t["greedy"] == o["greedy"],
                "encode_ms_mtmd": runs["mtmd_ms"],
                "encode_ms_ours": runs["ours_ms"],
                "gflop": flop / 1e9,
                "gflops_mtmd": flop / 1e6 / float(np.median(runs["mtmd_ms"])),
                "gflops_ours": flop / 1e6 / float(np.median(runs["ours_ms"])),
                "speedup": float(np.median(runs["mtmd_ms"]) / np.median(runs["ours_ms"])),
                "threads": a.threads,
                "flash_attn": a.fa,
            }
            results.append(row)
            print(json.dumps(row))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
