//! The OpenAI wire format: request validation that names the offending field, error bodies in
//! OpenAI's shape, and the response objects (`chat.completion`, `chat.completion.chunk`,
//! `text_completion`). Requests are read from `serde_json::Value` rather than derived structs so
//! every refusal can say which field and why, as OpenAI's API does (`param`).

use axum::http::StatusCode;
use serde_json::{Value, json};

pub use super::error::ApiError;
use super::fields::{MAX_LOGPROBS, chat_logprobs, logit_bias};
pub use super::fields::{REASONING_EFFORTS, apply_reasoning_effort, check_logit_bias};
use super::values::{flag, int};

use crate::generate::{Finish, Prompt};
use crate::sample::SamplerConfig;
use crate::text::{ChatExtras, Message};

/// A validated completion request, chat or plain.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The model the client named, if any.
    pub model: Option<String>,
    /// What to complete.
    pub prompt: Prompt,
    /// Token budget (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// Sampling.
    pub sampler: SamplerConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with usage and no choices.
    pub include_usage: bool,
    /// `response_format`: the grammar the answer must follow.
    pub format: Option<crate::grammar::Spec>,
    /// The tools offered, when the model may call them.
    pub tools: Option<super::tools::ToolRequest>,
    /// Log-probabilities of the answer's tokens with this many alternatives each (`None`: off).
    pub logprobs: Option<usize>,
    /// `reasoning_effort`, applied where the template has a switch for it.
    pub reasoning_effort: Option<String>,
    /// `n`: choices to generate for the prompt.
    pub n: usize,
}

/// The most choices (`n`) one request may ask for, as OpenAI's API allows; a server also needs a
/// slot per choice (`--parallel`).
pub const MAX_CHOICES: i64 = 128;

/// Parses a body as JSON, saying where it broke.
pub fn json_body(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not valid JSON: {e}"),
        )
        .with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the body must be a JSON object",
        )
        .with_code("invalid_json")),
    }
}

fn num(b: &serde_json::Map<String, Value>, f: &str) -> Result<Option<f64>, ApiError> {
    match b.get(f) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(ApiError::bad(f, format!("'{f}' must be a number, got {v}"))),
    }
}

/// `seed` as the full 64 bits it names: a negative seed is its two's complement, and seeds of
/// 2^63 and more keep their value (clamping them would give every such seed the same text).
fn seed_of(b: &serde_json::Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match b.get("seed") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Ok(Some(u)),
            (None, Some(i)) => Ok(Some(i as u64)),
            _ => Err(ApiError::bad(
                "seed",
                format!("'seed' must be an integer, got {n}"),
            )),
        },
        Some(v) => Err(ApiError::bad(
            "seed",
            format!("'seed' must be an integer, got {v}"),
        )),
    }
}

fn unsupported(
    b: &serde_json::Map<String, Value>,
    f: &str,
    ok: impl Fn(&Value) -> bool,
) -> Result<(), ApiError> {
    match b.get(f) {
        Some(v) if !v.is_null() && !ok(v) => Err(ApiError::bad(
            f,
            format!("'{f}' = {v} is not supported by this server"),
        )),
        _ => Ok(()),
    }
}

/// The fields both routes read: every one is honoured, or refused by value when it asks for what
/// this server cannot do. `user` and `metadata` label a request and change no answer.
pub(super) const COMMON_FIELDS: &[&str] = &[
    "model",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "seed",
    "n",
    "stop",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "min_p",
    "typical_p",
    "repeat_last_n",
    "user",
    "metadata",
    "store",
];

/// Fields only `/v1/chat/completions` reads.
pub(super) const CHAT_FIELDS: &[&str] = &[
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "chat_template_kwargs",
    "reasoning_effort",
];

/// Fields only `/v1/completions` reads.
pub(super) const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix", "logprobs", "best_of"];

/// Refuses a field neither list names (`mirostat`, `top_logprobs` on completions, a misspelt
/// `max_token`): ignoring it would answer a question the client did not ask.
fn known_fields(b: &serde_json::Map<String, Value>, route: &[&str]) -> Result<(), ApiError> {
    match b
        .keys()
        .find(|k| !COMMON_FIELDS.contains(&k.as_str()) && !route.contains(&k.as_str()))
    {
        Some(k) => Err(ApiError::bad(
            k.clone(),
            format!(
                "unknown field '{k}': this server does not read it, and ignoring it would change the answer you asked for"
            ),
        )),
        None => Ok(()),
    }
}

