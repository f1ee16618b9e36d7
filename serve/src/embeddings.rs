//! `POST /v1/embeddings` in OpenAI's shape: `input` as a string, a list of strings, a list of
//! token ids or a list of such lists; `encoding_format` `float` (default) or `base64` (the f32
//! values' little-endian bytes, as the `openai` client asks for by default). Each input is read
//! as one request of the scheduler, batched with everybody else's rows, and pooled by the
//! server's `--pooling` ([`onebit_runtime::embed`]). At most `--parallel` inputs are in flight at once, so
//! a long list never fills the queue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::ApiError;
use super::job::{Event, Job};
use super::values::{Route, Unknown};
use super::{Ready, Server};
use onebit_runtime::generate::{Prompt, Request, checked_prompt};

/// The fields this route reads.
const FIELDS: Route = Route {
    fields: &[&["input", "model", "encoding_format", "dimensions", "user"]],
    unknown: Unknown::ListsFields,
};

/// One input, as text or as token ids.
pub(crate) enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// The inputs of `input`, in order.
pub(crate) fn inputs(v: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    let ids = |a: &[Value], field: &str| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| ApiError::bad(field, format!("{t} is not a token id")))
            })
            .collect()
    };
    let list = match v {
        Some(Value::String(s)) => return Ok(vec![Input::Text(s.clone())]),
        Some(Value::Array(a)) if !a.is_empty() => a,
        None | Some(Value::Null) => return Err(ApiError::bad("input", "'input' is required")),
        Some(_) => {
            return Err(ApiError::bad(
                "input",
                "'input' must be a string, an array of strings, an array of token ids, or an \
                 array of such arrays (not empty)",
            ));
        }
    };
    if list.iter().all(Value::is_number) {
        return Ok(vec![Input::Tokens(ids(list, "input")?)]);
    }
    list.iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::String(s) => Ok(Input::Text(s.clone())),
            Value::Array(a) if !a.is_empty() => ids(a, &format!("input[{i}]")).map(Input::Tokens),
            other => Err(ApiError::bad(
                format!("input[{i}]"),
                format!(
                    "each input must be a string or a non-empty array of token ids, got {other}"
                ),
            )),
        })
        .collect()
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let (ready, b, _) = s.open(&headers, body, &FIELDS).await?;
    let base64 = match b.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => {
            return Err(ApiError::bad(
                "encoding_format",
                format!("'encoding_format' must be \"float\" or \"base64\", got {v}"),
            ));
        }
    };
    let width = ready.engine.model.spec.hidden;
    match b.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(d) if d.as_u64() == Some(width as u64) => {}
        Some(d) => {
            return Err(ApiError::bad(
                "dimensions",
                format!(
                    "this model's embeddings have {width} dimensions and cannot be shortened; got {d}"
                ),
            ));
        }
    }
    let list = inputs(b.get("input"))?;
    let (vectors, tokens) = embed_inputs(&s, &ready, list, arrived).await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": ready.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// The pooled, normalized vectors of `list` on `ready`, in order, and the tokens they read
/// (each input checked against the context, naming `input[i]`).
pub(crate) async fn embed_inputs(
    s: &Server,
    ready: &Arc<Ready>,
    list: Vec<Input>,
    arrived: Instant,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let many = list.len() > 1;
    let e = ready.engine.clone();
    let ctx = ready.limits.ctx;
    let prompts = tokio::task::spawn_blocking(move || {
        list.into_iter()
            .enumerate()
            .map(|(i, input)| {
                let field = if many {
                    format!("input[{i}]")
                } else {
                    "input".to_string()
                };
                let prompt = match input {
                    Input::Text(t) => Prompt::Text(t),
                    Input::Tokens(ids) => Prompt::Tokens(ids),
                };
                checked_prompt(&e.model, &e.text, &prompt, ctx)
                    .map(|ids| (ids, Request::read_only(prompt)))
                    .map_err(|err| match err {
                        onebit_runtime::Error::Request { reason, .. } => {
                            ApiError::bad(field, reason)
                        }
                        onebit_runtime::Error::ContextExceeded(c) => {
                            ApiError::bad(field, c.to_string())
                        }
                        other => ApiError::bad(field, other.to_string()),
                    })
            })
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await
    .map_err(ApiError::internal)??;
    let pooling = s.opts.pooling;
    let mut vectors = Vec::with_capacity(prompts.len());
    let mut tokens = 0;
    let mut flight: VecDeque<UnboundedReceiver<Event>> = VecDeque::new();
    let mut queued = prompts.into_iter();
    loop {
        while flight.len() < ready.limits.slots {
            let Some((ids, req)) = queued.next() else {
                break;
            };
            tokens += ids.len();
            let (events, rx) = tokio::sync::mpsc::unbounded_channel();
            ready.submit(Job {
                ids,
                req,
                events,
                arrived,
                forks: Vec::new(),
                embed: Some(pooling),
                hold: None,
            })?;
            flight.push_back(rx);
        }
        let Some(rx) = flight.pop_front() else {
            break;
        };
        vectors.push(vector(rx).await?);
    }
    Ok((vectors, tokens))
}

/// The vector one embedding job sends.
async fn vector(mut rx: UnboundedReceiver<Event>) -> Result<Vec<f32>, ApiError> {
    let mut out = None;
    loop {
        match rx.recv().await {
            Some(Event::Embedding(v)) => out = Some(v),
            Some(Event::Done(_)) => {
                return out
                    .ok_or_else(|| ApiError::internal("the embedding ended without a vector"));
            }
            Some(Event::Failed(e)) => return Err(ApiError::internal(e)),
            Some(Event::NoRoom(e)) => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    e,
                ));
            }
            Some(Event::Text(_) | Event::Logprob(_)) => {}
            None => return Err(ApiError::internal("the scheduler dropped the request")),
        }
    }
}
