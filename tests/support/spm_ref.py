"""Independent tokenizer for the tokenizer test: builds a SentencePiece BPE model from a GGUF's
vocabulary (pieces, scores, types via gguf-py) and encodes text with Google's sentencepiece.

usage: spm_ref.py MODEL.gguf TEXT_FILE  -> prints the token ids as a JSON list
"""
import json
import sys

import gguf
from sentencepiece import SentencePieceProcessor
from sentencepiece import sentencepiece_model_pb2 as pb


def main():
    r = gguf.GGUFReader(sys.argv[1])
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    scores = f["tokenizer.ggml.scores"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    prefix = f["tokenizer.ggml.add_space_prefix"].contents() if "tokenizer.ggml.add_space_prefix" in f else True
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(tokens)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = bool(prefix)
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    # GGUF token types use SentencePiece's numbering (1 normal, 2 unknown, 3 control,
    # 4 user-defined, 5 unused, 6 byte).
    for t, s, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece = t
        p.score = float(s)
        p.type = int(ty)
    sp = SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    text = open(sys.argv[2], encoding="utf-8").read()
    # Control and user-defined pieces are matched on the raw text first (longest match), as
    # llama.cpp's tokenizer and Hugging Face's added tokens do; SentencePiece's own normalizer
    # escapes spaces before its user-defined matcher, which would make Gemma's whitespace-run
    # pieces ("  " … 30 spaces, ids 138-165) unreachable. The rest goes through SentencePiece.
    special = sorted(
        ((t, i) for i, (t, ty) in enumerate(zip(tokens, types)) if int(ty) in (3, 4) and t),
        key=lambda p: -len(p[0]),
    )
    ids, plain, i = [], "", 0
    while i < len(text):
        hit = next(((t, tid) for t, tid in special if text.startswith(t, i)), None)
        if hit is None:
            plain += text[i]
            i += 1
            continue
        if plain:
            ids += sp.EncodeAsIds(plain)
            plain = ""
        ids.append(hit[1])
        i += len(hit[0])
    if plain:
        ids += sp.EncodeAsIds(plain)
    print(json.dumps(ids))


if __name__ == "__main__":
    main()
