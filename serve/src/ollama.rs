//! Ollama's API beside OpenAI's, on the same port: `/api/chat`, `/api/generate`, `/api/embed`
//! (and the older `/api/embeddings`), `/api/tags`, `/api/ps`, `/api/show`, `/api/version`. Many
//! tools look for Ollama on its port and speak nothing else.
//!
//! A request is translated into the OpenAI request it means (Ollama's `options` into the same
//! sampling fields, `format` into `response_format`, `images` into image parts, `think` into
//! `reasoning_effort`) and runs through the same path: the same model lookup, template, grammar,
//! scheduler and answer splitting. The answer goes back in Ollama's shapes: newline-delimited
//! JSON objects when streamed (the default), one object otherwise, each with `created_at` and
//! the final one with `done_reason` and the counts and durations in nanoseconds. A field Ollama
//! has and this server does not read gets a 400 naming it (dropped with `--lenient`); errors are
//! Ollama's `{"error": "…"}`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::answer::Answer;
use crate::api::{self, ApiError};
use crate::body::read_body;
use crate::complete::Started;
use crate::job::{Event, Summary};
use crate::models::{ModelInfo, parse_keep_alive};
use crate::reply::Kind;
use crate::tool_calls::Call;
use crate::values::{Fields, json_body};
use crate::{Ready, Server};

/// The version `/api/version` reports: Ollama's clients compare it to decide what a server
/// speaks, so it is the Ollama release whose API this one follows, with ours beside it.
const OLLAMA_API: &str = "0.12.0";

/// An error in Ollama's shape: `{"error": "…"}` with the status.
pub(crate) struct OllamaError(ApiError);

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        (self.0.status, axum::Json(json!({"error": self.0.message}))).into_response()
    }
}

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

pub(crate) type Result<T> = std::result::Result<T, OllamaError>;

/// Ollama's `options` and the OpenAI fields they become.
const OPTIONS: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("typical_p", "typical_p"),
    ("seed", "seed"),
    ("num_predict", "max_tokens"),
    ("stop", "stop"),
    ("repeat_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("repeat_last_n", "repeat_last_n"),
];

/// A request as read: its body, the fields it may have, and the ones dropped (`--lenient`).
struct Body2 {
    map: Map<String, Value>,
}

impl Body2 {
    /// The body of a route reading `allowed`: an unknown field is refused by name, or dropped
    /// and logged with `--lenient`.
    async fn read(s: &Server, headers: &HeaderMap, body: Body, allowed: &[&str]) -> Result<Body2> {
        s.authorize(headers)?;
        s.started()?;
        let bytes = read_body(body, headers, s.opts.max_body).await?;
        let mut map = json_body(&bytes)?;
        let unknown: Vec<String> = map
            .keys()
            .filter(|k| !allowed.contains(&k.as_str()))
            .cloned()
            .collect();
        if let Some(k) = unknown.first()
            && !s.opts.lenient
        {
            return Err(ApiError::bad(
                k.clone(),
                format!(
                    "unknown field '{k}': this server does not read it (it reads {}); start it \
                     with --lenient to drop such fields",
                    allowed.join(", ")
                ),
            )
            .into());
        }
        for k in &unknown {
            map.remove(k);
            tracing::warn!(field = %k, "--lenient: unknown Ollama field ignored");
        }
        Ok(Body2 { map })
    }

    fn get(&self, k: &str) -> Option<&Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    /// A string field, if present.
    fn string(&self, k: &str) -> Result<Option<String>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(v)) => Ok(Some(v.clone())),
            Some(v) => Err(ApiError::bad(k, format!("'{k}' must be a string, got {v}")).into()),
        }
    }

    /// `model` (or the older `name`), required.
    fn model(&self) -> Result<String> {
        match self.string("model")? {
            Some(m) => Ok(m),
            None => self
                .string("name")?
                .ok_or_else(|| ApiError::bad("model", "'model' is required").into()),
        }
    }

    /// `keep_alive`, if given.
    fn keep_alive(&self) -> Result<Option<Option<Duration>>> {
        self.get("keep_alive")
            .map(|v| parse_keep_alive(v).map_err(|e| ApiError::bad("keep_alive", e).into()))
            .transpose()
    }
}

