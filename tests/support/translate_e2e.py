"""A translation request to `onebit-pipe serve` through the official `openai` Python client:
one user turn (Hy-MT's translation prompt), greedy, whole and streamed. Prints one JSON line with
what it saw; exits non-zero on the first failure.

usage: translate_e2e.py BASE_URL MODEL CONTENT MAX_TOKENS
"""
import json
import sys

import openai

base, model, content, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
assert [m.id for m in client.models.list().data] == [model]
msgs = [{"role": "user", "content": content}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0)
whole = r.choices[0].message.content
assert r.choices[0].message.role == "assistant", r
pieces = []
for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens,
                                            temperature=0, stream=True):
    for ch in chunk.choices:
        if ch.delta.content:
            pieces.append(ch.delta.content)
assert "".join(pieces) == whole, (pieces, whole)
print(json.dumps({"content": whole, "prompt_tokens": r.usage.prompt_tokens,
                  "completion_tokens": r.usage.completion_tokens,
                  "finish_reason": r.choices[0].finish_reason}))
