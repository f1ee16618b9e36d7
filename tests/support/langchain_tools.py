"""A tool round trip through an agent framework (LangChain's OpenAI integration) against
`onebit-pipe serve`: the model is made to call a Python tool (`tool_choice="required"`), whole and
streamed, LangChain runs the tool, and its result goes back for the model's final answer. Prints
one JSON line with what it saw; exits non-zero on the first failure.

usage: langchain_tools.py BASE_URL MODEL API_KEY
"""
import json
import sys

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

base, model, key = sys.argv[1:4]
seen = {}


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})


llm = ChatOpenAI(base_url=base, api_key=key, model=model, temperature=0, max_tokens=120,
                 max_retries=0, seed=1)
forced = llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
msgs = [HumanMessage("What is the weather in Paris?")]

ai = forced.invoke(msgs)
assert isinstance(ai, AIMessage), ai
assert ai.tool_calls, ai
call = ai.tool_calls[0]
assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str), call
assert call["id"], call
seen["call"] = {"name": call["name"], "args": call["args"]}

# Streamed: the chunks add up to the same kind of call.
merged = None
for chunk in forced.stream(msgs):
    merged = chunk if merged is None else merged + chunk
assert merged is not None and merged.tool_calls, merged
assert merged.tool_calls[0]["name"] == "get_weather", merged.tool_calls
seen["streamed_call"] = merged.tool_calls[0]["args"]

# LangChain runs the tool; its result goes back with the call, and the model answers.
result = get_weather.invoke(call)
assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"], result
final = llm.bind_tools([get_weather]).invoke(msgs + [ai, result])
assert isinstance(final, AIMessage), final
assert isinstance(final.content, str), final
assert final.content or final.tool_calls, final
seen["final"] = final.content if final.content else {"calls": len(final.tool_calls)}
print(json.dumps(seen))
