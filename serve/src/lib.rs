//! # onebit-serve
//!
//! The OpenAI-compatible HTTP server behind `onebit-pipe serve`, built on `onebit-runtime`'s
//! public face (of the kernels below it, it reads only the KV cache's memory accounting). Every route is in
//! [`Server::router`]'s one table, [`routes`]; `docs/serve.md` documents each. A request is read
//! and checked in [`api`] (with [`tool_fields`], [`fields`] and [`structured`] for the parts of a
//! chat request), run by the continuous-batching [`scheduler`] with the prefix cache ([`prefix`]),
//! and answered as JSON or server-sent events ([`reply`], [`answer`]); the text a model writes
//! is split into reasoning ([`think`]) and tool calls ([`tool_calls`]). [`metrics`] counts it
//! all for `/metrics`, and the chat page ([`webui`]) is built into the binary. The server binds
//! and answers `/health` before the model is loaded, so a supervisor can watch it come up.

mod answer;
pub mod api;
mod batch_shape;
mod body;
mod complete;
mod cors;
mod embeddings;
mod error;
mod fields;
#[cfg(test)]
mod fuzz_tests;
mod image_parts;
mod info;
pub mod job;
mod logprobs;
mod manage;
pub mod metrics;
pub mod models;
mod ollama;
mod prefix;
mod reply;
pub mod scheduler;
#[cfg(test)]
mod scheduler_tests;
mod step;
mod structured;
pub mod think;
mod tokens;
pub mod tool_calls;
mod tool_fields;
mod values;
mod webui;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};

use api::ApiError;
use body::read_body;
pub use cors::check_origin;
use info::{health, metrics_text, model, models, props, report};
use job::Job;
pub use job::{Engine, Limits};
pub use metrics::Metrics;
use reply::Kind;
use scheduler::{Busy, Scheduler};

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
    pub pooling: onebit_runtime::embed::Pooling,
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

