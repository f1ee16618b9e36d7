//! The OpenAI-compatible HTTP server behind `onebit-pipe serve` (feature `server`).
//!
//! Routes: `GET /health` (503 while loading, 200 when ready), `GET /v1/models[/{id}]`,
//! `POST /v1/chat/completions` and `POST /v1/completions` (JSON or server-sent events ending
//! in `data: [DONE]`), `GET /metrics` (Prometheus text). Requests are validated in [`api`],
//! run by the continuous-batching [`scheduler`], and counted in [`metrics`]. The server binds
//! and answers `/health` before the model is loaded, so a supervisor can watch it come up.

mod answer;
pub mod api;
mod batch_shape;
mod body;
mod cors;
mod embeddings;
mod error;
mod fields;
#[cfg(test)]
mod fuzz_tests;
mod info;
mod logprobs;
pub mod metrics;
mod prefix;
mod reply;
pub mod scheduler;
#[cfg(test)]
mod scheduler_tests;
mod structured;
mod tokens;
mod tools;
mod values;
mod webui;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::error::Error;
use crate::generate::{Request as GenRequest, checked_prompt};
use api::ApiError;
use body::read_body;
pub use cors::check_origin;
use info::{health, metrics_text, model, models, props, report};
pub use metrics::Metrics;
use reply::{Kind, Reply};
use scheduler::{Busy, Fork, Job, Scheduler};
pub use scheduler::{Engine, Limits};

/// How the server behaves; fixed at start.
#[derive(Clone, Debug)]
pub struct Options {
    /// The model id clients see (`--alias`); `None`: the pack's source repository.
    pub alias: Option<String>,
    /// Required bearer token, if any.
    pub api_key: Option<String>,
    /// Largest request body in bytes (413 beyond).
    pub max_body: usize,
    /// Scheduler limits; `ctx` 0 means min(model context, [`DEFAULT_CTX`]).
    pub limits: Limits,
    /// Builds the verification report (HTML) of the served pack for `/report/<model>`; `None`:
    /// the pack is not in a store, so there is no report to show.
    pub report: Option<ReportSource>,
    /// `--lenient`: fields this server does not read are dropped, named in a `Warning` header,
    /// instead of refused with a 400.
    pub lenient: bool,
    /// `--cors-origin`: the browser origins allowed to call the API (`*` for any); empty: no
    /// CORS headers, so pages of other origins cannot read the answers.
    pub cors_origins: Vec<String>,
    /// `--reasoning-format`: whether a thinking model's reasoning comes back apart from its
    /// content.
    pub reasoning: ReasoningFormat,
    /// `--pooling`: how `/v1/embeddings` pools a text's token states.
    pub pooling: crate::embed::Pooling,
    /// The chat page at `/` (`serve --no-webui` turns it off).
    pub webui: bool,
}

/// Where a thinking model's reasoning goes in a chat answer (llama-server's
/// `--reasoning-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `deepseek`: the text between `<think>` and `</think>` comes back as `reasoning_content`
    /// (`delta.reasoning_content` streamed), the rest as `content`.
    #[default]
    Deepseek,
    /// `none`: the whole answer, tags included, is `content`.
    None,
}

/// Writes the served pack's report page, or says why it cannot. Called on a thread of its own for
/// each `/report/<model>` request (it reads the store's catalog, which takes a fraction of a second).
#[derive(Clone)]
pub struct ReportSource(pub Arc<dyn Fn() -> Result<String, String> + Send + Sync>);

impl std::fmt::Debug for ReportSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReportSource")
    }
}

/// Context per sequence when none is asked for and the model allows more.
pub const DEFAULT_CTX: usize = 4096;

enum Phase {
    Loading,
    Ready(Arc<Ready>),
    Failed(String),
}

struct Ready {
    id: String,
    limits: Limits,
    fingerprint: String,
    engine: Arc<Engine>,
    scheduler: Scheduler,
}

impl Ready {
    /// Refuses a request that names another model (404, as OpenAI answers).
    fn check_model(&self, named: Option<&str>) -> Result<(), ApiError> {
        match named {
            Some(m) if m != self.id => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model '{m}' does not exist here; this server serves '{}'",
                    self.id
                ),
                kind: "invalid_request_error",
                param: Some("model".into()),
                code: Some("model_not_found"),
            }),
            _ => Ok(()),
        }
    }

    /// Queues `job`, or answers 503 (busy) or 500 (the scheduler stopped).
    fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.scheduler.submit(job).map_err(|b| match b {
            Busy::Full => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!(
                    "the server is busy: {} requests are running and {} waiting (--parallel, --queue)",
                    self.limits.slots, self.limits.queue
                ),
            )
            .with_code("server_overloaded"),
            Busy::Stopped => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the scheduler has stopped",
            ),
        })
    }
}