/// The OpenAI fields of Ollama's `options`, `format`, `stream` and `think`, into `out`. Returns
/// `num_ctx` when given (checked against the context the model is served at).
fn common(b: &Body2, out: &mut Map<String, Value>, lenient: bool) -> Result<Option<u64>> {
    out.insert(
        "stream".into(),
        b.get("stream").cloned().unwrap_or(Value::Bool(true)),
    );
    let mut num_ctx = None;
    if let Some(opts) = b.get("options") {
        let Value::Object(opts) = opts else {
            return Err(ApiError::bad("options", "'options' must be an object").into());
        };
        for (k, v) in opts {
            if v.is_null() {
                continue;
            }
            if k == "num_ctx" {
                num_ctx = Some(v.as_u64().ok_or_else(|| {
                    ApiError::bad("options.num_ctx", "'num_ctx' must be a positive integer")
                })?);
                continue;
            }
            if k == "num_predict" && v.as_i64().is_some_and(|n| n < 0) {
                // -1: until the model stops; -2: until the context fills. Both are the default.
                continue;
            }
            match OPTIONS.iter().find(|(o, _)| o == k) {
                Some((_, field)) => {
                    out.insert((*field).into(), v.clone());
                }
                None if lenient => {
                    tracing::warn!(option = %k, "--lenient: unknown Ollama option ignored");
                }
                None => {
                    return Err(ApiError::bad(
                        format!("options.{k}"),
                        format!(
                            "the option '{k}' is not read by this server (it reads {}, num_ctx); \
                             start it with --lenient to drop such options",
                            OPTIONS
                                .iter()
                                .map(|(o, _)| *o)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                    .into());
                }
            }
        }
    }
    match b.get("format") {
        None => {}
        Some(Value::String(f)) if f == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Value::String(f)) if f.is_empty() => {}
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(v) => {
            return Err(ApiError::bad(
                "format",
                format!("'format' must be \"json\" or a JSON schema object, got {v}"),
            )
            .into());
        }
    }
    match b.get("think") {
        None => {}
        Some(Value::Bool(t)) => {
            let effort = if *t { "medium" } else { "none" };
            out.insert("reasoning_effort".into(), json!(effort));
        }
        Some(Value::String(level)) => {
            out.insert("reasoning_effort".into(), json!(level));
        }
        Some(v) => {
            return Err(
                ApiError::bad("think", format!("'think' must be a boolean, got {v}")).into(),
            );
        }
    }
    Ok(num_ctx)
}

/// An Ollama message as the OpenAI message it means: `images` (base64) as image parts before
/// the text, `tool_calls` with ids and JSON-text arguments, `tool_name` as a tool result's name.
fn message(i: usize, m: &Value) -> Result<Value> {
    let field = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(ApiError::bad(field, "a message must be an object").into());
    };
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "role" => {
                out.insert("role".into(), v.clone());
            }
            "content" => {}
            "images" => {}
            // Reasoning a client sends back is not part of the prompt.
            "thinking" => {}
            "tool_name" => {
                out.insert("name".into(), v.clone());
            }
            "tool_calls" => {
                let calls = v.as_array().ok_or_else(|| {
                    ApiError::bad(
                        format!("{field}.tool_calls"),
                        "'tool_calls' must be an array",
                    )
                })?;
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let f = &c["function"];
                        let args = match &f["arguments"] {
                            Value::String(s) => s.clone(),
                            Value::Null => "{}".into(),
                            other => other.to_string(),
                        };
                        json!({"id": format!("call_{i}_{k}"), "type": "function",
                               "function": {"name": f["name"], "arguments": args}})
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            other => {
                return Err(ApiError::bad(
                    format!("{field}.{other}"),
                    format!(
                        "unknown message field '{other}' (a message has role, content, images, \
                         thinking, tool_calls, tool_name)"
                    ),
                )
                .into());
            }
        }
    }
    let text = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(t)) => t.clone(),
        Some(v) => {
            return Err(ApiError::bad(
                format!("{field}.content"),
                format!("'content' must be a string, got {v}"),
            )
            .into());
        }
    };
    match m.get("images") {
        None | Some(Value::Null) => {
            out.insert("content".into(), Value::String(text));
        }
        Some(Value::Array(images)) => {
            let mut parts: Vec<Value> = images
                .iter()
                .map(|b64| match b64 {
                    Value::String(b) => Ok(json!({"type": "image_url",
                        "image_url": {"url": format!("data:image/png;base64,{b}")}})),
                    v => Err(ApiError::bad(
                        format!("{field}.images"),
                        format!("an image must be a base64 string, got {v}"),
                    )),
                })
                .collect::<std::result::Result<_, _>>()?;
            parts.push(json!({"type": "text", "text": text}));
            out.insert("content".into(), Value::Array(parts));
        }
        Some(v) => {
            return Err(ApiError::bad(
                format!("{field}.images"),
                format!("'images' must be an array of base64 strings, got {v}"),
            )
            .into());
        }
    }
    Ok(Value::Object(out))
}

