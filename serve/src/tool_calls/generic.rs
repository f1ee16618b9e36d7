//! The generic tool-call format, for chat templates that render no tool format of their own
//! (Gemma 3, most base models), as llama.cpp's server offers one: the tools are described in a
//! system message, and the answer is held by grammar to one JSON object, either
//! `{"tool_calls": [{"name": …, "arguments": {…}}]}` or `{"response": "…"}`.
//!
//! Such a template knows no `tool` role and no assistant `tool_calls` either (Gemma 3's raises
//! on any role outside user/assistant alternation), so a conversation's earlier calls are written
//! as the assistant's JSON content, and tool results as user messages holding
//! `{"tool_response": {"name": …, "id": …, "content": …}}`; consecutive messages of one role are
//! joined, so the turns still alternate.

use serde_json::{Value, json};

use super::{Call, Output, Tool};
use onebit_runtime::grammar::engine_schema;
use onebit_runtime::text::Message;

/// How a generic answer may use the tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// It calls them or answers (`tool_choice: auto`).
    May,
    /// It calls them (`required`, or a named function).
    Must,
    /// It answers in text (`none`): the tools are described, since the conversation may hold
    /// calls to them.
    Not,
}

/// The system text that describes `tools` (OpenAI's `tools` entries) and the answer's shape.
pub fn system_text(tools: &[Value], usage: Use) -> String {
    let listed = serde_json::to_string_pretty(tools).unwrap_or_default();
    let call = "{\"tool_calls\": [{\"name\": <a tool's name>, \"arguments\": {<its parameters>}}]}";
    match usage {
        Use::Must => format!(
            "You can call the following tools:\n{listed}\n\n\
             Respond with one JSON object that calls tools: {call}."
        ),
        Use::May => format!(
            "You can call the following tools:\n{listed}\n\n\
             Respond with one JSON object, either to call tools: {call}, \
             or to answer the user: {{\"response\": \"<your answer>\"}}."
        ),
        Use::Not => format!(
            "These tools were offered in this conversation:\n{listed}\n\n\
             No tool can be called now: answer the user in text."
        ),
    }
}

/// `messages` as a template without a tool format can render them: `system` (the tools'
/// description, when tools are offered) added to the first system message or put before the
/// conversation, calls as JSON content, tool results as user messages, one role's consecutive
/// messages joined.
pub fn polyfill(messages: &[Message], system: Option<&str>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    if let Some(s) = system {
        match messages.first() {
            Some(m) if m.role == "system" => {}
            _ => out.push(plain("system", s.to_string())),
        }
    }
    for (i, m) in messages.iter().enumerate() {
        let mut m = match m.role.as_str() {
            "system" if i == 0 && system.is_some() => {
                let s = system.unwrap_or_default();
                plain("system", join(&m.content, s))
            }
            "assistant" => match &m.tool_calls {
                Some(Value::Array(calls)) if !calls.is_empty() => {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            json!({
                                "name": c.pointer("/function/name").cloned().unwrap_or(Value::Null),
                                "arguments": c.pointer("/function/arguments").cloned()
                                    .unwrap_or_else(|| json!({})),
                            })
                        })
                        .collect();
                    let call = json!({"tool_calls": calls}).to_string();
                    plain("assistant", join(&m.content, &call))
                }
                _ => plain("assistant", m.content.clone()),
            },
            "tool" => {
                let content = serde_json::from_str::<Value>(&m.content)
                    .unwrap_or_else(|_| Value::String(m.content.clone()));
                let mut r = json!({"content": content});
                if let Some(n) = &m.name {
                    r["name"] = json!(n);
                }
                if let Some(id) = &m.tool_call_id {
                    r["id"] = json!(id);
                }
                plain("user", json!({ "tool_response": r }).to_string())
            }
            _ => plain(&m.role, m.content.clone()),
        };
        match out.last_mut() {
            Some(last) if last.role == m.role && m.role != "system" => {
                last.content = join(&last.content, &std::mem::take(&mut m.content));
            }
            _ => out.push(m),
        }
    }
    out
}

/// Whether `messages` hold anything [`polyfill`] must rewrite for a template without a tool
/// format (a tool result, or an assistant's calls).
pub fn needs_polyfill(messages: &[Message]) -> bool {
    messages.iter().any(|m| {
        m.role == "tool" || matches!(&m.tool_calls, Some(Value::Array(a)) if !a.is_empty())
    })
}

fn plain(role: &str, content: String) -> Message {
    Message {
        role: role.to_string(),
        content,
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}\n\n{b}"),
    }
}

/// The Lark grammar of a generic answer: calls to `tools` (at most one unless `parallel`), or,
/// unless `must_call`, a `response` string. Keys come in this order (`name` before `arguments`),
/// which a JSON schema's object (its keys sorted) would not keep.
pub fn grammar(tools: &[Tool], must_call: bool, parallel: bool) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut rules = Vec::new();
    let alts: Vec<String> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let schema = match &t.parameters {
                Value::Object(o) if !o.is_empty() => engine_schema(&t.parameters),
                _ => engine_schema(&json!({"type": "object"})),
            };
            rules.push(format!(
                "call_{i}: {} %json {schema} {}",
                q(&format!("{{\"name\": {}, \"arguments\": ", q(&t.name))),
                q("}")
            ));
            format!("call_{i}")
        })
        .collect();
    let more = if parallel {
        format!(" ({} call)*", q(", "))
    } else {
        String::new()
    };
    let calls = format!("{} call{more} {}", q("{\"tool_calls\": ["), q("]}"));
    let start = if must_call {
        calls
    } else {
        let text = engine_schema(&json!({"type": "string"}));
        format!("{calls} | {} %json {text} {}", q("{\"response\": "), q("}"))
    };
    let mut g = format!("start: {start}\ncall: {}\n", alts.join(" | "));
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    g
}

/// A generic answer read: its calls, or its `response` as the content. An answer cut off by the
/// token budget keeps the calls it completed; anything else (not JSON) stays text as written.
pub fn parse(text: &str) -> Output {
    let plain = || Output {
        content: text.to_string(),
        calls: Vec::new(),
    };
    let calls = match serde_json::from_str::<Value>(text.trim()) {
        Ok(v) => {
            if let Some(r) = v.get("response").and_then(Value::as_str) {
                return Output {
                    content: r.to_string(),
                    calls: Vec::new(),
                };
            }
            v.get("tool_calls")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(call).collect())
                .unwrap_or_default()
        }
        Err(_) => complete_calls(text),
    };
    if calls.is_empty() {
        return plain();
    }
    Output {
        content: String::new(),
        calls,
    }
}

fn call(c: &Value) -> Option<Call> {
    let name = c.get("name")?.as_str()?.to_string();
    let args = c.get("arguments").cloned().unwrap_or_else(|| json!({}));
    args.is_object().then(|| Call {
        name,
        arguments: args.to_string(),
    })
}

/// The complete calls at the start of a `tool_calls` list that was cut off.
fn complete_calls(text: &str) -> Vec<Call> {
    let Some(mut rest) = text
        .trim_start()
        .strip_prefix('{')
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix("\"tool_calls\""))
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix(':'))
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix('['))
    else {
        return Vec::new();
    };
    let mut calls = Vec::new();
    loop {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(v)) = values.next() else {
            return calls;
        };
        match call(&v) {
            Some(c) => calls.push(c),
            None => return calls,
        }
        rest = rest[values.byte_offset()..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None => return calls,
        }
    }
}

#[cfg(test)]
#[path = "generic_tests.rs"]
mod tests;
