//! The OpenAI wire format: request validation that names the offending field, error bodies in
//! OpenAI's shape, and the response objects (`chat.completion`, `chat.completion.chunk`,
//! `text_completion`). Requests are read from `serde_json::Value` rather than derived structs so
//! every refusal can say which field and why, as OpenAI's API does (`param`).

use serde_json::{Value, json};

pub use super::error::ApiError;
use super::fields::{MAX_LOGPROBS, chat_logprobs, logit_bias};
pub use super::fields::{REASONING_EFFORTS, check_logit_bias, with_reasoning_effort};
use super::values::{Fields, Route, Unknown};

use onebit_runtime::generate::{Finish, Prompt};
use onebit_runtime::sample::SamplerConfig;
use onebit_runtime::text::{ChatExtras, IMAGE_SLOT, Message};

/// A validated completion request, chat or plain: what the client asked for, before it meets
/// the model ([`crate::prepare`] binds it to the loaded model in one step).
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The fields both routes read.
    pub common: Common,
    /// What to complete.
    pub prompt: Prompt,
    /// The tools offered, when the model may call them (chat only).
    pub tools: Option<crate::tool_fields::ToolRequest>,
    /// Log-probabilities of the answer's tokens with this many alternatives each (`None`: off).
    pub logprobs: Option<usize>,
    /// `reasoning_effort`, applied where the template has a switch for it (chat only).
    pub reasoning_effort: Option<String>,
    /// The messages' images (`image_url` parts as `data:` URLs), decoded to the files' bytes, in
    /// the order of the image slots their parts left in the messages' text.
    pub images: Vec<Vec<u8>>,
}

/// The fields chat and plain completions share.
#[derive(Debug, Clone)]
pub struct Common {
    /// The model the client named, if any.
    pub model: Option<String>,
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
    pub format: Option<onebit_runtime::grammar::Spec>,
    /// `n`: choices to generate for the prompt.
    pub n: usize,
}

/// The most choices (`n`) one request may ask for, as OpenAI's API allows; a server also needs a
/// slot per choice (`--parallel`).
pub const MAX_CHOICES: i64 = 128;