/// Removes the fields neither `route` nor the common list names, and returns their names, for
/// `serve --lenient`: clients that send fields this server does not read get an answer and a
/// `Warning` header naming what was ignored, instead of a 400.
pub fn drop_unknown(b: &mut serde_json::Map<String, Value>, route: &[&str]) -> Vec<String> {
    let unknown: Vec<String> = b
        .keys()
        .filter(|k| !COMMON_FIELDS.contains(&k.as_str()) && !route.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in &unknown {
        b.remove(k);
    }
    unknown
}

/// The fields chat and plain completions share.
fn common(b: &serde_json::Map<String, Value>, prompt: Prompt) -> Result<Parsed, ApiError> {
    let model = match b.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::bad(
                "model",
                format!("'model' must be a string, got {v}"),
            ));
        }
    };
    let mut max_tokens = None;
    for f in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = int(b, f)? {
            if n < 0 {
                return Err(ApiError::bad(
                    f,
                    format!("'{f}' must be at least 0, got {n}"),
                ));
            }
            max_tokens = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
    }
    let temperature = num(b, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(
            "temperature",
            format!("'temperature' must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = num(b, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            "top_p",
            format!("'top_p' must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = int(b, "top_k")?.unwrap_or(0);
    if top_k < 0 {
        return Err(ApiError::bad(
            "top_k",
            format!("'top_k' must be at least 0, got {top_k}"),
        ));
    }
    let repetition_penalty = num(b, "repetition_penalty")?.unwrap_or(1.0);
    if repetition_penalty <= 0.0 {
        return Err(ApiError::bad(
            "repetition_penalty",
            format!("'repetition_penalty' must be positive, got {repetition_penalty}"),
        ));
    }
    let seed = match seed_of(b)? {
        Some(s) => s,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    };
    let n = match int(b, "n")? {
        None => 1,
        Some(n @ 1..=MAX_CHOICES) => n as usize,
        Some(n) => {
            return Err(ApiError::bad(
                "n",
                format!("'n' must be between 1 and {MAX_CHOICES}, got {n}"),
            ));
        }
    };
    let stop = match b.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::String(_)) => {
            return Err(ApiError::bad(
                "stop",
                "a stop string must not be empty (it would end every answer at once)",
            ));
        }
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for (i, v) in a.iter().enumerate() {
                match v {
                    Value::String(s) if !s.is_empty() => out.push(s.clone()),
                    _ => {
                        return Err(ApiError::bad(
                            format!("stop[{i}]"),
                            format!("stop strings must be non-empty strings, got {v}"),
                        ));
                    }
                }
            }
            if out.len() > 4 {
                return Err(ApiError::bad(
                    "stop",
                    format!("at most 4 stop strings, got {}", out.len()),
                ));
            }
            out
        }
        Some(v) => {
            return Err(ApiError::bad(
                "stop",
                format!("'stop' must be a string or an array, got {v}"),
            ));
        }
    };
    let mut penalties = [0.0f64; 2];
    for (i, f) in ["presence_penalty", "frequency_penalty"]
        .into_iter()
        .enumerate()
    {
        let x = num(b, f)?.unwrap_or(0.0);
        if !(-2.0..=2.0).contains(&x) {
            return Err(ApiError::bad(
                f,
                format!("'{f}' must be between -2 and 2, got {x}"),
            ));
        }
        penalties[i] = x;
    }
    let min_p = num(b, "min_p")?.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::bad(
            "min_p",
            format!("'min_p' must be in [0, 1], got {min_p}"),
        ));
    }
    let typical_p = num(b, "typical_p")?.unwrap_or(1.0);
    if !(typical_p > 0.0 && typical_p <= 1.0) {
        return Err(ApiError::bad(
            "typical_p",
            format!("'typical_p' must be in (0, 1], got {typical_p}"),
        ));
    }
    // llama.cpp's convention: -1 is the whole context, 0 turns the penalties off.
    let repeat_last_n = match int(b, "repeat_last_n")? {
        None | Some(-1) => usize::MAX,
        Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            return Err(ApiError::bad(
                "repeat_last_n",
                format!("'repeat_last_n' must be -1 (the whole context), 0 (off) or more, got {n}"),
            ));
        }
    };
    let logit_bias = logit_bias(b)?;
    unsupported(b, "store", |v| v == &Value::Bool(false))?;
    unsupported(b, "best_of", |v| v.as_i64() == Some(1))?;
    let stream = flag(b, "stream")?;
    let include_usage = match b.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(x)) => *x,
            Some(v) => {
                return Err(ApiError::bad(
                    "stream_options.include_usage",
                    format!("must be a boolean, got {v}"),
                ));
            }
        },
        Some(v) => {
            return Err(ApiError::bad(
                "stream_options",
                format!("must be an object, got {v}"),
            ));
        }
    };
    let sampler = SamplerConfig {
        temperature: temperature as f32,
        top_k: top_k as usize,
        top_p: top_p as f32,
        repetition_penalty: repetition_penalty as f32,
        min_p: min_p as f32,
        typical_p: typical_p as f32,
        presence_penalty: penalties[0] as f32,
        frequency_penalty: penalties[1] as f32,
        repeat_last_n,
        logit_bias,
        seed,
    };
    // The values as the sampler holds them (f32): a penalty of 1e-300 passes as f64 and is 0.
    if let Err(crate::Error::Request { field, reason }) = sampler.check() {
        return Err(ApiError::bad(field, format!("'{field}': {reason}")));
    }
    Ok(Parsed {
        model,
        prompt,
        max_tokens,
        sampler,
        stop,
        stream,
        include_usage,
        format: super::structured::response_format(b)?,
        tools: None,
        logprobs: None,
        reasoning_effort: None,
        n,
    })
}

