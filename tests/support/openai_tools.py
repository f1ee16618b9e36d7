"""Tool calls and structured outputs through the official `openai` Python client, against
`onebit-pipe serve`: a forced call (`tool_choice: "required"`, whole and streamed), a named
function, the tool's result sent back for the final answer, the 400 for a missing function, and
a pydantic model parsed from a `response_format` answer (`chat.completions.parse`). Prints one
JSON line with what it saw; exits non-zero on the first failure.

usage: openai_tools.py BASE_URL
"""
import json
import sys

import openai
import pydantic

base = sys.argv[1]
client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
model = client.models.list().data[0].id
seen = {}

tools = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone.",
        "parameters": {"type": "object", "properties": {
            "zone": {"enum": ["UTC", "CET", "JST"]}},
            "required": ["zone"], "additionalProperties": False}}},
]
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call, name=None):
    assert call.type == "function", call
    assert call.id, call
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert isinstance(args["city"], str) and len(args["city"]) <= 12, args
        assert 1 <= args["days"] <= 7, args
    else:
        assert call.function.name == "get_time", call
        assert args["zone"] in ("UTC", "CET", "JST"), args
    assert name is None or call.function.name == name, (call, name)
    return {"name": call.function.name, "arguments": args}


# Forced: a call valid for its function's schema.
r = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=200,
                                   tool_choice="required", parallel_tool_calls=False,
                                   temperature=0)
c = r.choices[0]
assert c.finish_reason == "tool_calls", r
assert len(c.message.tool_calls) == 1, r
seen["required"] = [check_call(t) for t in c.message.tool_calls]

# Forced, parallel: one or more calls; a random model may go on calling until the budget ends,
# and every complete call comes back.
rp = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=120,
                                    tool_choice="required", temperature=0)
assert rp.choices[0].finish_reason in ("tool_calls", "length"), rp
assert rp.choices[0].message.tool_calls, rp
seen["parallel"] = [check_call(t) for t in rp.choices[0].message.tool_calls]

# Named, streamed: the deltas assemble into the same kind of call.
stream = client.chat.completions.create(
    model=model, messages=msgs, tools=tools, max_tokens=200, temperature=0, stream=True,
    tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
calls, finish = {}, None
for chunk in stream:
    d = chunk.choices[0].delta
    for t in d.tool_calls or []:
        slot = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
        slot["id"] = t.id or slot["id"]
        slot["name"] += t.function.name or ""
        slot["arguments"] += t.function.arguments or ""
    finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls", finish
assert len(calls) == 1, calls
call = calls[0]
assert call["name"] == "get_time" and json.loads(call["arguments"])["zone"] in ("UTC", "CET", "JST"), call
seen["named_stream"] = call

# The round trip: the assistant's call and the tool's result go back; the model answers.
first = c.message.tool_calls[0]
msgs2 = msgs + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": first.id, "type": "function",
         "function": {"name": first.function.name, "arguments": first.function.arguments}}]},
    {"role": "tool", "tool_call_id": first.id, "content": json.dumps({"sky": "sunny", "c": 21})},
]
r2 = client.chat.completions.create(model=model, messages=msgs2, tools=tools, tool_choice="none",
                                    max_tokens=16, temperature=0)
assert r2.choices[0].finish_reason in ("stop", "length"), r2
assert r2.choices[0].message.tool_calls is None, r2
assert r2.usage.prompt_tokens > r.usage.prompt_tokens, (r.usage, r2.usage)
seen["answer"] = r2.choices[0].message.content

# Auto: whatever the model writes comes back as text or as calls that parse.
r3 = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=40,
                                    temperature=0)
m3 = r3.choices[0].message
if m3.tool_calls:
    assert r3.choices[0].finish_reason == "tool_calls", r3
    for t in m3.tool_calls:
        json.loads(t.function.arguments)
else:
    assert isinstance(m3.content, str), r3
seen["auto"] = {"content": m3.content, "calls": len(m3.tool_calls or [])}

# Refused by name.
try:
    client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=4,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    raise SystemExit("a missing function was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice", e.body
    seen["missing_function"] = e.body["message"]

# Structured outputs the client's own way: a pydantic model as the response format.
class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    days: int = pydantic.Field(ge=1, le=7)
    sunny: bool


p = client.chat.completions.parse(model=model, messages=msgs, response_format=Forecast,
                                  max_tokens=200, temperature=0)
f = p.choices[0].message.parsed
assert isinstance(f, Forecast), p
seen["parsed"] = f.model_dump()

print(json.dumps(seen))
