#!/usr/bin/env python3
"""Image files in every format the server takes, and the RGB bytes Pillow decodes them to.

transformers' Gemma 3 processor reads images through Pillow (`PIL.Image.open(...).convert("RGB")`),
so Pillow's decoding is the reference for ours: the tower oracle's image (tests/fixtures/towers/
gemma3/image.png) written by Pillow as JPEG (quality 90, 4:2:0 chroma), lossy and lossless WebP,
and a GIF of two frames (the first is the image, quantized to 256 colours; the second differs, so a
decoder that reads past the first frame shows), each with the base64 of Pillow's RGB decoding.

Usage (needs Pillow; the outputs are committed, CI never runs it):

    python scripts/oracle/images.py --out tests/fixtures/images
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
from pathlib import Path

from PIL import Image, features


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[2]
    src = Image.open(root / "tests/fixtures/towers/gemma3/image.png").convert("RGB")
    a.out.mkdir(parents=True, exist_ok=True)
    files = {
        "image.jpg": lambda p: src.save(p, "JPEG", quality=90, subsampling=2),
        "image-lossy.webp": lambda p: src.save(p, "WEBP", quality=80),
        "image-lossless.webp": lambda p: src.save(p, "WEBP", lossless=True),
        "image.gif": lambda p: src.quantize(256).save(
            p, "GIF", save_all=True, append_images=[src.rotate(180).quantize(256)], duration=100
        ),
    }
    ref = {"pillow": Image.__version__, "libjpeg_turbo": features.version("libjpeg_turbo"),
           "libwebp": features.version("webp"), "files": {}}
    for name, write in files.items():
        path = a.out / name
        write(path)
        rgb = Image.open(path).convert("RGB")
        data = rgb.tobytes()
        ref["files"][name] = {
            "width": rgb.width,
            "height": rgb.height,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "rgb": base64.b64encode(data).decode(),
        }
    (a.out / "decoded.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