/// `seed` as the full 64 bits it names: a negative seed is its two's complement, and seeds of
/// 2^63 and more keep their value (clamping them would give every such seed the same text).
fn seed_of(b: &Fields) -> Result<Option<u64>, ApiError> {
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

/// `/v1/chat/completions`' fields. Any other (`mirostat`, a misspelt `max_token`) is refused:
/// ignoring it would answer a question the client did not ask.
pub(crate) const CHAT: Route = Route {
    fields: &[COMMON_FIELDS, CHAT_FIELDS],
    unknown: Unknown::ChangesAnswer,
};

/// `/v1/completions`' fields (`top_logprobs` is chat's).
pub(crate) const COMPLETION: Route = Route {
    fields: &[COMMON_FIELDS, COMPLETION_FIELDS],
    unknown: Unknown::ChangesAnswer,
};

/// The fields chat and plain completions share.
fn common(b: &Fields) -> Result<Common, ApiError> {
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
    let max_tokens = max_tokens(b)?;
    let basics = sampling(b)?;
    let n = match b.int("n")? {
        None => 1,
        Some(n @ 1..=MAX_CHOICES) => n as usize,
        Some(n) => {
            return Err(ApiError::bad(
                "n",
                format!("'n' must be between 1 and {MAX_CHOICES}, got {n}"),
            ));
        }
    };
    let stop = stop(b)?;
    let sampler = penalties(b, basics)?;
    b.only_if("store", |v| v == &Value::Bool(false))?;
    b.only_if("best_of", |v| v.as_i64() == Some(1))?;
    let stream = b.flag("stream", false)?;
    let include_usage = include_usage(b)?;
    // The values as the sampler holds them (f32): a penalty of 1e-300 passes as f64 and is 0.
    if let Err(onebit_runtime::Error::Request { field, reason }) = sampler.check() {
        return Err(ApiError::bad(field, format!("'{field}': {reason}")));
    }
    Ok(Common {
        model,
        max_tokens,
        sampler,
        stop,
        stream,
        include_usage,
        format: super::structured::response_format(b)?,
        n,
    })
}

/// `max_tokens`, or its newer name `max_completion_tokens` (which wins when both are set).
fn max_tokens(b: &Fields) -> Result<Option<usize>, ApiError> {
    let mut max_tokens = None;
    for f in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = b.int(f)? {
            if n < 0 {
                return Err(ApiError::bad(
                    f,
                    format!("'{f}' must be at least 0, got {n}"),
                ));
            }
            max_tokens = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
    }
    Ok(max_tokens)
}

/// A number field in `range` (`default` when absent), refused with `what` the range is.
fn ranged(
    b: &Fields,
    f: &str,
    default: f64,
    ok: impl Fn(f64) -> bool,
    what: &str,
) -> Result<f64, ApiError> {
    let x = b.num(f)?.unwrap_or(default);
    if ok(x) {
        Ok(x)
    } else {
        Err(ApiError::bad(f, format!("'{f}' must be {what}, got {x}")))
    }
}

/// The sampling fields read before `n` and `stop` (a body wrong in several fields is refused for
/// the first of them in this order): temperature, nucleus, top-k, repetition penalty, seed.
fn sampling(b: &Fields) -> Result<SamplerConfig, ApiError> {
    let temperature = ranged(
        b,
        "temperature",
        1.0,
        |x| (0.0..=2.0).contains(&x),
        "between 0 and 2",
    )?;
    let top_p = ranged(b, "top_p", 1.0, |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
    let top_k = b.int("top_k")?.unwrap_or(0);
    if top_k < 0 {
        return Err(ApiError::bad(
            "top_k",
            format!("'top_k' must be at least 0, got {top_k}"),
        ));
    }
    let repetition_penalty = ranged(b, "repetition_penalty", 1.0, |x| x > 0.0, "positive")?;
    let seed = match seed_of(b)? {
        Some(s) => s,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    };
    Ok(SamplerConfig {
        temperature: temperature as f32,
        top_k: top_k as usize,
        top_p: top_p as f32,
        repetition_penalty: repetition_penalty as f32,
        seed,
        ..SamplerConfig::default()
    })
}

/// The sampling fields read after `stop`, completing `basics`: the presence and frequency
/// penalties, min-p, typical-p, the penalties' window and `logit_bias`.
fn penalties(b: &Fields, basics: SamplerConfig) -> Result<SamplerConfig, ApiError> {
    let penalty = |f: &str| ranged(b, f, 0.0, |x| (-2.0..=2.0).contains(&x), "between -2 and 2");
    let presence_penalty = penalty("presence_penalty")?;
    let frequency_penalty = penalty("frequency_penalty")?;
    let min_p = ranged(b, "min_p", 0.0, |x| (0.0..=1.0).contains(&x), "in [0, 1]")?;
    let typical_p = ranged(b, "typical_p", 1.0, |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
    // llama.cpp's convention: -1 is the whole context, 0 turns the penalties off.
    let repeat_last_n = match b.int("repeat_last_n")? {
        None | Some(-1) => usize::MAX,
        Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            return Err(ApiError::bad(
                "repeat_last_n",
                format!("'repeat_last_n' must be -1 (the whole context), 0 (off) or more, got {n}"),
            ));
        }
    };
    Ok(SamplerConfig {
        min_p: min_p as f32,
        typical_p: typical_p as f32,
        presence_penalty: presence_penalty as f32,
        frequency_penalty: frequency_penalty as f32,
        repeat_last_n,
        logit_bias: logit_bias(b)?,
        ..basics
    })
}

/// `stop`: a string or up to four, none empty.
fn stop(b: &Fields) -> Result<Vec<String>, ApiError> {
    match b.get("stop") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if !s.is_empty() => Ok(vec![s.clone()]),
        Some(Value::String(_)) => Err(ApiError::bad(
            "stop",
            "a stop string must not be empty (it would end every answer at once)",
        )),
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
            Ok(out)
        }
        Some(v) => Err(ApiError::bad(
            "stop",
            format!("'stop' must be a string or an array, got {v}"),
        )),
    }
}