/// A `/v1/chat/completions` body.
pub fn chat(b: &serde_json::Map<String, Value>) -> Result<Parsed, ApiError> {
    known_fields(b, CHAT_FIELDS)?;
    let msgs = match b.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::bad("messages", "'messages' is empty")),
        None | Some(Value::Null) => {
            return Err(ApiError::bad("messages", "'messages' is required"));
        }
        Some(v) => {
            return Err(ApiError::bad(
                "messages",
                format!("'messages' must be an array, got {v}"),
            ));
        }
    };
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => {
                return Err(ApiError::bad(
                    format!("messages[{i}].role"),
                    "each message needs a string 'role'",
                ));
            }
        };
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::bad(
                    format!("messages[{i}].role"),
                    format!("unknown role '{other}' (system, developer, user, assistant or tool)"),
                ));
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" || role == "tool" => String::new(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => s.push_str(t),
                        _ => {
                            return Err(ApiError::bad(
                                format!("messages[{i}].content[{j}]"),
                                "only text content parts are supported",
                            ));
                        }
                    }
                }
                s
            }
            _ => {
                return Err(ApiError::bad(
                    format!("messages[{i}].content"),
                    "'content' must be a string or an array of text parts",
                ));
            }
        };
        let text_of = |f: &str| m.get(f).and_then(Value::as_str).map(str::to_string);
        out.push(Message {
            role: role.to_string(),
            content,
            tool_calls: if role == "assistant" {
                super::tools::message_tool_calls(i, m)?
            } else {
                None
            },
            tool_call_id: text_of("tool_call_id").filter(|_| role == "tool"),
            name: text_of("name").filter(|_| role == "tool"),
        });
    }
    let logprobs = chat_logprobs(b)?;
    let tools = super::tools::tool_request(b)?;
    let kwargs = match b.get("chat_template_kwargs") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => {
            return Err(ApiError::bad(
                "chat_template_kwargs",
                format!("'chat_template_kwargs' must be an object of template variables, got {v}"),
            ));
        }
    };
    let reasoning_effort = match b.get("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) if REASONING_EFFORTS.contains(&e.as_str()) => Some(e.clone()),
        Some(v) => {
            return Err(ApiError::bad(
                "reasoning_effort",
                format!(
                    "'reasoning_effort' must be one of {}, got {v}",
                    REASONING_EFFORTS.join(", ")
                ),
            ));
        }
    };
    let prompt = match (&tools, kwargs.is_empty()) {
        (None, true) => Prompt::Chat(out),
        _ => Prompt::ChatWith(
            out,
            ChatExtras {
                tools: tools.as_ref().map(|t| t.raw.clone()).unwrap_or_default(),
                kwargs,
            },
        ),
    };
    let mut parsed = common(b, prompt)?;
    parsed.tools = tools;
    parsed.logprobs = logprobs;
    parsed.reasoning_effort = reasoning_effort;
    Ok(parsed)
}

/// A `/v1/completions` body.
pub fn completion(b: &serde_json::Map<String, Value>) -> Result<Parsed, ApiError> {
    known_fields(b, COMPLETION_FIELDS)?;
    let prompt = match b.get("prompt") {
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Prompt::Text(a[0].as_str().unwrap_or_default().to_string())
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => Prompt::Tokens(
            a.iter()
                .map(|v| {
                    v.as_u64()
                        .map_or(u32::MAX, |t| u32::try_from(t).unwrap_or(u32::MAX))
                })
                .collect(),
        ),
        None | Some(Value::Null) => return Err(ApiError::bad("prompt", "'prompt' is required")),
        Some(v) => {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "'prompt' must be a string, one string in an array, or an array of token ids; got {}",
                    kind_of(v)
                ),
            ));
        }
    };
    unsupported(b, "echo", |v| v == &Value::Bool(false))?;
    unsupported(b, "suffix", |v| v.as_str() == Some(""))?;
    let mut parsed = common(b, prompt)?;
    parsed.logprobs = match int(b, "logprobs")? {
        None => None,
        Some(n @ 0..=MAX_LOGPROBS) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::bad(
                "logprobs",
                format!("'logprobs' must be between 0 and {MAX_LOGPROBS}, got {n}"),
            ));
        }
    };
    Ok(parsed)
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Object(_) => "an object".into(),
        other => other.to_string(),
    }
}

/// `usage` of a reply; `cached` prompt tokens came from the prefix cache
/// (`prompt_tokens_details.cached_tokens`, as OpenAI reports its prompt caching).
pub fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// OpenAI's `finish_reason` (a cancelled request has no reader left).
pub fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length | Finish::Cancelled => "length",
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
