#!/usr/bin/env python3
"""Token ids by llama.cpp for every pre-tokenizer its vocabulary code knows.

Writes, into --out (tests/fixtures/pretokenizers):
- vocab-bytelevel.gguf: a byte-level BPE vocabulary trained on text.txt with no pre-tokenizer,
  so its merges cross every boundary a pre-tokenizer draws: a pre-tokenizer that splits
  differently gives different ids;
- vocab-raw.gguf: the same for the pre-tokenizers that work on raw UTF-8 (no byte-level
  encoding; spaces escaped as U+2581 where llama.cpp escapes them), with <0xXX> byte tokens;
- expected.json: for every name in src/llama-vocab.cpp, the vocabulary and the text it was run
  with and the ids `llama-tokenize --ids --no-bos --no-escape -f TEXT` printed;
- text-single-spaced.txt: text.txt with each whitespace run cut to its first character, for the
  one pre-tokenizer on which llama.cpp aborts at runs of whitespace (SINGLE_SPACED).

The names are read from llama.cpp's own source, so the list is the vendored version's list.
Needs: tokenizers and gguf-py (from the same llama.cpp) in the running Python, and a built
`llama-tokenize` (scripts/bench-gemma.sh builds llama.cpp; `--target llama-tokenize`).

    python scripts/oracle/pretokenizers.py --llama-cpp ~/.cache/onebit-models/llama.cpp \
        --out tests/fixtures/pretokenizers
"""

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import gguf
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

# Pre-tokenizer types that skip GPT-2's byte-level encoding (byte_encode = false in
# llm_tokenizer_bpe), with whether llama.cpp escapes spaces as U+2581 before splitting.
RAW = {"gemma4": True, "granite-embed-multi-311m": True, "sarvam-moe": True, "whitespace": False}

# llama.cpp aborts (GGML_ASSERT in find_bpe_rank: a merge side with a space) when the whitespace
# pre-tokenizer leaves a run of two or more whitespace characters as one piece: that name runs on
# the text with every whitespace run cut to its first character.
SINGLE_SPACED = {"whitespace"}

BYTELEVEL_VOCAB = 1200

# Whole words added to the byte-level vocabulary (when its merges do not already make them), so
# that llama.cpp's `ignore_merges` (a piece that is itself a token is taken whole) shows in the ids.
WHOLE_WORDS = [" world", " test", " right", " symbols", " newlines", " Größe", " dash", " comment", "Hello"]
RAW_VOCAB = 900


def known_names(llama_cpp: Path) -> list[str]:
    src = (llama_cpp / "src" / "llama-vocab.cpp").read_text()
    # Every name the BPE branch of llama_vocab::impl::load compares tokenizer_pre with.
    names = re.findall(r'tokenizer_pre == "([^"]+)"', src)
    return sorted(set(names))


def train_bytelevel(text: str):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BYTELEVEL_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer)
    tokens, merges = vocab_and_merges(tok, [])
    byte_map = dict(zip(range(256), bytes_to_unicode()))
    for w in WHOLE_WORDS:
        enc = "".join(byte_map[b] for b in w.encode("utf-8"))
        if enc not in tokens:
            tokens.append(enc)
    return tokens, merges


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character map, indexed by byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def train_raw(text: str):
    # Lines without their newlines: no merge holds a newline (llama.cpp's merge table cannot).
    escaped = text.replace(" ", "\u2581")
    lines = [line for line in escaped.split("\n") if line]
    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=RAW_VOCAB, show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    return vocab_and_merges(tok, byte_tokens)


def vocab_and_merges(tok: Tokenizer, leading: list[str]):
    model = json.loads(tok.to_str())["model"]
    trained = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = leading + [t for t, _ in trained if t not in leading]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_vocab(path: Path, tokens, merges, pre: str, byte_tokens: int):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    types = [gguf.TokenType.BYTE if i < byte_tokens else gguf.TokenType.NORMAL for i in range(len(tokens))]
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_tokenize(binary: Path, model: Path, text_file: Path) -> list[int]:
    out = subprocess.run(
        [str(binary), "-m", str(model), "-f", str(text_file), "--ids", "--no-bos", "--no-escape", "--log-disable"],
        check=True, capture_output=True, text=True,
    ).stdout
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp tree with build/bin/llama-tokenize")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    binary = args.llama_cpp / "build" / "bin" / "llama-tokenize"
    text_file = args.out / "text.txt"
    text = text_file.read_bytes().decode("utf-8")

    vocabs = {"bytelevel": train_bytelevel(text), "raw": train_raw(text)}
    for kind, (tokens, merges) in vocabs.items():
        write_vocab(args.out / f"vocab-{kind}.gguf", tokens, merges, "default", 256 if kind == "raw" else 0)

    single = args.out / "text-single-spaced.txt"
    single.write_bytes(re.sub(r"(\s)\s+", r"\1", text).encode("utf-8"))

    expected = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in known_names(args.llama_cpp):
            kind = "raw" if name in RAW else "bytelevel"
            tokens, merges = vocabs[kind]
            model = Path(tmp) / "vocab.gguf"
            write_vocab(model, tokens, merges, name, 256 if kind == "raw" else 0)
            source = single if name in SINGLE_SPACED else text_file
            expected[name] = {
                "vocab": kind,
                "text": source.name,
                "ids": llama_tokenize(binary, model, source),
            }
            print(f"{name:28} {kind:9} {len(expected[name]['ids'])} tokens")

    version = (args.llama_cpp / "vendor_version.txt")
    doc = {
        "generator": "scripts/oracle/pretokenizers.py",
        "llama_cpp": version.read_text().strip() if version.exists() else "llama-cpp-python 0.3.36 vendor/llama.cpp",
        "command": "llama-tokenize -m vocab.gguf -f text.txt --ids --no-bos --no-escape",
        "names": expected,
    }
    # One line per name: reviewable diffs, small file.
    names = ",\n".join(f"  {json.dumps(n)}: {json.dumps(v, separators=(',', ':'))}" for n, v in expected.items())
    head = json.dumps({k: v for k, v in doc.items() if k != "names"}, indent=1, ensure_ascii=False)[:-2]
    (args.out / "expected.json").write_text(f"{head},\n \"names\": {{\n{names}\n }}\n}}\n")


if __name__ == "__main__":
    main()
