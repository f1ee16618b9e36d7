"""Ollama's Python client (PyPI `ollama`) against `onebit-pipe serve` serving the store's packs.

Usage: ollama_e2e.py URL CHAT_MODEL OTHER_MODEL. Prints one JSON object: what each call gave,
for the Rust test to check (the client itself raising is a failure).
"""
import json
import sys

import ollama

url, chat_model, other = sys.argv[1:4]
c = ollama.Client(host=url)
out = {}
out["list"] = sorted(m.model for m in c.list().models)
r = c.chat(model=chat_model, messages=[{"role": "user", "content": "hello"}],
           options={"num_predict": 6, "temperature": 0})
out["chat"] = {"content": r.message.content, "done_reason": r.done_reason,
               "eval_count": r.eval_count, "prompt_eval_count": r.prompt_eval_count,
               "model": r.model, "created_at": str(r.created_at)}
parts = list(c.chat(model=chat_model, messages=[{"role": "user", "content": "hello"}],
                    options={"num_predict": 6, "temperature": 0}, stream=True))
out["chat_stream"] = {"content": "".join(p.message.content for p in parts),
                      "parts": len(parts), "last_done": parts[-1].done,
                      "others_done": any(p.done for p in parts[:-1])}
g = c.generate(model=other, prompt="hello", raw=True, options={"num_predict": 5, "temperature": 0})
out["generate"] = {"response": g.response, "done_reason": g.done_reason, "eval_count": g.eval_count}
e = c.embed(model=other, input=["a b", "c"])
out["embed"] = {"n": len(e.embeddings), "dim": len(e.embeddings[0]),
                "norm": sum(x * x for x in e.embeddings[0])}
out["ps"] = sorted(m.model for m in c.ps().models)
s = c.show(chat_model)
out["show"] = {"capabilities": list(s.capabilities or []), "template": bool(s.template)}
j = c.chat(model=chat_model, messages=[{"role": "user", "content": "hello"}], format="json",
           options={"num_predict": 24, "temperature": 0})
out["json_format"] = j.message.content
errors = {}
for name, call in {
    "unknown_model": lambda: c.chat(model="nope", messages=[{"role": "user", "content": "x"}]),
    "unknown_option": lambda: c.chat(model=chat_model, messages=[{"role": "user", "content": "x"}],
                                     options={"mirostat": 1}),
}.items():
    try:
        call()
        errors[name] = None
    except ollama.ResponseError as ex:
        errors[name] = {"status": ex.status_code, "error": ex.error}
out["errors"] = errors
print(json.dumps(out))