/// What a reply needs beside its events.
struct Meta {
    model: String,
    /// `/api/chat` answers `message`, `/api/generate` answers `response`.
    chat: bool,
    arrived: Instant,
    load: Duration,
}

/// `created_at`: RFC 3339 in UTC with nanoseconds, as Ollama writes it.
fn created_at() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let date = rfc3339(now.as_secs());
    format!("{}.{:09}Z", &date[..date.len() - 1], now.subsec_nanos())
}

/// RFC 3339 in UTC of `secs` since the epoch (the civil date by H. Hinnant's algorithm).
fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Meta {
    /// A chunk carrying `content` (and `thinking`).
    fn chunk(&self, content: &str, thinking: &str) -> Value {
        let mut v = json!({"model": self.model, "created_at": created_at()});
        if self.chat {
            v["message"] = json!({"role": "assistant", "content": content});
            if !thinking.is_empty() {
                v["message"]["thinking"] = json!(thinking);
            }
        } else {
            v["response"] = json!(content);
            if !thinking.is_empty() {
                v["thinking"] = json!(thinking);
            }
        }
        v["done"] = json!(false);
        v
    }

    /// The last object: `done`, why, the calls (chat), the counts and durations.
    fn last(&self, mut v: Value, s: &Summary, calls: &[Call]) -> Value {
        let total = self.arrived.elapsed();
        let ttft = s.ttft.min(total);
        let ns = |d: Duration| d.as_nanos() as u64;
        if self.chat && !calls.is_empty() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let args: Value =
                        serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                    json!({"function": {"name": c.name, "arguments": args}})
                })
                .collect();
            v["message"]["tool_calls"] = Value::Array(calls);
        }
        v["done"] = json!(true);
        v["done_reason"] = json!(api::finish_reason(s.finish));
        v["total_duration"] = json!(ns(total));
        v["load_duration"] = json!(ns(self.load));
        v["prompt_eval_count"] = json!(s.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(ttft.saturating_sub(self.load)));
        v["eval_count"] = json!(s.completion_tokens);
        v["eval_duration"] = json!(ns(total.saturating_sub(ttft)));
        v
    }
}

/// The answer as one object, once it has ended.
async fn whole(
    meta: Meta,
    mut rx: UnboundedReceiver<Event>,
    mut answer: Answer,
) -> Result<Response> {
    let (mut content, mut thinking) = (String::new(), String::new());
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => {
                let o = answer.push(&t);
                content.push_str(&o.content);
                thinking.push_str(&o.reasoning);
            }
            Some(Event::Done(s)) => {
                let (o, calls) = answer.finish();
                content.push_str(&o.content);
                thinking.push_str(&o.reasoning);
                let v = meta.last(meta.chunk(&content, &thinking), &s, &calls);
                return Ok(axum::Json(v).into_response());
            }
            Some(Event::Failed(e)) => {
                return Err(
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e).into(),
                );
            }
            Some(Event::NoRoom(e)) => {
                return Err(
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", e).into(),
                );
            }
            Some(Event::Logprob(_) | Event::Embedding(_)) => {}
            None => {
                return Err(ApiError::internal("the scheduler dropped the request").into());
            }
        }
    }
}