/// `stream_options.include_usage`.
fn include_usage(b: &Fields) -> Result<bool, ApiError> {
    match b.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(x)) => Ok(*x),
            Some(v) => Err(ApiError::bad(
                "stream_options.include_usage",
                format!("must be a boolean, got {v}"),
            )),
        },
        Some(v) => Err(ApiError::bad(
            "stream_options",
            format!("must be an object, got {v}"),
        )),
    }
}

/// A `/v1/chat/completions` body.
pub(crate) fn chat(b: &Fields) -> Result<Parsed, ApiError> {
    let (messages, images) = messages(b)?;
    let logprobs = chat_logprobs(b)?;
    let tools = crate::tool_fields::tool_request(b)?;
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
        (None, true) => Prompt::Chat(messages),
        _ => Prompt::ChatWith(
            messages,
            ChatExtras {
                tools: tools.as_ref().map(|t| t.raw.clone()).unwrap_or_default(),
                kwargs,
            },
        ),
    };
    Ok(Parsed {
        common: common(b)?,
        prompt,
        tools,
        logprobs,
        reasoning_effort,
        images,
    })
}

/// `messages`: each with a known role and text content (an image part leaves an image slot in
/// the text), and the images' bytes in order.
fn messages(b: &Fields) -> Result<(Vec<Message>, Vec<Vec<u8>>), ApiError> {
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
    let mut images = Vec::new();
    let messages = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m, &mut images))
        .collect::<Result<_, _>>()?;
    Ok((messages, images))
}

/// `messages[i]`; its image parts' bytes are pushed to `images`.
fn message(i: usize, m: &Value, images: &mut Vec<Vec<u8>>) -> Result<Message, ApiError> {
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
                    (Some("image_url" | "input_image"), _) => {
                        images.push(crate::image_parts::image_part(
                            &format!("messages[{i}].content[{j}]"),
                            p,
                        )?);
                        s.push(IMAGE_SLOT);
                    }
                    _ => {
                        return Err(ApiError::bad(
                            format!("messages[{i}].content[{j}]"),
                            "only text and image_url content parts are supported",
                        ));
                    }
                }
            }
            s
        }
        _ => {
            return Err(ApiError::bad(
                format!("messages[{i}].content"),
                "'content' must be a string or an array of text and image_url parts",
            ));
        }
    };
    let slots = content.matches(IMAGE_SLOT).count();
    let parts = m.get("content").and_then(Value::as_array).map_or(0, |a| {
        a.iter()
            .filter(|p| {
                matches!(
                    p.get("type").and_then(Value::as_str),
                    Some("image_url" | "input_image")
                )
            })
            .count()
    });
    if slots != parts {
        return Err(ApiError::bad(
            format!("messages[{i}].content"),
            "the text holds U+FDD0, a noncharacter this server reserves for where images go",
        ));
    }
    let text_of = |f: &str| m.get(f).and_then(Value::as_str).map(str::to_string);
    Ok(Message {
        role: role.to_string(),
        content,
        tool_calls: if role == "assistant" {
            crate::tool_fields::message_tool_calls(i, m)?
        } else {
            None
        },
        tool_call_id: text_of("tool_call_id").filter(|_| role == "tool"),
        name: text_of("name").filter(|_| role == "tool"),
    })
}

/// A `/v1/completions` body.
pub(crate) fn completion(b: &Fields) -> Result<Parsed, ApiError> {
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
    b.only_if("echo", |v| v == &Value::Bool(false))?;
    b.only_if("suffix", |v| v.as_str() == Some(""))?;
    let common = common(b)?;
    let logprobs = match b.int("logprobs")? {
        None => None,
        Some(n @ 0..=MAX_LOGPROBS) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::bad(
                "logprobs",
                format!("'logprobs' must be between 0 and {MAX_LOGPROBS}, got {n}"),
            ));
        }
    };
    Ok(Parsed {
        common,
        prompt,
        tools: None,
        logprobs,
        reasoning_effort: None,
        images: Vec::new(),
    })
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
