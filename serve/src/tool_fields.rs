//! `tools`, `tool_choice` and `parallel_tool_calls` on `/v1/chat/completions`, and the message
//! fields a tool conversation carries (an assistant's `tool_calls`, a `tool` message's
//! `tool_call_id`). What the model does with them is in [`crate::tool_calls`].

use serde_json::{Map, Value};

use super::error::ApiError;
use super::values::Fields;
use crate::tool_calls::{Format, Tool, generic};
use onebit_runtime::generate::Prompt;
use onebit_runtime::text::Text;

/// How the model may call the tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// It decides (`auto`, the default): its answer is read for calls.
    Auto,
    /// It answers in text (`none`): the tools are still rendered (the conversation may hold
    /// earlier calls to them), and the answer is not read for calls.
    None,
    /// It must call one or more (`required`): the answer is held to the call grammar.
    Required,
    /// It must call this function.
    Named(String),
}

/// The tools a request offers and how they may be called.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// The functions, as the model's template renders them (OpenAI's `tools` entries).
    pub raw: Vec<Value>,
    /// Their names and parameter schemas.
    pub tools: Vec<Tool>,
    /// `tool_choice`.
    pub choice: Choice,
    /// `parallel_tool_calls` (default true): more than one call in one answer.
    pub parallel: bool,
}

/// The request's tools; `None` without tools.
pub(crate) fn tool_request(b: &Fields) -> Result<Option<ToolRequest>, ApiError> {
    let list = match b.get("tools") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(ApiError::bad(
                "tools",
                format!("'tools' must be an array, got {v}"),
            ));
        }
    };
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let field = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::bad(
                format!("{field}.type"),
                "only tools of type 'function' are supported",
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ApiError::bad(
                    format!("{field}.function"),
                    "each tool needs a 'function' object",
                )
            })?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| {
                !n.is_empty()
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            })
            .ok_or_else(|| {
                ApiError::bad(
                    format!("{field}.function.name"),
                    "a function needs a name of letters, digits, '_', '-' or '.'",
                )
            })?;
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(ApiError::bad(
                format!("{field}.function.name"),
                format!("two tools are named '{name}'"),
            ));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(p) => {
                return Err(ApiError::bad(
                    format!("{field}.function.parameters"),
                    format!("'parameters' must be a JSON schema object, got {p}"),
                ));
            }
        };
        tools.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    let choice = match b.get("tool_choice") {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "none" => Choice::None,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("unknown tool_choice '{other}' (auto, none, required, or a function)"),
                ));
            }
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(n) if v.get("type").and_then(Value::as_str) == Some("function") => {
                Choice::Named(n.to_string())
            }
            _ => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!(
                        "tool_choice must be auto, none, required or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {v}"
                    ),
                ));
            }
        },
    };
    if let Choice::Named(n) = &choice
        && !tools.iter().any(|t| &t.name == n)
    {
        return Err(ApiError::bad(
            "tool_choice",
            format!("tool_choice names '{n}', which is not among the tools"),
        ));
    }
    let parallel = match b.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(p)) => *p,
        Some(v) => {
            return Err(ApiError::bad(
                "parallel_tool_calls",
                format!("'parallel_tool_calls' must be a boolean, got {v}"),
            ));
        }
    };
    if tools.is_empty() {
        return match choice {
            Choice::Auto | Choice::None => Ok(None),
            _ => Err(ApiError::bad(
                "tool_choice",
                "tool_choice asks for a call, but no tools were given",
            )),
        };
    }
    Ok(Some(ToolRequest {
        raw: list.clone(),
        tools,
        choice,
        parallel,
    }))
}

/// An assistant message's `tool_calls`, each function's `arguments` read from its JSON text into
/// an object (templates write them with `tojson`, as transformers expects).
pub fn message_tool_calls(i: usize, m: &Value) -> Result<Option<Value>, ApiError> {
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(ApiError::bad(
                format!("messages[{i}].tool_calls"),
                format!("'tool_calls' must be an array, got {v}"),
            ));
        }
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let field = format!("messages[{i}].tool_calls[{j}]");
        let name = c.pointer("/function/name").and_then(Value::as_str);
        let args = match c.pointer("/function/arguments") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                ApiError::bad(
                    format!("{field}.function.arguments"),
                    format!("the arguments are not JSON: {e}"),
                )
            })?,
            Some(v @ Value::Object(_)) => v.clone(),
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(v) => {
                return Err(ApiError::bad(
                    format!("{field}.function.arguments"),
                    format!("'arguments' must be a JSON string, got {v}"),
                ));
            }
        };
        let Some(name) = name else {
            return Err(ApiError::bad(
                format!("{field}.function.name"),
                "each tool call needs a function name",
            ));
        };
        let mut c = c.clone();
        c["type"] = Value::from("function");
        c["function"] = serde_json::json!({"name": name, "arguments": args});
        out.push(c);
    }
    Ok(Some(Value::Array(out)))
}