/// The answer as newline-delimited JSON, a line a piece, the last with `done: true`.
fn streamed(meta: Meta, rx: UnboundedReceiver<Event>, answer: Answer) -> Response {
    let state = (meta, rx, answer, false);
    let lines = futures::stream::unfold(state, |(meta, mut rx, mut answer, ended)| async move {
        if ended {
            return None;
        }
        loop {
            let line = match rx.recv().await {
                Some(Event::Text(t)) => {
                    let o = answer.push(&t);
                    if o.content.is_empty() && o.reasoning.is_empty() {
                        continue;
                    }
                    (meta.chunk(&o.content, &o.reasoning), false)
                }
                Some(Event::Done(s)) => {
                    let (o, calls) = answer.finish();
                    (
                        meta.last(meta.chunk(&o.content, &o.reasoning), &s, &calls),
                        true,
                    )
                }
                Some(Event::Failed(e) | Event::NoRoom(e)) => (json!({"error": e}), true),
                Some(Event::Logprob(_) | Event::Embedding(_)) => continue,
                None => return None,
            };
            let mut text = line.0.to_string();
            text.push('\n');
            return Some((
                Ok::<_, std::convert::Infallible>(text),
                (meta, rx, answer, line.1),
            ));
        }
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

impl Server {
    /// Runs the OpenAI request `map` of `kind` on the model `b` names and answers in Ollama's
    /// shapes.
    async fn ollama_complete(
        self: &Arc<Self>,
        b: &Body2,
        kind: Kind,
        mut map: Map<String, Value>,
        chat: bool,
    ) -> Result<Response> {
        let arrived = Instant::now();
        let num_ctx = common(b, &mut map, self.opts.lenient)?;
        let name = b.model()?;
        let ready = self.model(Some(&name), b.keep_alive()?).await?;
        let load = arrived.elapsed();
        check_num_ctx(num_ctx, &ready)?;
        map.insert("model".into(), json!(ready.id));
        let (fields, _) = Fields::checked(map, kind.fields(), false)?;
        let Started {
            ready,
            mut rxs,
            calls,
            think,
            stream,
            ..
        } = self.start(kind, ready, &fields, arrived).await?;
        let answer = Answer::new(think, calls.map(|p| (p.format, p.tools)));
        let meta = Meta {
            model: ready.id.clone(),
            chat,
            arrived,
            load,
        };
        let rx = rxs.remove(0);
        if stream {
            Ok(streamed(meta, rx, answer))
        } else {
            whole(meta, rx, answer).await
        }
    }
}

fn check_num_ctx(num_ctx: Option<u64>, ready: &Ready) -> Result<()> {
    match num_ctx {
        Some(n) if n > ready.limits.ctx as u64 => Err(ApiError::bad(
            "options.num_ctx",
            format!(
                "num_ctx {n} is more than the {} tokens of context '{}' is served at \
                 (serve --ctx-size)",
                ready.limits.ctx, ready.id
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const FIELDS: &[&str] = &[
        "model",
        "messages",
        "tools",
        "format",
        "options",
        "stream",
        "keep_alive",
        "think",
    ];
    let b = Body2::read(&s, &headers, body, FIELDS).await?;
    let messages = match b.get("messages") {
        Some(Value::Array(m)) => m
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
        Some(v) => {
            return Err(
                ApiError::bad("messages", format!("'messages' must be an array, got {v}")).into(),
            );
        }
    };
    if messages.is_empty() {
        // Ollama's way to load (or, with keep_alive 0, unload) a model.
        return s.preload(&b, true).await;
    }
    let mut map = Map::new();
    map.insert("messages".into(), Value::Array(messages));
    if let Some(t) = b.get("tools") {
        map.insert("tools".into(), t.clone());
    }
    s.ollama_complete(&b, Kind::Chat, map, true).await
}

/// `POST /api/generate`: `prompt` through the chat template as a user turn (with `system`
/// before it), or as is with `raw`.
pub(crate) async fn generate(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const FIELDS: &[&str] = &[
        "model",
        "prompt",
        "suffix",
        "system",
        "template",
        "context",
        "stream",
        "raw",
        "format",
        "options",
        "keep_alive",
        "images",
        "think",
    ];
    let b = Body2::read(&s, &headers, body, FIELDS).await?;
    for (k, why) in [
        ("suffix", "fill-in-the-middle is not served"),
        ("template", "the pack's own chat template is used"),
    ] {
        if b.string(k)?.is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::bad(k, format!("'{k}' is not supported: {why}")).into());
        }
    }
    if b.get("context")
        .is_some_and(|c| c.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApiError::bad(
            "context",
            "'context' (Ollama's deprecated token context) is not supported: send the conversation as /api/chat messages",
        )
        .into());
    }
    let prompt = b.string("prompt")?.unwrap_or_default();
    if prompt.is_empty() && b.get("images").is_none() {
        return s.preload(&b, false).await;
    }
    let raw = matches!(b.get("raw"), Some(Value::Bool(true)));
    let mut map = Map::new();
    if raw {
        if b.get("images").is_some() {
            return Err(
                ApiError::bad("images", "images need the chat template: drop 'raw'").into(),
            );
        }
        map.insert("prompt".into(), json!(prompt));
        s.ollama_complete(&b, Kind::Text, map, false).await
    } else {
        let mut messages = Vec::new();
        if let Some(system) = b.string("system")? {
            messages.push(json!({"role": "system", "content": system}));
        }
        let mut user = json!({"role": "user", "content": prompt});
        if let Some(images) = b.get("images") {
            user["images"] = images.clone();
        }
        messages.push(message(messages.len(), &user)?);
        map.insert("messages".into(), Value::Array(messages));
        s.ollama_complete(&b, Kind::Chat, map, false).await
    }
}

impl Server {
    /// A request with nothing to generate: loads the model (keeping it as `keep_alive` says; 0
    /// unloads it at once) and answers `done` with `done_reason` `load` or `unload`.
    async fn preload(self: &Arc<Self>, b: &Body2, chat: bool) -> Result<Response> {
        let arrived = Instant::now();
        let name = b.model()?;
        let keep = b.keep_alive()?;
        let unload = matches!(keep, Some(Some(d)) if d.is_zero());
        let id = if unload {
            let id = self.registry().resolve(Some(&name))?;
            if self.registry().on_demand() {
                self.registry().unload(self, &name)?;
            }
            id
        } else {
            self.model(Some(&name), keep).await?.id.clone()
        };
        let mut v = json!({"model": id, "created_at": created_at(), "done": true,
            "done_reason": if unload { "unload" } else { "load" },
            "total_duration": arrived.elapsed().as_nanos() as u64});
        if chat {
            v["message"] = json!({"role": "assistant", "content": ""});
        } else {
            v["response"] = json!("");
        }
        Ok(axum::Json(v).into_response())
    }
}

/// `POST /api/embed`: `input` (a string or strings) → `embeddings`, normalized, one a string.
pub(crate) async fn embed(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const FIELDS: &[&str] = &[
        "model",
        "input",
        "truncate",
        "options",
        "keep_alive",
        "dimensions",
    ];
    let b = Body2::read(&s, &headers, body, FIELDS).await?;
    let arrived = Instant::now();
    if matches!(b.get("truncate"), Some(Value::Bool(true))) {
        tracing::debug!("truncate: an input past the context is refused, not cut");
    }
    let ready = s.model(Some(&b.model()?), b.keep_alive()?).await?;
    let load = arrived.elapsed();
    if let Some(d) = b.get("dimensions")
        && d.as_u64() != Some(ready.engine.model.spec.hidden as u64)
    {
        return Err(ApiError::bad(
            "dimensions",
            format!(
                "this model's embeddings have {} dimensions and cannot be shortened; got {d}",
                ready.engine.model.spec.hidden
            ),
        )
        .into());
    }
    let list = crate::embeddings::inputs(b.get("input"))?;
    let (vectors, tokens) = crate::embeddings::embed_inputs(&s, &ready, list, arrived).await?;
    Ok(axum::Json(json!({
        "model": ready.id,
        "embeddings": vectors,
        "total_duration": arrived.elapsed().as_nanos() as u64,
        "load_duration": load.as_nanos() as u64,
        "prompt_eval_count": tokens,
    }))
    .into_response())
}

/// `POST /api/embeddings` (Ollama's older route): `prompt` → `embedding`.
pub(crate) async fn embeddings(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const FIELDS: &[&str] = &["model", "prompt", "options", "keep_alive"];
    let b = Body2::read(&s, &headers, body, FIELDS).await?;
    let arrived = Instant::now();
    let ready = s.model(Some(&b.model()?), b.keep_alive()?).await?;
    let prompt = b.string("prompt")?.unwrap_or_default();
    let list = crate::embeddings::inputs(Some(&json!(prompt)))?;
    let (mut vectors, _) = crate::embeddings::embed_inputs(&s, &ready, list, arrived).await?;
    Ok(axum::Json(json!({"embedding": vectors.pop().unwrap_or_default()})).into_response())
}

/// The `details` Ollama gives a model.
fn details(i: &ModelInfo) -> Value {
    json!({
        "parent_model": "",
        "format": "q4nx",
        "family": i.listing.family,
        "families": [i.listing.family],
        "parameter_size": "",
        "quantization_level": "Q4NX",
    })
}

/// `GET /api/tags`: every model the server serves, loaded or not.
pub(crate) async fn tags(State(s): State<Arc<Server>>, headers: HeaderMap) -> Result<Response> {
    s.authorize(&headers)?;
    s.started()?;
    let models: Vec<Value> = s
        .registry()
        .infos()
        .iter()
        .map(|i| {
            json!({
                "name": i.listing.id,
                "model": i.listing.id,
                "modified_at": rfc3339(i.listing.modified),
                "size": i.listing.bytes,
                "digest": i.listing.digest,
                "details": details(i),
            })
        })
        .collect();
    Ok(axum::Json(json!({"models": models})).into_response())
}

/// `GET /api/ps`: the models loaded now, with when each will be unloaded.
pub(crate) async fn ps(State(s): State<Arc<Server>>, headers: HeaderMap) -> Result<Response> {
    s.authorize(&headers)?;
    s.started()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let models: Vec<Value> = s
        .registry()
        .infos()
        .iter()
        .filter(|i| i.status == "loaded")
        .map(|i| {
            // Never unloaded for idleness: a date far ahead, as Ollama writes keep_alive -1.
            let expires = i.expires_in_s.map_or(now + 100 * 365 * 86_400, |e| now + e);
            json!({
                "name": i.listing.id,
                "model": i.listing.id,
                "size": i.listing.bytes,
                "digest": i.listing.digest,
                "details": details(i),
                "expires_at": rfc3339(expires),
                "size_vram": 0,
                "context_length": i.ctx,
            })
        })
        .collect();
    Ok(axum::Json(json!({"models": models})).into_response())
}

/// `POST /api/show {"model": NAME}`: what the model is, from its listing (loading it for its
/// chat template and capabilities when it is not loaded).
pub(crate) async fn show(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const FIELDS: &[&str] = &["model", "name", "verbose"];
    let b = Body2::read(&s, &headers, body, FIELDS).await?;
    let name = b.model()?;
    let id = s.registry().resolve(Some(&name))?;
    let ready = s.model(Some(&id), None).await?;
    let info = s
        .registry()
        .infos()
        .into_iter()
        .find(|i| i.listing.id == id)
        .ok_or_else(|| ApiError::internal("the model left the list"))?;
    let m = &ready.engine.model;
    let family = &info.listing.family;
    let mut capabilities = vec!["completion"];
    let template = ready.engine.text.template().map(str::to_string);
    if template.as_deref().is_some_and(|t| t.contains("tools")) {
        capabilities.push("tools");
    }
    if template
        .as_deref()
        .is_some_and(crate::think::template_thinks)
    {
        capabilities.push("thinking");
    }
    if m.pack
        .manifest
        .towers
        .iter()
        .any(|t| t.served && t.kind == "vision")
    {
        capabilities.push("vision");
    }
    capabilities.push("embedding");
    Ok(axum::Json(json!({
        "modelfile": "",
        "parameters": "",
        "template": template.unwrap_or_default(),
        "details": details(&info),
        "model_info": {
            "general.architecture": family,
            format!("{family}.context_length"): m.spec.context,
            format!("{family}.embedding_length"): m.spec.hidden,
            format!("{family}.block_count"): m.spec.layers.len(),
            "general.parameter_count": Value::Null,
        },
        "capabilities": capabilities,
        "modified_at": rfc3339(info.listing.modified),
        "verification": {"verified": info.listing.verified, "summary": info.listing.verdict},
    }))
    .into_response())
}

/// `GET /api/version`.
pub(crate) async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_API, "onebit_pipe": env!("CARGO_PKG_VERSION")}))
        .into_response()
}

