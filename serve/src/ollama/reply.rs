//! Ollama's replies: newline-delimited JSON pieces or one object, with `created_at`, and the last
//! with `done_reason`, the tool calls and the counts and durations in nanoseconds.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::request::Result;
use crate::answer::Answer;
use crate::api::{self, ApiError};
use crate::job::{Event, Summary};
use crate::tool_calls::Call;

/// What a reply needs beside its events.
pub(super) struct Meta {
    pub(super) model: String,
    /// `/api/chat` answers `message`, `/api/generate` answers `response`.
    pub(super) chat: bool,
    pub(super) arrived: Instant,
    pub(super) load: Duration,
}

/// `created_at`: RFC 3339 in UTC with nanoseconds, as Ollama writes it.
pub(super) fn created_at() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}

/// RFC 3339 in UTC of `secs` since the epoch.
pub(super) fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
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
pub(super) async fn whole(
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
pub(super) fn streamed(meta: Meta, rx: UnboundedReceiver<Event>, answer: Answer) -> Response {
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
