//! One completion's answer as OpenAI clients expect it: the whole reply object, or a stream of
//! SSE chunks ending in `[DONE]`, with usage; logged and timed when it ends, completed or dropped.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{self, ApiError, Parsed};
use super::scheduler::{Event, Summary};
use crate::logprobs::TokenLogprob;
use crate::tools::{Call, Format, Tool, call_start, parse_calls};

/// Which completion route a reply answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

impl Kind {
    /// The route's path, for logs and metrics.
    pub fn route(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Text => "/v1/completions",
        }
    }
}

/// One reply in flight; logs and records latency when it ends (completed or dropped).
pub(super) struct Reply {
    pub kind: Kind,
    pub id: String,
    pub model: String,
    pub fingerprint: String,
    pub created: u64,
    pub arrived: Instant,
    pub prompt_tokens: usize,
    pub summary: Option<Summary>,
    /// With tools: the format the answer's calls are read in, and the tools offered.
    pub calls: Option<(Format, Vec<Tool>)>,
    /// Whether the client asked for log-probabilities.
    pub logprobs: bool,
}

impl Drop for Reply {
    fn drop(&mut self) {
        let route = self.kind.route();
        match &self.summary {
            Some(s) => tracing::info!(
                target: "onebit::serve",
                id = %self.id,
                route,
                prompt_tokens = s.prompt_tokens,
                cached_tokens = s.cached_tokens,
                completion_tokens = s.completion_tokens,
                finish = s.finish.as_str(),
                ttft_ms = s.ttft.as_millis() as u64,
                total_ms = self.arrived.elapsed().as_millis() as u64,
                "completion"
            ),
            None => tracing::info!(
                target: "onebit::serve",
                id = %self.id,
                route,
                prompt_tokens = self.prompt_tokens,
                total_ms = self.arrived.elapsed().as_millis() as u64,
                "client gone before the end; slot freed"
            ),
        }
    }
}

impl Reply {
    /// The reply object around `choice` (none when null): a stream chunk or the whole reply.
    fn envelope(&self, choice: Value, usage: Option<Value>, stream: bool) -> Value {
        let object = match (self.kind, stream) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Text, _) => "text_completion",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": if choice.is_null() { json!([]) } else { json!([choice]) },
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    fn chunk(&self, choice: Value, usage: Option<Value>) -> Value {
        self.envelope(choice, usage, true)
    }

