"""`onebit-pipe serve` through the official `openai` Python client: models, chat (whole and
streamed, through the pack's chat template), completions with a known answer, a wrong API key
and a bad request. Prints one JSON line with what it saw; exits non-zero on the first failure.

usage: openai_e2e.py BASE_URL MODEL API_KEY
"""
import json
import sys

import openai

base, model, key = sys.argv[1:4]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)
seen = {}

ids = [m.id for m in client.models.list().data]
assert ids == [model], ids

question = "What is the capital of France?"
# Completions, greedy: the base model's known continuation.
c = client.completions.create(model=model, prompt=question, max_tokens=16, temperature=0)
seen["completion"] = c.choices[0].text
assert "Paris" in c.choices[0].text, c
assert c.usage.completion_tokens == 16 or c.choices[0].finish_reason == "stop", c
raw_prompt_tokens = c.usage.prompt_tokens

# Chat, whole: the template wraps the question, so the prompt is longer than the raw text.
msgs = [{"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": question}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
msg = r.choices[0].message
assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content, r
assert r.usage.prompt_tokens > raw_prompt_tokens + 5, (r.usage, raw_prompt_tokens)
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage
assert r.choices[0].finish_reason in ("stop", "length"), r
seen["chat"] = msg.content
seen["chat_prompt_tokens"] = r.usage.prompt_tokens

# Chat, streamed: the same text in pieces, one finish_reason, usage at the end.
pieces, finish, usage = [], None, None
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0,
                                        stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        if ch.delta.content:
            pieces.append(ch.delta.content)
        if ch.finish_reason:
            finish = ch.finish_reason
assert "".join(pieces) == msg.content, (pieces, msg.content)
assert finish == r.choices[0].finish_reason and usage is not None, (finish, usage)
assert usage.completion_tokens == r.usage.completion_tokens, usage
seen["stream_pieces"] = len(pieces)

# A wrong key is a 401 the client recognizes.
bad = openai.OpenAI(base_url=base, api_key="not-the-key", max_retries=0)
try:
    bad.completions.create(model=model, prompt="x", max_tokens=1)
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e
    seen["wrong_key"] = e.status_code

# A bad request is a 400 naming the field.
try:
    client.chat.completions.create(model=model, messages=msgs, max_tokens=-1)
    raise AssertionError("max_tokens=-1 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.body.get("param") == "max_tokens", e.body
    seen["bad_request"] = e.body
try:
    client.chat.completions.create(model=model, messages=[{"role": "oracle", "content": "x"}])
    raise AssertionError("an unknown role was accepted")
except openai.BadRequestError as e:
    assert e.body.get("param") == "messages[0].role", e.body

print(json.dumps(seen))
