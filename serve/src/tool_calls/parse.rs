//! Reading tool calls from a finished answer, per format. A call that does not parse leaves the
//! answer as text: the client then sees what the model wrote, never a call we guessed.

use serde_json::{Map, Value};

use super::{Call, Format, Output, Tool, pythonic};

/// The calls in `text` (a whole answer) in `format`; `tools` give the parameter types that
/// [`Format::QwenXml`]'s untyped values are read by.
pub fn parse_calls(format: Format, text: &str, tools: &[Tool]) -> Output {
    if format == Format::Generic {
        return super::generic::parse(text);
    }
    let Some(at) = super::call_start(format, text) else {
        return plain(text);
    };
    let calls = match format {
        Format::Hermes => tagged(&text[at..], "<tool_call>", "</tool_call>", |body| {
            json_call(body.trim())
        }),
        Format::QwenXml => tagged(&text[at..], "<tool_call>", "</tool_call>", |body| {
            xml_call(body, tools)
        }),
        Format::Hunyuan => {
            let inner = between(&text[at..], "<tool_calls>", "</tool_calls>");
            tagged(inner, "<tool_call>", "</tool_call>", hunyuan_call)
        }
        Format::Lfm2 => {
            let inner = between(&text[at..], "<|tool_call_start|>", "<|tool_call_end|>").trim();
            match serde_json::from_str::<Value>(inner) {
                Ok(v) => json_list(&v),
                Err(_) => pythonic::calls(inner),
            }
        }
        Format::Mistral => {
            let inner = text[at..].trim_start_matches("[TOOL_CALLS]").trim();
            serde_json::from_str::<Value>(inner)
                .ok()
                .and_then(|v| json_list(&v))
        }
        Format::Generic => None,
        Format::Llama3 => {
            let body = text[at..].trim_start_matches("<|python_tag|>").trim();
            // One call, or several separated by `;` (Llama 3.2's habit).
            body.split(';')
                .map(|c| json_call(c.trim()))
                .collect::<Option<Vec<Call>>>()
        }
    };
    match calls {
        Some(calls) if !calls.is_empty() => Output {
            content: text[..at].trim().to_string(),
            calls,
        },
        _ => plain(text),
    }
}

fn plain(text: &str) -> Output {
    Output {
        content: text.to_string(),
        calls: Vec::new(),
    }
}

/// The text after `open` up to `close` (or the end, when the answer stopped before it).
fn between<'a>(text: &'a str, open: &str, close: &str) -> &'a str {
    let rest = text.find(open).map_or(text, |i| &text[i + open.len()..]);
    rest.find(close).map_or(rest, |j| &rest[..j])
}

/// Every `open … close` block of `text` read by `one`; `None` when any block fails. Text between
/// blocks must be blank. A last block cut off by the token budget is dropped when calls came
/// before it (the answer then ends for `length`, with the calls that were complete).
fn tagged(
    text: &str,
    open: &str,
    close: &str,
    one: impl Fn(&str) -> Option<Call>,
) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some(body) = rest.strip_prefix(open) else {
            // A cut-off opening tag after complete calls.
            return (!calls.is_empty() && open.starts_with(rest)).then_some(calls);
        };
        let (inner, after) = match body.find(close) {
            Some(j) => (&body[..j], &body[j + close.len()..]),
            None => (body, ""),
        };
        match one(inner) {
            Some(c) => calls.push(c),
            None if after.is_empty() && !calls.is_empty() => break,
            None => return None,
        }
        rest = after.trim();
    }
    Some(calls)
}

/// `{"name": …, "arguments"|"parameters": {…}}`.
fn json_call(s: &str) -> Option<Call> {
    let v: Value = serde_json::from_str(s).ok()?;
    call_of(&v)
}

fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    // Some models write the arguments as a JSON string.
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok()?,
        other => other,
    };
    args.is_object().then(|| Call {
        name,
        arguments: args.to_string(),
    })
}

/// A JSON array of calls (or one call).
fn json_list(v: &Value) -> Option<Vec<Call>> {
    match v {
        Value::Array(a) => a.iter().map(call_of).collect(),
        other => call_of(other).map(|c| vec![c]),
    }
}

/// `NAME\n```json\n{…}\n```` (Hunyuan).
fn hunyuan_call(body: &str) -> Option<Call> {
    let body = body.trim();
    let (name, rest) = body.split_once('\n')?;
    let json = rest
        .trim()
        .strip_prefix("```json")
        .or_else(|| rest.trim().strip_prefix("```"))?
        .trim()
        .strip_suffix("```")?
        .trim();
    let args: Value = serde_json::from_str(json).ok()?;
    args.is_object().then(|| Call {
        name: name.trim().to_string(),
        arguments: args.to_string(),
    })
}

/// `<function=NAME>` and its `<parameter=P>\nV\n</parameter>` blocks (Qwen XML). A value is a
/// string when its parameter's schema says so (or the value is not JSON), else JSON.
fn xml_call(body: &str, tools: &[Tool]) -> Option<Call> {
    let body = body.trim();
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let schema = tools
        .iter()
        .find(|t| t.name == name)
        .map(|t| &t.parameters["properties"]);
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.starts_with("</function>") || rest.is_empty() {
            break;
        }
        let p = rest.strip_prefix("<parameter=")?;
        let (key, after) = p.split_once('>')?;
        let end = after.find("</parameter>")?;
        let raw = after[..end].strip_prefix('\n').unwrap_or(&after[..end]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let is_string = schema
            .and_then(|s| s.get(key))
            .and_then(|s| s.get("type"))
            .is_some_and(|t| t == "string");
        let value = if is_string {
            Value::String(raw.to_string())
        } else {
            serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
        };
        args.insert(key.to_string(), value);
        rest = &after[end + "</parameter>".len()..];
    }
    Some(Call {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
