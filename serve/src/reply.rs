//! One completion's answer as OpenAI clients expect it: the whole reply object, or a stream of
//! SSE chunks ending in `[DONE]`, with usage; logged and timed when it ends, completed or dropped.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::answer::{Answer, Out};
use super::api::{self, ApiError};
use super::job::{Event, Summary};
use crate::tool_calls::{Call, Format, Tool};
use onebit_runtime::logprobs::TokenLogprob;

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

    /// The fields the route reads.
    pub fn fields(self) -> &'static super::values::Route {
        match self {
            Kind::Chat => &api::CHAT,
            Kind::Text => &api::COMPLETION,
        }
    }

    /// The field that holds the prompt.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Kind::Chat => "messages",
            Kind::Text => "prompt",
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
    /// `Some(opened)`: the answer's reasoning is split from its content (`opened`: the prompt
    /// opened the reasoning block).
    pub think: Option<bool>,
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
    /// The reply object around `choices` (one choice, an array of them, or none when null): a
    /// stream chunk or the whole reply.
    fn envelope(&self, choices: Value, usage: Option<Value>, stream: bool) -> Value {
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
            "choices": match choices {
                Value::Null => json!([]),
                Value::Array(a) => Value::Array(a),
                one => json!([one]),
            },
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    fn chunk(&self, choice: Value, usage: Option<Value>) -> Value {
        self.envelope(choice, usage, true)
    }

    /// Choice `k`: a chat `delta` (stream) or `message` (whole), or a completion's `text`.
    fn choice(&self, k: usize, text: &str, finish: Option<&str>, stream: bool) -> Value {
        match (self.kind, stream) {
            (Kind::Chat, true) => json!({
                "index": k,
                "delta": if finish.is_some() && text.is_empty() { json!({}) } else { json!({"content": text}) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Chat, false) => json!({
                "index": k,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Text, _) => {
                json!({"index": k, "text": text, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    fn delta(&self, k: usize, text: &str, finish: Option<&str>) -> Value {
        self.choice(k, text, finish, true)
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

    /// OpenAI's `tool_calls` entries for choice `choice`'s `calls` (with `index` in a stream).
    fn tool_calls(&self, choice: usize, calls: &[Call], streamed: bool) -> Value {
        Value::Array(
            calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let mut v = json!({
                        "id": format!("call_{}_{choice}_{k}", self.id),
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

    /// A new answer for one choice.
    fn answer(&self) -> Answer {
        Answer::new(self.think, self.calls.clone())
    }

    /// Choice `k` of a whole reply: its text read into reasoning, content and calls.
    fn whole_choice(&self, k: usize, text: &str, lps: &[TokenLogprob], s: &Summary) -> Value {
        let mut finish = api::finish_reason(s.finish);
        let mut choice = self.choice(k, text, Some(finish), false);
        if self.kind == Kind::Chat && (self.think.is_some() || self.calls.is_some()) {
            let (out, calls) = self.answer().whole(text);
            let mut message = json!({"role": "assistant", "content": out.content});
            if !out.reasoning.is_empty() {
                message["reasoning_content"] = json!(out.reasoning);
            }
            if !calls.is_empty() {
                if out.content.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = self.tool_calls(k, &calls, false);
                if s.finish == onebit_runtime::generate::Finish::Stop {
                    finish = "tool_calls";
                }
            }
            choice["message"] = message;
            choice["finish_reason"] = json!(finish);
        }
        self.with_logprobs(choice, lps, 0)
    }

    /// Receives every choice's events, tagged with the choice's index.
    fn merged(
        rxs: Vec<UnboundedReceiver<Event>>,
    ) -> impl futures::Stream<Item = (usize, Option<Event>)> + Unpin + Send {
        futures::stream::select_all(rxs.into_iter().enumerate().map(|(k, rx)| {
            Box::pin(futures::stream::unfold(Some(rx), move |rx| async move {
                let mut rx = rx?;
                match rx.recv().await {
                    Some(e) => Some(((k, Some(e)), Some(rx))),
                    // A closed channel says so once.
                    None => Some(((k, None), None)),
                }
            }))
        }))
    }

    /// Counts of all choices together: the prompt once, every choice's generated tokens.
    fn total(summaries: &[Option<Summary>]) -> Option<Summary> {
        let mut all = summaries.iter().flatten();
        let first = *all.next()?;
        Some(all.fold(first, |mut t, s| {
            t.completion_tokens += s.completion_tokens;
            t
        }))
    }

    /// The whole reply, once every choice has ended.
    pub async fn whole(mut self, rxs: Vec<UnboundedReceiver<Event>>) -> Result<Response, ApiError> {
        use futures::StreamExt;
        let n = rxs.len();
        let mut texts = vec![String::new(); n];
        let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
        let mut summaries: Vec<Option<Summary>> = vec![None; n];
        let mut events = Self::merged(rxs);
        while summaries.iter().any(Option::is_none) {
            let Some((k, event)) = events.next().await else {
                break;
            };
            match event {
                Some(Event::Text(t)) => texts[k].push_str(&t),
                Some(Event::Logprob(l)) => lps[k].push(l),
                Some(Event::Done(s)) => summaries[k] = Some(s),
                // Only embedding requests get vectors.
                Some(Event::Embedding(_)) => {}
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
                // A choice's channel closes once it is done; before that, it was dropped.
                None if summaries[k].is_some() => {}
                None => break,
            }
        }
        let Some(total) = Self::total(&summaries).filter(|_| summaries.iter().all(Option::is_some))
        else {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the scheduler dropped the request",
            ));
        };
        self.summary = Some(total);
        let choices: Vec<Value> = summaries
            .iter()
            .flatten()
            .enumerate()
            .map(|(k, s)| self.whole_choice(k, &texts[k], &lps[k], s))
            .collect();
        let usage = api::usage(
            total.prompt_tokens,
            total.cached_tokens,
            total.completion_tokens,
        );
        let body = self.envelope(Value::Array(choices), Some(usage), false);
        Ok(axum::Json(body).into_response())
    }

    /// The chunks that `out` of choice `k` makes: reasoning, then content, the log-probabilities
    /// not sent yet with the first of them.
    fn out_chunks(&self, k: usize, out: Out, answer: &mut Answer, pending: &mut Vec<String>) {
        let mut deltas = Vec::new();
        if !out.reasoning.is_empty() {
            deltas.push(
                json!({"index": k, "delta": {"reasoning_content": out.reasoning},
                "logprobs": null, "finish_reason": null}),
            );
        }
        if !out.content.is_empty() {
            deltas.push(self.delta(k, &out.content, None));
        }
        if let Some(first) = deltas.first_mut() {
            let (entries, offset) = answer.take_logprobs();
            *first = self.with_logprobs(first.take(), &entries, offset);
        }
        pending.extend(deltas.into_iter().map(|d| self.chunk(d, None).to_string()));
    }

    /// The end of choice `k`'s stream: what it held back, its calls, and its finish chunk
    /// (with the usage of all choices when `usage` is given: it is the last to end).
    fn end_chunks(
        &self,
        k: usize,
        s: &Summary,
        answer: &mut Answer,
        usage: Option<Value>,
        pending: &mut Vec<String>,
    ) {
        let (out, calls) = answer.finish();
        self.out_chunks(k, out, answer, pending);
        let mut fin = api::finish_reason(s.finish);
        if !calls.is_empty() {
            if s.finish == onebit_runtime::generate::Finish::Stop {
                fin = "tool_calls";
            }
            let choice = json!({"index": k,
                "delta": {"tool_calls": self.tool_calls(k, &calls, true)},
                "logprobs": null, "finish_reason": null});
            pending.push(self.chunk(choice, None).to_string());
        }
        let (entries, offset) = answer.take_logprobs();
        let d = self.delta(k, "", Some(fin));
        let d = if entries.is_empty() {
            d
        } else {
            self.with_logprobs(d, &entries, offset)
        };
        pending.push(self.chunk(d, usage).to_string());
    }

    /// The reply as server-sent events, every choice's chunks as they come, then `[DONE]`.
    pub fn stream(self, rxs: Vec<UnboundedReceiver<Event>>, include_usage: bool) -> Response {
        use futures::StreamExt;
        let n = rxs.len();
        // The first chunk of a chat stream carries the role, as OpenAI's does.
        let mut first = Vec::new();
        if self.kind == Kind::Chat {
            for k in 0..n {
                let role = json!({"index": k, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null});
                first.push(self.chunk(role, None).to_string());
            }
        }
        let answers: Vec<Answer> = (0..n).map(|_| self.answer()).collect();
        let state = Stream {
            reply: self,
            events: Box::pin(Self::merged(rxs)),
            pending: std::collections::VecDeque::from(first),
            ended: false,
            answers,
            summaries: vec![None; n],
        };
        let events = futures::stream::unfold(state, move |mut st| async move {
            loop {
                if let Some(data) = st.pending.pop_front() {
                    let ev = SseEvent::default().data(data);
                    return Some((Ok::<_, Infallible>(ev), st));
                }
                if st.ended {
                    return None;
                }
                let (k, event) = st.events.next().await?;
                let mut out = Vec::new();
                match event {
                    Some(Event::Text(t)) => {
                        let o = st.answers[k].push(&t);
                        st.reply.out_chunks(k, o, &mut st.answers[k], &mut out);
                    }
                    Some(Event::Logprob(l)) => st.answers[k].logprob(l),
                    Some(Event::Embedding(_)) => {}
                    Some(Event::Done(s)) => {
                        st.summaries[k] = Some(s);
                        let all_done = st.summaries.iter().all(Option::is_some);
                        let total = Self::total(&st.summaries).filter(|_| all_done);
                        let usage = total.map(|t| {
                            api::usage(t.prompt_tokens, t.cached_tokens, t.completion_tokens)
                        });
                        st.reply
                            .end_chunks(k, &s, &mut st.answers[k], usage.clone(), &mut out);
                        if let (Some(t), Some(usage)) = (total, usage) {
                            st.reply.summary = Some(t);
                            if include_usage {
                                out.push(st.reply.chunk(Value::Null, Some(usage)).to_string());
                            }
                            // The end marker is the bare word, not JSON.
                            out.push("[DONE]".into());
                            st.ended = true;
                        }
                    }
                    Some(Event::Failed(e)) => {
                        let err =
                            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e);
                        out.push(err.body().to_string());
                        st.ended = true;
                    }
                    Some(Event::NoRoom(e)) => {
                        let err = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", e);
                        out.push(err.body().to_string());
                        st.ended = true;
                    }
                    None if st.summaries[k].is_some() => {}
                    None => return None,
                }
                st.pending.extend(out);
            }
        });
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response()
    }
}

/// A stream's state between chunks.
struct Stream {
    reply: Reply,
    events: std::pin::Pin<Box<dyn futures::Stream<Item = (usize, Option<Event>)> + Send>>,
    pending: std::collections::VecDeque<String>,
    ended: bool,
    answers: Vec<Answer>,
    summaries: Vec<Option<Summary>>,
}