/// The base64 of `bytes` (for tests and clients that send images).
#[cfg(test)]
pub(crate) fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_at_is_rfc3339_utc_with_nanoseconds() {
        let t = created_at();
        assert_eq!(t.len(), "2026-12-08T02:08:43.123456789Z".len(), "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{t}"
        );
    }

    #[test]
    fn dates_are_civil_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_695_713), "2026-12-08T02:08:33Z");
    }

    #[test]
    fn messages_become_openai_messages_with_image_parts_and_call_ids() {
        let m = json!({"role": "user", "content": "what is this?", "images": [b64(b"png")]});
        let v = message(0, &m).unwrap_or_else(|_| panic!("message"));
        assert_eq!(v["content"][0]["type"], "image_url");
        assert_eq!(
            v["content"][0]["image_url"]["url"],
            "data:image/png;base64,cG5n"
        );
        assert_eq!(v["content"][1]["text"], "what is this?");
        let m = json!({"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Paris"}}}]});
        let v = message(3, &m).unwrap_or_else(|_| panic!("message"));
        assert_eq!(v["tool_calls"][0]["id"], "call_3_0");
        assert_eq!(
            v["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        let bad = message(1, &json!({"role": "user", "content": "x", "mood": 1}));
        assert!(bad.is_err_and(|e| e.0.message.contains("mood")));
    }
}
