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
    print(json.dumps(sp.EncodeAsIds(text)))


if __name__ == "__main__":
    main()
