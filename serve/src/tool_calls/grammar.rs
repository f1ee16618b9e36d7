//! The grammar of a forced tool call (`tool_choice: "required"` or a named function): the
//! format's own wrapping around each offered function's name and an arguments object that
//! matches its parameter schema, as a Lark grammar for [`onebit_runtime::grammar`]. The answer is then
//! always a call that parses, to a function that exists, with arguments of the right shape.
//!
//! Arguments are JSON in every format but two: Qwen's XML writes each parameter as its own
//! element (strings bare, on one line; other types as JSON), and LFM2's forced calls are written
//! as a JSON list inside its call tags, which its reader accepts beside Python-style calls.

use serde_json::{Value, json};

use super::{Format, Tool};
use onebit_runtime::grammar::engine_schema;

/// A Lark grammar for one call (or, with `parallel`, one or more) to any of `tools` in `format`.
pub fn forced_grammar(format: Format, tools: &[Tool], parallel: bool) -> String {
    if format == Format::Generic {
        return super::generic::grammar(tools, true, parallel);
    }
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let args = |t: &Tool| {
        let schema = match &t.parameters {
            Value::Object(o) if !o.is_empty() => engine_schema(&t.parameters),
            _ => engine_schema(&json!({"type": "object"})),
        };
        format!("%json {schema}")
    };
    let mut rules = Vec::new();
    let alts: Vec<String> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let body = match format {
                Format::Hermes => format!(
                    "{} {} {}",
                    q(&format!(
                        "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                        q(&t.name)
                    )),
                    args(t),
                    q("}\n</tool_call>")
                ),
                Format::QwenXml => {
                    let mut s = q(&format!("<tool_call>\n<function={}>\n", t.name));
                    let props = t.parameters["properties"].as_object();
                    let required: Vec<&str> = t.parameters["required"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    for (k, p) in props.into_iter().flatten() {
                        let value = if p["type"] == "string" {
                            bare_string(p)
                        } else {
                            format!("%json {}", engine_schema(p))
                        };
                        let one = format!(
                            "{} {value} {}",
                            q(&format!("<parameter={k}>\n")),
                            q("\n</parameter>\n")
                        );
                        if required.contains(&k.as_str()) {
                            s.push_str(&format!(" {one}"));
                        } else {
                            s.push_str(&format!(" ({one})?"));
                        }
                    }
                    s.push_str(&format!(" {}", q("</function>\n</tool_call>")));
                    s
                }
                Format::Hunyuan => format!(
                    "{} {} {}",
                    q(&format!("<tool_call>{}\n```json\n", t.name)),
                    args(t),
                    q("\n```</tool_call>")
                ),
                Format::Lfm2 | Format::Mistral => format!(
                    "{} {} {}",
                    q(&format!("{{\"name\": {}, \"arguments\": ", q(&t.name))),
                    args(t),
                    q("}")
                ),
                Format::Llama3 | Format::Generic => format!(
                    "{} {} {}",
                    q(&format!("{{\"name\": {}, \"parameters\": ", q(&t.name))),
                    args(t),
                    q("}")
                ),
            };
            rules.push(format!("call_{i}: {body}"));
            format!("call_{i}")
        })
        .collect();
    let (open, sep, close) = match format {
        Format::Hermes | Format::QwenXml => ("", "\n", ""),
        Format::Hunyuan => ("<tool_calls>", "", "</tool_calls>"),
        Format::Lfm2 => ("<|tool_call_start|>[", ", ", "]<|tool_call_end|>"),
        Format::Mistral => ("[TOOL_CALLS][", ", ", "]"),
        Format::Llama3 | Format::Generic => ("", "; ", ""),
    };
    let more = if parallel {
        format!(" ({} call)*", q(sep))
    } else {
        String::new()
    };
    let mut g = format!("start: {} call{more} {}\n", q(open), q(close));
    g.push_str(&format!("call: {}\n", alts.join(" | ")));
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    g
}

/// A Qwen XML parameter's string value, written bare on one line: one of its `enum` values, or
/// text without `<` or a line break, as long as its `minLength`/`maxLength` allow (a `pattern` is
/// used as the regex when given).
fn bare_string(p: &Value) -> String {
    if let Some(e) = p["enum"].as_array() {
        let alts: Vec<String> = e
            .iter()
            .filter_map(Value::as_str)
            .map(|s| serde_json::to_string(s).unwrap_or_default())
            .collect();
        if !alts.is_empty() {
            return format!("({})", alts.join(" | "));
        }
    }
    if let Some(pat) = p["pattern"].as_str() {
        let pat = pat.trim_start_matches('^').trim_end_matches('$');
        return format!("/{}/", pat.replace('/', "\\/"));
    }
    let min = p["minLength"].as_u64().unwrap_or(0);
    match p["maxLength"].as_u64() {
        Some(max) => format!("/[^<\\n]{{{min},{max}}}/"),
        None => format!("/[^<\\n]{{{min},}}/"),
    }
}