/// Shared server state: the loading phase, options, metrics.
pub struct Server {
    phase: RwLock<Phase>,
    opts: Options,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Server {
    /// A server that is still loading its model.
    pub fn new(opts: Options) -> Arc<Server> {
        Arc::new(Server {
            phase: RwLock::new(Phase::Loading),
            opts,
            metrics: Arc::new(Metrics::new()),
            next_id: AtomicU64::new(1),
        })
    }

    /// The model is loaded: start the scheduler and answer requests. Returns the limits it
    /// serves at (the context decided from the model when none was asked for), or why it cannot
    /// serve (then `/health` says so too).
    pub fn ready(&self, engine: Engine) -> Result<Limits, String> {
        let pv = &engine.model.pack.manifest.provenance;
        let id = self.opts.alias.clone().unwrap_or_else(|| {
            let src = std::path::Path::new(&pv.source);
            if src.is_absolute() {
                src.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| pv.source.clone())
            } else {
                pv.source.clone()
            }
        });
        let fingerprint = pv
            .stage_keys
            .get("repack")
            .or_else(|| pv.stage_keys.values().next())
            .map(|k| format!("onebit-{}", &k[..k.len().min(12)]))
            .unwrap_or_else(|| "onebit".into());
        let mut limits = self.opts.limits;
        if limits.ctx == 0 {
            limits.ctx = engine.model.spec.context.min(DEFAULT_CTX);
        }
        if let Err(e) = engine.model.checked_context(limits.ctx) {
            tracing::error!(error = %e, "cannot serve at this context size");
            self.failed(e.to_string());
            return Err(e.to_string());
        }
        let memory = engine.model.cache_memory();
        let budget = limits
            .cache_budget
            .unwrap_or_else(|| crate::kv::available_memory().map_or(usize::MAX, |a| a / 10 * 9));
        memory.set_limit(budget);
        let full = limits
            .slots
            .saturating_mul(engine.model.session_bytes(limits.ctx));
        if full > budget {
            tracing::warn!(
                full_mib = full >> 20,
                budget_mib = budget >> 20,
                "the KV caches of every slot at full context exceed their budget: a request \
                 that needs more than is left gets 503"
            );
        }
        self.metrics.kv_cache(memory);
        let engine = Arc::new(engine);
        let scheduler = Scheduler::start(engine.clone(), limits, self.metrics.clone());
        tracing::info!(model = %id, slots = limits.slots, ctx = limits.ctx, "ready");
        self.metrics.ready.set(1);
        self.set(Phase::Ready(Arc::new(Ready {
            id,
            limits,
            fingerprint,
            engine,
            scheduler,
        })));
        Ok(limits)
    }

