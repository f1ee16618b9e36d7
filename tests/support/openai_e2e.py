"""`onebit-pipe serve` through the official `openai` Python client: models, chat (whole and
streamed, through the pack's chat template), completions with a known answer, a wrong API key
and a bad request. Prints one JSON line with what it saw; exits non-zero on the first failure.

usage: openai_e2e.py BASE_URL MODEL API_KEY
"""
import json
import sys
import urllib.request

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

# The sampling fields clients send by default are read: penalties and logit_bias through the
# client's own parameters, llama.cpp's fields through extra_body.
def post(path, body):
    req = urllib.request.Request(base.removesuffix("/v1") + path, json.dumps(body).encode(),
                                 {"Authorization": f"Bearer {key}",
                                  "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)


r = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0.7,
                                   seed=4, presence_penalty=0.5, frequency_penalty=0.5,
                                   logit_bias={"1234": -100},
                                   extra_body={"min_p": 0.1, "typical_p": 0.95,
                                               "repeat_last_n": 64})
assert r.choices[0].message.content, r
# A +100 bias on " Rome" makes it the whole greedy answer; −100 on the greedy first token bans it.
rome = post("/tokenize", {"content": " Rome"})["tokens"]
assert len(rome) == 1, rome
c = client.completions.create(model=model, prompt=question, max_tokens=3, temperature=0,
                              logit_bias={str(rome[0]): 100})
assert c.choices[0].text == " Rome Rome Rome", c
first = post("/tokenize", {"content": seen["completion"]})["tokens"][0]
c = client.completions.create(model=model, prompt=question, max_tokens=1, temperature=0,
                              logit_bias={str(first): -100})
assert post("/tokenize", {"content": c.choices[0].text})["tokens"][0] != first, c
seen["logit_bias"] = c.choices[0].text
props = json.load(urllib.request.urlopen(urllib.request.Request(
    base.removesuffix("/v1") + "/props", headers={"Authorization": f"Bearer {key}"})))
assert props["verification"]["verified"] is True, props
seen["kernel_path"] = props["kernel_path"]

# Log-probabilities in the client's own types, whole and streamed.
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                   logprobs=True, top_logprobs=2)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens or r.choices[0].finish_reason == "stop", r
assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content), content
assert "".join(t.token for t in content).startswith(r.choices[0].message.content[:1]), content
streamed = []
for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=6,
                                            temperature=0, logprobs=True, top_logprobs=2,
                                            stream=True):
    for ch in chunk.choices:
        if ch.logprobs and ch.logprobs.content:
            streamed.extend(ch.logprobs.content)
assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
c = client.completions.create(model=model, prompt=question, max_tokens=4, temperature=0,
                              logprobs=3)
assert len(c.choices[0].logprobs.token_logprobs) == 4, c
seen["logprobs"] = [round(t.logprob, 3) for t in content]

# n choices: one per index, each its own seed stream, the same again for the same seed.
n2 = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=1.0,
                                    seed=11, n=2)
assert [c.index for c in n2.choices] == [0, 1], n2
again = client.chat.completions.create(model=model, messages=msgs, max_tokens=8,
                                       temperature=1.0, seed=11, n=2)
assert [c.message.content for c in again.choices] == [c.message.content for c in n2.choices]
seen["n"] = [c.message.content for c in n2.choices]

# Embeddings: the client asks for base64 by default and decodes it.
emb = client.embeddings.create(model=model, input=["The capital of France", "Paris"])
assert [d.index for d in emb.data] == [0, 1], emb
vs = [d.embedding for d in emb.data]
assert all(abs(sum(x * x for x in v) - 1.0) < 1e-3 for v in vs), "L2-normalized"
seen["embeddings"] = {"dims": len(vs[0]), "cosine": round(sum(a * b for a, b in zip(*vs)), 4)}

# A template without a tool format (Gemma 3): the generic format still gives a valid call.
weather = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
tc = client.chat.completions.create(model=model, messages=msgs, tools=weather, max_tokens=80,
                                    tool_choice="required", parallel_tool_calls=False,
                                    temperature=0)
assert tc.choices[0].finish_reason == "tool_calls", tc
call = tc.choices[0].message.tool_calls[0]
assert call.function.name == "get_weather", call
seen["tool_call"] = json.loads(call.function.arguments)

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