    /// One choice: a chat `delta` (stream) or `message` (whole), or a completion's `text`.
    fn choice(&self, text: &str, finish: Option<&str>, stream: bool) -> Value {
        match (self.kind, stream) {
            (Kind::Chat, true) => json!({
                "index": 0,
                "delta": if finish.is_some() && text.is_empty() { json!({}) } else { json!({"content": text}) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Text, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    fn delta(&self, text: &str, finish: Option<&str>) -> Value {
        self.choice(text, finish, true)
    }

    /// Puts `entries` into `choice` in the route's shape (nothing when none were asked for);
    /// `offset` is where their text starts in the answer.
    fn with_logprobs(&self, mut choice: Value, entries: &[TokenLogprob], offset: usize) -> Value {
        if self.logprobs {
            choice["logprobs"] = match self.kind {
                Kind::Chat => super::logprobs::chat(entries),
                Kind::Text => super::logprobs::completion(entries, offset),
            };
        }
        choice
    }

    /// OpenAI's `tool_calls` entries for `calls` (with `index` in a stream).
    fn tool_calls(&self, calls: &[Call], streamed: bool) -> Value {
        Value::Array(
            calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let mut v = json!({
                        "id": format!("call_{}_{k}", self.id),
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    });
                    if streamed {
                        v["index"] = json!(k);
                    }
                    v
                })
                .collect(),
        )
    }

    pub async fn whole(mut self, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
        let mut text = String::new();
        let mut lps = Vec::new();
        loop {
            match rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Logprob(l)) => lps.push(l),
                Some(Event::Done(s)) => {
                    self.summary = Some(s);
                    let finish = Some(api::finish_reason(s.finish));
                    let usage = api::usage(s.prompt_tokens, s.cached_tokens, s.completion_tokens);
                    let mut choice = self.with_logprobs(self.choice(&text, finish, false), &lps, 0);
                    if let Some((format, tools)) = &self.calls {
                        let out = parse_calls(*format, &text, tools);
                        if !out.calls.is_empty() {
                            let content = (!out.content.is_empty()).then_some(out.content);
                            choice["message"] = json!({"role": "assistant", "content": content,
                                "tool_calls": self.tool_calls(&out.calls, false)});
                            if s.finish == crate::generate::Finish::Stop {
                                choice["finish_reason"] = json!("tool_calls");
                            }
                        }
                    }
                    let body = self.envelope(choice, Some(usage), false);
                    return Ok(axum::Json(body).into_response());
                }
                Some(Event::Failed(e)) => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        e,
                    ));
                }
                Some(Event::NoRoom(e)) => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "server_error",
                        e,
                    ));
                }
                None => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the scheduler dropped the request",
                    ));
                }
            }
        }
    }

    pub fn stream(self, rx: UnboundedReceiver<Event>, parsed: &Parsed) -> Response {
        let include_usage = parsed.include_usage;
        // The first chunk of a chat stream carries the role, as OpenAI's does.
        let mut first = Vec::new();
        if self.kind == Kind::Chat {
            first.push(
                self.chunk(
                    json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
                    None,
                )
                .to_string(),
            );
        }
        // With tools, the answer so far and how much of it went out: text from where a call may
        // begin is held until the call is read (or turns out to be text).
        let state = (
            self,
            rx,
            std::collections::VecDeque::from(first),
            false,
            Held::default(),
            Pending::default(),
        );
        let events = futures::stream::unfold(
            state,
            move |(mut reply, mut rx, mut pending, mut ended, mut held, mut lps)| async move {
                loop {
                    if let Some(data) = pending.pop_front() {
                        let ev = SseEvent::default().data(data);
                        let state = (reply, rx, pending, ended, held, lps);
                        return Some((Ok::<_, Infallible>(ev), state));
                    }
                    if ended {
                        return None;
                    }
                    match rx.recv().await {
                        Some(Event::Text(t)) => {
                            let out = match &reply.calls {
                                Some((format, _)) => held.push(*format, &t),
                                None => t,
                            };
                            if !out.is_empty() {
                                let (entries, offset) = lps.take();
                                let d =
                                    reply.with_logprobs(reply.delta(&out, None), &entries, offset);
                                pending.push_back(reply.chunk(d, None).to_string());
                            }
                        }
                        Some(Event::Logprob(l)) => lps.push(l),
                        Some(Event::Done(s)) => {
                            reply.summary = Some(s);
                            let usage =
                                api::usage(s.prompt_tokens, s.cached_tokens, s.completion_tokens);
                            let mut fin = api::finish_reason(s.finish);
                            if let Some((format, tools)) = &reply.calls {
                                let (rest, calls) = held.finish(*format, tools);
                                if !rest.is_empty() {
                                    let c = reply.chunk(reply.delta(&rest, None), None);
                                    pending.push_back(c.to_string());
                                }
                                if !calls.is_empty() {
                                    if s.finish == crate::generate::Finish::Stop {
                                        fin = "tool_calls";
                                    }
                                    let choice = json!({"index": 0,
                                        "delta": {"tool_calls": reply.tool_calls(&calls, true)},
                                        "logprobs": null, "finish_reason": null});
                                    pending.push_back(reply.chunk(choice, None).to_string());
                                }
                            }
                            let (entries, offset) = lps.take();
                            let d = reply.delta("", Some(fin));
                            let d = if entries.is_empty() {
                                d
                            } else {
                                reply.with_logprobs(d, &entries, offset)
                            };
                            let last = reply.chunk(d, Some(usage.clone()));
                            pending.push_back(last.to_string());
                            if include_usage {
                                pending
                                    .push_back(reply.chunk(Value::Null, Some(usage)).to_string());
                            }
                            // The end marker is the bare word, not JSON.
                            pending.push_back("[DONE]".into());
                            ended = true;
                        }
                        Some(Event::Failed(e)) => {
                            let err =
                                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e);
                            pending.push_back(err.body().to_string());
                            ended = true;
                        }
                        Some(Event::NoRoom(e)) => {
                            let err =
                                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", e);
                            pending.push_back(err.body().to_string());
                            ended = true;
                        }
                        None => return None,
                    }
                }
            },
        );
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response()
    }
}

/// Log-probabilities of a stream not sent yet, and the answer's bytes they follow.
#[derive(Default)]
struct Pending {
    entries: Vec<TokenLogprob>,
    sent_bytes: usize,
}

impl Pending {
    fn push(&mut self, l: TokenLogprob) {
        self.entries.push(l);
    }

    /// The entries to send with the next chunk, and where their text starts.
    fn take(&mut self) -> (Vec<TokenLogprob>, usize) {
        let at = self.sent_bytes;
        self.sent_bytes += self.entries.iter().map(|e| e.piece.len()).sum::<usize>();
        (std::mem::take(&mut self.entries), at)
    }
}

/// A tool request's streamed answer: all text so far, and how much of it went out as content.
#[derive(Default)]
struct Held {
    all: String,
    sent: usize,
}

impl Held {
    /// Adds `piece`; returns the content that can go out now, everything before where a call
    /// may begin.
    fn push(&mut self, format: Format, piece: &str) -> String {
        self.all.push_str(piece);
        let safe = call_start(format, &self.all)
            .unwrap_or(self.all.len())
            .max(self.sent);
        let out = self.all[self.sent..safe].to_string();
        self.sent = safe;
        out
    }

    /// At the end: the content not sent yet, and the calls the answer holds.
    fn finish(&self, format: Format, tools: &[Tool]) -> (String, Vec<Call>) {
        let out = parse_calls(format, &self.all, tools);
        if out.calls.is_empty() {
            return (self.all[self.sent..].to_string(), Vec::new());
        }
        let at = call_start(format, &self.all)
            .unwrap_or(self.sent)
            .max(self.sent);
        (self.all[self.sent..at].trim_end().to_string(), out.calls)
    }
}