    /// Loading failed: `/health` says why; completions answer 503.
    pub fn failed(&self, why: String) {
        self.set(Phase::Failed(why));
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn set(&self, p: Phase) {
        match self.phase.write() {
            Ok(mut g) => *g = p,
            Err(poisoned) => *poisoned.into_inner() = p,
        }
    }

    fn current(&self) -> Result<Arc<Ready>, ApiError> {
        let g = match self.phase.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match &*g {
            Phase::Ready(r) => Ok(r.clone()),
            Phase::Loading => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the model is loading",
            )
            .with_code("model_loading")),
            Phase::Failed(e) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the model failed to load: {e}"),
            )
            .with_code("model_failed")),
        }
    }

    /// `Some(opened)` when a chat answer's reasoning is split from its content: the template
    /// teaches `<think>` blocks and `--reasoning-format` is `deepseek`. `opened`: the prompt
    /// (`ids`) ends inside a block it opened.
    fn splits_reasoning(&self, kind: Kind, text: &crate::text::Text, ids: &[u32]) -> Option<bool> {
        if kind != Kind::Chat
            || self.opts.reasoning != ReasoningFormat::Deepseek
            || !text.template().is_some_and(crate::think::template_thinks)
        {
            return None;
        }
        let tail = text
            .decode_keeping_special(&ids[ids.len().saturating_sub(8)..])
            .unwrap_or_default();
        Some(crate::think::prompt_opens(&tail))
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.opts.api_key else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        // Compare without an early exit, so timing says nothing about the key.
        let same = given.len() == key.len()
            && given
                .bytes()
                .zip(key.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "incorrect or missing API key (send 'Authorization: Bearer <key>')",
            )
            .with_code("invalid_api_key"))
        }
    }

    /// The router with every route, request metrics and logs.
    pub fn router(self: &Arc<Self>) -> Router {
        let router = Router::new()
            .route("/health", get(health))
            .route("/metrics", get(metrics_text))
            .route("/v1/models", get(models))
            .route("/v1/models/{*id}", get(model))
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/completions", post(completions))
            .route("/report/{*id}", get(report))
            .route("/props", get(props))
            .route("/tokenize", post(tokens::tokenize))
            .route("/detokenize", post(tokens::detokenize))
            .route("/v1/embeddings", post(embeddings::embeddings));
        let router = if self.opts.webui {
            router
                .route("/", get(webui::page))
                .route("/assets/{name}", get(webui::asset))
        } else {
            router
        };
        let router = router
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(self.clone(), observe))
            .with_state(self.clone());
        match cors::layer(&self.opts.cors_origins) {
            Some(c) => router.layer(c),
            None => router,
        }
    }

    async fn complete(self: Arc<Self>, kind: Kind, headers: HeaderMap, body: Body) -> Response {
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
        self.authorize(&headers)?;
        let ready = self.current()?;
        let bytes = read_body(body, &headers, self.opts.max_body).await?;
        let mut fields = api::json_body(&bytes)?;
        let ignored = if self.opts.lenient {
            let route = match kind {
                Kind::Chat => api::CHAT_FIELDS,
                Kind::Text => api::COMPLETION_FIELDS,
            };
            api::drop_unknown(&mut fields, route)
        } else {
            Vec::new()
        };
        let parsed = match kind {
            Kind::Chat => api::chat(&fields)?,
            Kind::Text => api::completion(&fields)?,
        };
        ready.check_model(parsed.model.as_deref())?;
        api::check_logit_bias(&parsed.sampler, ready.engine.model.spec.vocab)?;
        let mut parsed = parsed;
        if let Some(effort) = parsed.reasoning_effort.clone() {
            api::apply_reasoning_effort(&mut parsed.prompt, ready.engine.text.template(), &effort)?;
        }
        let ctx = ready.limits.ctx;
        if parsed.n > ready.limits.slots {
            return Err(ApiError::bad(
                "n",
                format!(
                    "n = {} needs a slot per choice; this server runs {} (--parallel)",
                    parsed.n, ready.limits.slots
                ),
            ));
        }
        tools::generic_prompt(
            &mut parsed.prompt,
            &ready.engine.text,
            parsed.tools.as_ref(),
        );
        let calls = tools::tool_plan(
            &ready.engine.text,
            parsed.tools.as_ref(),
            parsed.format.is_some(),
        )?;
        let req = GenRequest {
            prompt: parsed.prompt.clone(),
            max_tokens: 0,
            sampler: parsed.sampler.clone(),
            stop: parsed.stop.clone(),
            constraint: None,
            keep_special: calls.is_some(),
            logprobs: parsed.logprobs,
        };
        let engine = ready.engine.clone();
        let grammar = tools::grammar_of(parsed.format.as_ref(), calls.as_ref());
        // A grammar holds the answer from its first token, so it opens no reasoning block.
        let held = grammar.is_some();
        let ids = tokio::task::spawn_blocking(move || {
            let mut req = req;
            if let Some((spec, field)) = &grammar {
                req.constraint = Some(engine.grammars.compile(&engine.text, spec, field)?);
            }
            checked_prompt(&engine.model, &engine.text, &req, ctx).map(|ids| (ids, req))
        })
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )
        })?;
        let prompt_param = if kind == Kind::Chat {
            "messages"
        } else {
            "prompt"
        };
        let (ids, mut req) = ids.map_err(|e| match e {
            Error::Request { reason, .. } if reason.contains("context") => {
                ApiError::bad(prompt_param, reason).with_code("context_length_exceeded")
            }
            // A grammar the engine cannot compile names its own field.
            Error::Request { field, reason } if field != "prompt" && field != "messages" => {
                ApiError::bad(field, reason)
            }
            Error::Request { reason, .. } => ApiError::bad(prompt_param, reason),
            other => ApiError::bad(prompt_param, format!("cannot prepare the prompt: {other}")),
        })?;
        req.max_tokens = parsed.max_tokens.unwrap_or(ctx - ids.len());
        let prompt_tokens = ids.len();
        let think = self
            .splits_reasoning(kind, &ready.engine.text, &ids)
            .filter(|_| !held);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut rxs = vec![rx];
        // Choice k samples with the seed + k: the same seed gives the same choices.
        let forks = (1..parsed.n as u64)
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
        };
        ready.submit(job)?;
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
            model: ready.id.clone(),
            fingerprint: ready.fingerprint.clone(),
            created: now_secs(),
            arrived,
            prompt_tokens,
            summary: None,
            calls: calls.map(|p| (p.format, p.tools)),
            logprobs: parsed.logprobs.is_some(),
            think,
        };
        let mut resp = if parsed.stream {
            reply.stream(rxs, &parsed)
        } else {
            reply.whole(rxs).await?
        };
        if !ignored.is_empty() {
            tracing::warn!(fields = ?ignored, "--lenient: unknown request fields ignored");
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
}

fn route_of(path: &str) -> &'static str {
    match path {
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/v1/models" => "/v1/models",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        p if p.starts_with("/report/") => "/report/{id}",
        "/props" => "/props",
        "/tokenize" => "/tokenize",
        "/detokenize" => "/detokenize",
        "/v1/embeddings" => "/v1/embeddings",
        "/" => "/",
        p if p.starts_with("/assets/") => "/assets/{name}",
        _ => "other",
    }
}

async fn observe(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = req.method().clone();
    let route = route_of(req.uri().path());
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    let seconds = t0.elapsed().as_secs_f64();
    s.metrics.request(route, status, seconds);
    tracing::debug!(target: "onebit::http", %method, route, status, ms = seconds * 1e3, "request");
    resp
}

async fn chat_completions(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    s.complete(Kind::Chat, headers, body).await
}

async fn completions(State(s): State<Arc<Server>>, headers: HeaderMap, body: Body) -> Response {
    s.complete(Kind::Text, headers, body).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .with_code("not_found")
}

/// Serves `server` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: Arc<Server>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await
}