/// Where a server stands: a server started with its pack is loading until [`Server::ready`]; a
/// server of the store's packs is ready at once (each model loads on its first request).
enum Phase {
    Loading,
    Ready,
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
    /// Queues `job`, holding this model until it ends, or answers 503 (busy) or 500 (the
    /// scheduler stopped).
    fn submit(self: &Arc<Self>, mut job: Job) -> Result<(), ApiError> {
        job.hold = Some(self.clone());
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

/// Shared server state: the loading phase, the models, options, metrics.
pub struct Server {
    phase: RwLock<Phase>,
    registry: models::Registry,
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
    /// A server that is still loading its model (`serve --repo/--pack`).
    pub fn new(opts: Options) -> Arc<Server> {
        let policy = models::Policy {
            models_max: 1,
            memory: u64::MAX,
            keep_alive: None,
            allow_unverified: false,
        };
        Server::build(
            opts,
            Phase::Loading,
            models::Registry::new(Vec::new(), None, policy),
        )
    }

    /// A server of the packs `listings`, ready at once: each loads through `loader` on its first
    /// request and is unloaded as `policy` says (`serve` with no pack).
    pub fn with_models(
        opts: Options,
        listings: Vec<models::Listing>,
        loader: models::Loader,
        policy: models::Policy,
    ) -> Arc<Server> {
        let server = Server::build(
            opts,
            Phase::Ready,
            models::Registry::new(listings, Some(loader), policy),
        );
        server.metrics.ready.set(1);
        server
    }

    fn build(opts: Options, phase: Phase, registry: models::Registry) -> Arc<Server> {
        Arc::new(Server {
            phase: RwLock::new(phase),
            registry,
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
        let listing = models::Listing {
            id: id.clone(),
            aliases: Vec::new(),
            family: engine.model.spec.family.clone(),
            bytes: models::pack_bytes(&engine.model.pack.dir),
            context: engine.model.spec.context,
            verified: engine.model.pack.manifest.verification.verified,
            verdict: engine.model.pack.manifest.verification.summary.clone(),
            modified: now_secs(),
            digest: pv.stage_keys.get("repack").cloned().unwrap_or_default(),
        };
        let ready = match self.make_ready(&id, engine) {
            Ok(r) => r,
            Err(e) => {
                self.failed(e.clone());
                return Err(e);
            }
        };
        let limits = ready.limits;
        self.registry.pin(listing, Arc::new(ready));
        self.metrics.ready.set(1);
        self.metrics.models_loaded.set(1);
        self.set(Phase::Ready);
        Ok(limits)
    }

    /// `engine` made ready to serve as `id`: its context decided and checked, its KV cache
    /// budget set, its scheduler started.
    pub(crate) fn make_ready(&self, id: &str, engine: Engine) -> Result<Ready, String> {
        let pv = &engine.model.pack.manifest.provenance;
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
            tracing::error!(model = id, error = %e, "cannot serve at this context size");
            return Err(e.to_string());
        }
        let memory = engine.model.cache_memory();
        let budget = limits.cache_budget.unwrap_or_else(|| {
            onebit_kernels::kv::available_memory().map_or(usize::MAX, |a| a / 10 * 9)
        });
        memory.set_limit(budget);
        let full = limits
            .slots
            .saturating_mul(engine.model.session_bytes(limits.ctx));
        if full > budget {
            tracing::warn!(
                model = id,
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
        Ok(Ready {
            id: id.to_string(),
            limits,
            fingerprint,
            engine,
            scheduler,
        })
    }

    /// The registry of models.
    pub(crate) fn registry(&self) -> &models::Registry {
        &self.registry
    }

    /// The registry let go of model `id` (`why`: `idle`, `models-max`, `memory`, `request`): it
    /// is freed when its last request ends.
    pub(crate) fn unloaded(&self, id: &str, ready: Arc<Ready>, why: &str) {
        let held = Arc::strong_count(&ready) - 1;
        drop(ready);
        self.metrics.model_unloaded(id, why);
        self.metrics
            .models_loaded
            .set(self.registry.loaded() as i64);
        tracing::info!(model = id, reason = why, still_held = held, "unloaded");
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

    /// Refuses while the server's own pack is loading or failed to load.
    fn started(&self) -> Result<(), ApiError> {
        let g = match self.phase.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match &*g {
            Phase::Ready => Ok(()),
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

    /// The model `name` names (the one there is when `None`), loaded, waiting for its load when
    /// it is not; `keep_alive` replaces its keep-alive (Ollama's per-request field).
    pub(crate) async fn model(
        self: &Arc<Self>,
        name: Option<&str>,
        keep_alive: Option<Option<std::time::Duration>>,
    ) -> Result<Arc<Ready>, ApiError> {
        self.started()?;
        self.registry.acquire(self, name, keep_alive).await
    }

    /// `Some(opened)` when a chat answer's reasoning is split from its content: the template
    /// teaches `<think>` blocks and `--reasoning-format` is `deepseek`. `opened`: the prompt
    /// (`ids`) ends inside a block it opened.
    fn splits_reasoning(
        &self,
        kind: Kind,
        text: &onebit_runtime::text::Text,
        ids: &[u32],
    ) -> Option<bool> {
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

    /// The router with every route of [`routes`], request metrics and logs.
    pub fn router(self: &Arc<Self>) -> Router {
        let router = routes(self.opts.webui)
            .into_iter()
            .fold(Router::new(), |r, (_, path, handler)| {
                r.route(path, handler)
            });
        let router = router
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(self.clone(), observe))
            .with_state(self.clone());
        match cors::layer(&self.opts.cors_origins) {
            Some(c) => router.layer(c),
            None => router,
        }
    }

    /// The loaded model and a request's fields, once the key is checked and the body read as
    /// `route`'s fields: every POST route opens its request here. With `--lenient`, the fields
    /// the route does not read are dropped, logged and returned (a completion names them in a
    /// `Warning` header).
    pub(crate) async fn open(
        self: &Arc<Self>,
        headers: &HeaderMap,
        body: Body,
        route: &values::Route,
    ) -> Result<(Arc<Ready>, values::Fields, Vec<String>), ApiError> {
        self.authorize(headers)?;
        self.started()?;
        let bytes = read_body(body, headers, self.opts.max_body).await?;
        let (fields, ignored) = values::Fields::read(&bytes, route, self.opts.lenient)?;
        if !ignored.is_empty() {
            tracing::warn!(fields = ?ignored, "--lenient: unknown request fields ignored");
        }
        let name = match fields.get("model") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(m)) => Some(m.clone()),
            Some(v) => {
                return Err(ApiError::bad(
                    "model",
                    format!("'model' must be a string, got {v}"),
                ));
            }
        };
        let ready = self.model(name.as_deref(), None).await?;
        Ok((ready, fields, ignored))
    }
}

/// Every route the server answers, in one table: (method, path as axum matches it, handler);
/// the chat page's two only with `webui`. `docs/serve.md` lists each (a test holds it to this
/// table), and the metrics and logs name a request by its path here (`{*id}` written `{id}`).
pub fn routes(webui: bool) -> Vec<(&'static str, &'static str, MethodRouter<Arc<Server>>)> {
    let mut r = vec![
        ("GET", "/health", get(health)),
        ("GET", "/metrics", get(metrics_text)),
        ("GET", "/v1/models", get(models)),
        ("GET", "/v1/models/{*id}", get(model)),
        ("POST", "/v1/chat/completions", post(chat_completions)),
        ("POST", "/v1/completions", post(completions)),
        ("GET", "/report/{*id}", get(report)),
        ("GET", "/props", get(props)),
        ("POST", "/tokenize", post(tokens::tokenize)),
        ("POST", "/detokenize", post(tokens::detokenize)),
        ("POST", "/v1/embeddings", post(embeddings::embeddings)),
        ("POST", "/api/chat", post(ollama::chat)),
        ("POST", "/api/generate", post(ollama::generate)),
        ("POST", "/api/embed", post(ollama::embed)),
        ("POST", "/api/embeddings", post(ollama::embeddings)),
        ("GET", "/api/tags", get(ollama::tags)),
        ("GET", "/api/ps", get(ollama::ps)),
        ("POST", "/api/show", post(ollama::show)),
        ("GET", "/api/version", get(ollama::version)),
        ("POST", "/models/load", post(manage::load)),
        ("POST", "/models/unload", post(manage::unload)),
    ];
    if webui {
        r.push(("GET", "/", get(webui::page)));
        r.push(("GET", "/assets/{name}", get(webui::asset)));
    }
    r
}

/// A route's path as people write it: `{*id}` as `{id}`.
fn shown(path: &str) -> String {
    path.replace("{*", "{")
}

/// A request's route as metrics and logs name it: its entry of [`routes`] (`{*id}` written
/// `{id}`), or `other` for a path no route matches.
fn route_label(matched: Option<&MatchedPath>) -> String {
    matched.map_or_else(|| "other".to_string(), |m| shown(m.as_str()))
}

async fn observe(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = req.method().clone();
    let route = route_label(req.extensions().get::<MatchedPath>());
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    let seconds = t0.elapsed().as_secs_f64();
    s.metrics.request(&route, status, seconds);
    tracing::debug!(target: "onebit::http", %method, route = route.as_str(), status, ms = seconds * 1e3, "request");
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
    if server.registry.on_demand() {
        // Unloads the models whose keep-alive has run out.
        let s = server.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                s.registry.reap(&s);
            }
        });
    }
    axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod route_tests {
    /// docs/serve.md's table of endpoints names every route the router serves, as
    /// `METHOD /path`.
    #[test]
    fn the_docs_list_every_route() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/serve.md"),
        )
        .expect("docs/serve.md");
        let routes = super::routes(true);
        assert!(routes.len() >= 13, "{} routes", routes.len());
        for (method, path, _) in routes {
            let name = format!("`{method} {}`", super::shown(path));
            assert!(docs.contains(&name), "docs/serve.md does not list {name}");
        }
    }
}
