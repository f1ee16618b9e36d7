//! A completion request, chat or plain, from its body to its reply, each step once: the body
//! opened and its fields read ([`Server::open`], [`crate::api`]), the parsed request bound to the
//! loaded model ([`Server::bind`]: the prompt as its template renders it, the grammar, the token
//! ids and the generation request, built whole), the job submitted with a fork per further
//! choice, and the reply streamed or returned whole.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::UnboundedReceiver;

use onebit_runtime::generate::{Request as GenRequest, checked_prompt};
use onebit_runtime::{Error, ImageEmbeds, Model};

use crate::api::{self, ApiError, Parsed};
use crate::job::{Event, Fork, Job};
use crate::reply::{Kind, Reply};
use crate::tool_fields::{self, ToolPlan};
use crate::{Ready, Server, now_secs};

/// A request bound to the loaded model: what the scheduler runs and what its reply needs.
struct Bound {
    /// The prompt's token ids, checked to fit the context.
    ids: Vec<u32>,
    /// The generation request, whole.
    req: GenRequest,
    /// With tools: how the answer's calls are read.
    calls: Option<ToolPlan>,
    /// `Some(opened)`: the answer's reasoning is split from its content.
    think: Option<bool>,
    /// Choices.
    n: usize,
    /// Server-sent events.
    stream: bool,
    /// A last chunk with usage.
    include_usage: bool,
}

/// A completion whose job is running: what its reply needs.
pub(crate) struct Started {
    /// The model it runs on.
    pub ready: Arc<Ready>,
    /// Each choice's events.
    pub rxs: Vec<UnboundedReceiver<Event>>,
    /// With tools: how the answer's calls are read.
    pub calls: Option<ToolPlan>,
    /// `Some(opened)`: the answer's reasoning is split from its content.
    pub think: Option<bool>,
    /// Streamed.
    pub stream: bool,
    /// A last chunk with usage.
    pub include_usage: bool,
    /// The prompt's tokens.
    pub prompt_tokens: usize,
    /// Log-probabilities asked for.
    pub logprobs: bool,
}

/// The refusal of a prompt the model cannot take, naming the field it came from: a prompt past
/// the context (`context_length_exceeded`), a grammar the engine cannot compile (its own field),
/// or a prompt the template or tokenizer refuses.
fn prompt_refusal(kind: Kind, e: Error) -> ApiError {
    let param = kind.prompt_param();
    match e {
        Error::ContextExceeded(c) => {
            ApiError::bad(param, c.to_string()).with_code("context_length_exceeded")
        }
        Error::Request { field, reason } if field != "prompt" && field != "messages" => {
            ApiError::bad(field, reason)
        }
        Error::Request { reason, .. } => ApiError::bad(param, reason),
        other => ApiError::bad(param, format!("cannot prepare the prompt: {other}")),
    }
}

/// The request's images encoded by the model's vision tower (each content once: the encoder
/// keeps recent images by digest); refused by name for a model that takes no images.
fn encode_images(model: &Model, images: &[Vec<u8>]) -> Result<Vec<Arc<ImageEmbeds>>, Error> {
    if images.is_empty() {
        return Ok(Vec::new());
    }
    let enc = model.image_encoder()?;
    images.iter().map(|b| enc.encode(b)).collect()
}

/// The scheduler's job for `bound`'s request, with a fork per further choice (choice k samples
/// with the seed + k: the same seed gives the same choices), and each choice's receiver.
fn job(
    ids: Vec<u32>,
    req: GenRequest,
    n: usize,
    arrived: Instant,
) -> (Job, Vec<UnboundedReceiver<Event>>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut rxs = vec![rx];
    let forks = (1..n as u64)
        .map(|k| {
            let (events, rx) = tokio::sync::mpsc::unbounded_channel();
            rxs.push(rx);
            Fork {
                seed: req.sampler.seed.wrapping_add(k),
                events,
            }
        })
        .collect();
    let job = Job {
        ids,
        req,
        events: tx,
        arrived,
        forks,
        embed: None,
        hold: None,
    };
    (job, rxs)
}

impl Server {
    /// Answers a completion request of `kind`; every refusal is an OpenAI error body.
    pub(crate) async fn complete(
        self: Arc<Self>,
        kind: Kind,
        headers: HeaderMap,
        body: Body,
    ) -> Response {
        match self.clone().try_complete(kind, headers, body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        }
    }