/// How a request's tool calls are read and, when forced, held to their grammar.
pub struct ToolPlan {
    /// The format calls are read in.
    pub format: Format,
    /// The tools offered.
    pub tools: Vec<crate::tool_calls::Tool>,
    /// The grammar the answer is held to (a forced call; any generic answer).
    pub forced: Option<onebit_runtime::grammar::Spec>,
}

/// The plan for `parsed`'s tools: the format from the model's template ([`Format::Generic`]
/// when it renders none), and the grammar the answer is held to: a call's for `required` or a
/// named function, and in the generic format always (a call or a `response`).
/// `format_too`: the request also has a `response_format`.
pub fn tool_plan(
    text: &Text,
    tools: Option<&ToolRequest>,
    format_too: bool,
) -> Result<Option<ToolPlan>, ApiError> {
    let Some(t) = tools.filter(|t| t.choice != Choice::None) else {
        return Ok(None);
    };
    let format = text
        .template()
        .and_then(Format::detect)
        .unwrap_or(Format::Generic);
    let offered: Vec<crate::tool_calls::Tool> = match &t.choice {
        Choice::Named(n) => t.tools.iter().filter(|x| &x.name == n).cloned().collect(),
        _ => t.tools.clone(),
    };
    let must_call = matches!(t.choice, Choice::Required | Choice::Named(_));
    let grammar = match (format, must_call) {
        (Format::Generic, _) => Some(generic::grammar(&offered, must_call, t.parallel)),
        (_, true) => Some(crate::tool_calls::forced_grammar(
            format, &offered, t.parallel,
        )),
        (_, false) => None,
    };
    if grammar.is_some() && format_too {
        return Err(ApiError::bad(
            "tool_choice",
            if must_call {
                "a forced tool call and a response_format cannot both hold the answer"
            } else {
                "this model's template has no tool format of its own, so its answers with tools \
                 are held to the generic tool JSON; a response_format cannot hold them too"
            },
        ));
    }
    Ok(Some(ToolPlan {
        format,
        tools: t.tools.clone(),
        forced: grammar.map(onebit_runtime::grammar::Spec::Lark),
    }))
}

/// A chat `prompt` rewritten for a template that renders no tool format ([`generic`]): the
/// offered tools described in a system message, earlier calls
/// and tool results as plain messages. Other templates' prompts are left as they are.
pub fn generic_prompt(mut prompt: Prompt, text: &Text, tools: Option<&ToolRequest>) -> Prompt {
    polyfill(&mut prompt, text, tools);
    prompt
}

/// [`generic_prompt`]'s rewriting, in place.
fn polyfill(prompt: &mut Prompt, text: &Text, tools: Option<&ToolRequest>) {
    let (messages, extras) = match prompt {
        Prompt::Chat(m) => (m, None),
        Prompt::ChatWith(m, e) => (m, Some(e)),
        _ => return,
    };
    // Most requests bring no tools and no tool turns: nothing to look up in the template.
    if tools.is_none() && !generic::needs_polyfill(messages) {
        return;
    }
    if text.template().and_then(Format::detect).is_some() {
        return;
    }
    let system = tools.map(|t| {
        let offered: Vec<Value> = match &t.choice {
            Choice::Named(n) => t
                .raw
                .iter()
                .filter(|r| r.pointer("/function/name").and_then(Value::as_str) == Some(n))
                .cloned()
                .collect(),
            _ => t.raw.clone(),
        };
        let usage = match t.choice {
            Choice::Auto => generic::Use::May,
            Choice::None => generic::Use::Not,
            _ => generic::Use::Must,
        };
        generic::system_text(&offered, usage)
    });
    if system.is_none() && !generic::needs_polyfill(messages) {
        return;
    }
    *messages = generic::polyfill(messages, system.as_deref());
    if let Some(e) = extras {
        e.tools.clear();
    }
}

/// The grammar a request's answer is held to, with the field it came from: its
/// `response_format`, else a forced tool call's.
pub fn grammar_of(
    format: Option<&onebit_runtime::grammar::Spec>,
    plan: Option<&ToolPlan>,
) -> Option<(onebit_runtime::grammar::Spec, &'static str)> {
    match (format, plan) {
        (Some(spec), _) => Some((spec.clone(), "response_format")),
        (None, Some(plan)) => plan.forced.clone().map(|g| (g, "tool_choice")),
        (None, None) => None,
    }
}