    async fn try_complete(
        self: Arc<Self>,
        kind: Kind,
        headers: HeaderMap,
        body: Body,
    ) -> Result<Response, ApiError> {
        let arrived = Instant::now();
        let (ready, fields, ignored) = self.open(&headers, body, kind.fields()).await?;
        let started = self.start(kind, ready, &fields, arrived).await?;
        let id = format!(
            "{}-{:x}{:06x}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            now_secs(),
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let reply = Reply {
            kind,
            id,
            model: started.ready.id.clone(),
            fingerprint: started.ready.fingerprint.clone(),
            created: now_secs(),
            arrived,
            prompt_tokens: started.prompt_tokens,
            summary: None,
            calls: started.calls.map(|p| (p.format, p.tools)),
            logprobs: started.logprobs,
            think: started.think,
        };
        let mut resp = if started.stream {
            reply.stream(started.rxs, started.include_usage)
        } else {
            reply.whole(started.rxs).await?
        };
        if !ignored.is_empty() {
            let text = format!(
                "299 onebit-pipe \"unknown fields ignored: {}\"",
                ignored.join(", ")
            );
            if let Ok(v) = header::HeaderValue::from_str(&text) {
                resp.headers_mut().insert(header::WARNING, v);
            }
        }
        Ok(resp)
    }

    /// Starts a completion of `kind` from its read `fields` on `ready`: parsed, bound, its job
    /// submitted; what its reply (OpenAI's or Ollama's) needs comes back.
    pub(crate) async fn start(
        &self,
        kind: Kind,
        ready: Arc<Ready>,
        fields: &crate::values::Fields,
        arrived: Instant,
    ) -> Result<Started, ApiError> {
        let parsed = match kind {
            Kind::Chat => api::chat(fields)?,
            Kind::Text => api::completion(fields)?,
        };
        let Bound {
            ids,
            req,
            calls,
            think,
            n,
            stream,
            include_usage,
        } = self.bind(&ready, kind, parsed).await?;
        let prompt_tokens = ids.len();
        let logprobs = req.logprobs.is_some();
        let (job, rxs) = job(ids, req, n, arrived);
        ready.submit(job)?;
        Ok(Started {
            ready,
            rxs,
            calls,
            think,
            stream,
            include_usage,
            prompt_tokens,
            logprobs,
        })
    }

    /// Binds `parsed` to the loaded model in one step: the model it names and its `logit_bias`
    /// checked against it, the prompt as its template renders it (reasoning effort, tools for a
    /// template without a tool format), the tool plan and the grammar compiled, the prompt
    /// tokenized and checked against the context, and the generation request built whole.
    async fn bind(
        &self,
        ready: &Arc<Ready>,
        kind: Kind,
        parsed: Parsed,
    ) -> Result<Bound, ApiError> {
        let Parsed {
            common,
            prompt,
            tools,
            logprobs,
            reasoning_effort,
            images,
        } = parsed;
        let text = &ready.engine.text;
        api::check_logit_bias(&common.sampler, ready.engine.model.spec.vocab)?;
        let prompt = match &reasoning_effort {
            Some(effort) => api::with_reasoning_effort(prompt, text.template(), effort)?,
            None => prompt,
        };
        if common.n > ready.limits.slots {
            return Err(ApiError::bad(
                "n",
                format!(
                    "n = {} needs a slot per choice; this server runs {} (--parallel)",
                    common.n, ready.limits.slots
                ),
            ));
        }
        let prompt = tool_fields::generic_prompt(prompt, text, tools.as_ref());
        let calls = tool_fields::tool_plan(text, tools.as_ref(), common.format.is_some())?;
        let grammar = tool_fields::grammar_of(common.format.as_ref(), calls.as_ref());
        // A grammar holds the answer from its first token, so it opens no reasoning block.
        let held = grammar.is_some();
        let ctx = ready.limits.ctx;
        let engine = ready.engine.clone();
        let (prompt, ids, constraint, images) = tokio::task::spawn_blocking(move || {
            let constraint = match &grammar {
                Some((spec, field)) => Some(engine.grammars.compile(&engine.text, spec, field)?),
                None => None,
            };
            let images = encode_images(&engine.model, &images)?;
            let ids = checked_prompt(&engine.model, &engine.text, &prompt, ctx)?;
            if let Some(enc) = engine.model.images() {
                enc.places(&ids, &images)?;
            }
            Ok::<_, Error>((prompt, ids, constraint, images))
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| prompt_refusal(kind, e))?;
        let req = GenRequest {
            prompt,
            max_tokens: common.max_tokens.unwrap_or(ctx - ids.len()),
            sampler: common.sampler,
            stop: common.stop,
            constraint,
            keep_special: calls.is_some(),
            logprobs,
            images,
        };
        let think = self.splits_reasoning(kind, text, &ids).filter(|_| !held);
        Ok(Bound {
            ids,
            req,
            calls,
            think,
            n: common.n,
            stream: common.stream,
            include_usage: common.include_usage,
        })
    }
}
