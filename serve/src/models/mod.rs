//! The models a server holds. One server serves either the one pack it was started with (loaded
//! at start, never unloaded: `serve --repo/--pack`) or every pack of a list it was given (`serve`
//! with no pack: the store's packs), each loaded on its first request and unloaded when idle or
//! when another needs the room, least recently used first, never while a request holds it.
//!
//! A request names its model by repository id, by `--alias`, or by a short name (see
//! [`short_name`]); with one model listed it may name none. Loading runs on a
//! blocking thread while the other models keep serving; the requests for a model being loaded
//! wait for that one load. A model's `Ready` is shared by the requests and queued jobs using it,
//! so "in flight" is its reference count: the registry unloads only a model whose one reference
//! is its own, and a model dropped by the registry lives on until its last job ends.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio::sync::watch;

mod listing;

pub use listing::{Listing, Loader, ModelInfo, Policy, pack_bytes, parse_keep_alive, short_name};

use crate::api::ApiError;
use crate::{Ready, Server};

/// Where one model stands.
enum State {
    Unloaded,
    /// Being loaded; its waiters watch for the outcome.
    Loading(watch::Receiver<Outcome>),
    Ready(Arc<Ready>),
}

/// One model of the registry.
struct Slot {
    listing: Listing,
    short: String,
    state: State,
    last_used: Instant,
    /// The model's own keep-alive after its last request, when a request set one.
    keep_alive: Option<Option<Duration>>,
    /// Loaded at start and never unloaded (`serve --repo/--pack`).
    pinned: bool,
}

impl Slot {
    fn ready(&self) -> Option<&Arc<Ready>> {
        match &self.state {
            State::Ready(r) => Some(r),
            _ => None,
        }
    }

    /// Whether a request or job holds it (the registry's reference is the only one otherwise).
    fn busy(&self) -> bool {
        match &self.state {
            State::Ready(r) => Arc::strong_count(r) > 1,
            State::Loading(_) => true,
            State::Unloaded => false,
        }
    }

    fn loaded_or_loading(&self) -> bool {
        !matches!(self.state, State::Unloaded)
    }
}

/// The registry of a server's models.
pub(crate) struct Registry {
    slots: Mutex<Vec<Slot>>,
    loader: Option<Loader>,
    policy: Policy,
}

fn not_found(name: &str, known: &[String]) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "the model '{name}' does not exist here; this server serves: {}",
            if known.is_empty() {
                "nothing yet".to_string()
            } else {
                known.join(", ")
            }
        ),
        kind: "invalid_request_error",
        param: Some("model".into()),
        code: Some("model_not_found"),
    }
}

fn unavailable(code: &'static str, message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code(code)
}

fn lock(m: &Mutex<Vec<Slot>>) -> std::sync::MutexGuard<'_, Vec<Slot>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a request waits for a busy model to free the room it needs before its 503.
const BUSY_WAIT: Duration = Duration::from_secs(10);

/// Why a model cannot be had now.
enum Decided {
    /// Busy models leave no room: worth waiting for.
    Busy(ApiError),
    /// Refused for good (unknown, unverified, too big).
    Refused(ApiError),
}

/// A model taken out of the registry: its id, the model, why.
type Evicted = (String, Arc<Ready>, &'static str);

/// A load's outcome, as its waiters watch for it.
type Outcome = Option<Result<Arc<Ready>, String>>;

/// What `acquire` does next, decided under the lock.
enum Next {
    Have(Arc<Ready>),
    Wait(watch::Receiver<Outcome>),
    Load(Listing, watch::Sender<Outcome>, Vec<Evicted>),
}

impl Registry {
    /// A registry of `listings`, loaded by `loader` under `policy`.
    pub(crate) fn new(listings: Vec<Listing>, loader: Option<Loader>, policy: Policy) -> Registry {
        let now = Instant::now();
        let slots = listings
            .into_iter()
            .map(|listing| Slot {
                short: short_name(&listing.id),
                listing,
                state: State::Unloaded,
                last_used: now,
                keep_alive: None,
                pinned: false,
            })
            .collect();
        Registry {
            slots: Mutex::new(slots),
            loader,
            policy,
        }
    }

    /// Adds the model loaded at start (`serve --repo/--pack`), pinned.
    pub(crate) fn pin(&self, listing: Listing, ready: Arc<Ready>) {
        let mut slots = lock(&self.slots);
        slots.retain(|s| s.listing.id != listing.id);
        slots.push(Slot {
            short: short_name(&listing.id),
            listing,
            state: State::Ready(ready),
            last_used: Instant::now(),
            keep_alive: None,
            pinned: true,
        });
    }

    /// Whether the registry loads models on demand (a server started with no pack).
    pub(crate) fn on_demand(&self) -> bool {
        self.loader.is_some()
    }

    /// The index of the model `name` names (`None`: the one model listed).
    fn find(&self, slots: &[Slot], name: Option<&str>) -> Result<usize, ApiError> {
        let ids = || {
            slots
                .iter()
                .map(|s| s.listing.id.clone())
                .collect::<Vec<_>>()
        };
        let Some(name) = name else {
            if slots.len() == 1 {
                return Ok(0);
            }
            return Err(ApiError::bad(
                "model",
                format!(
                    "'model' is required: this server serves several ({})",
                    ids().join(", ")
                ),
            ));
        };
        if let Some(i) = slots
            .iter()
            .position(|s| s.listing.id == name || s.listing.aliases.iter().any(|a| a == name))
        {
            return Ok(i);
        }
        // Short names, case-insensitively, with Ollama's `:latest` tag allowed.
        let want = name.strip_suffix(":latest").unwrap_or(name).to_lowercase();
        let by_short: Vec<usize> = (0..slots.len())
            .filter(|&i| slots[i].short == want || slots[i].listing.id.to_lowercase() == want)
            .collect();
        match by_short[..] {
            [one] => Ok(one),
            [] => Err(not_found(name, &ids())),
            _ => {
                let ids: Vec<String> = by_short
                    .iter()
                    .map(|&i| slots[i].listing.id.clone())
                    .collect();
                let mut e = not_found(name, &ids);
                e.message = format!(
                    "the short name '{name}' matches several models ({}): name one by its id",
                    ids.join(", ")
                );
                Err(e)
            }
        }
    }

    /// The id of the model `name` names, without loading it.
    pub(crate) fn resolve(&self, name: Option<&str>) -> Result<String, ApiError> {
        let slots = lock(&self.slots);
        let i = self.find(&slots, name)?;
        Ok(slots[i].listing.id.clone())
    }

    /// The model `name` names, loaded: at once when it is, after its load otherwise (started
    /// here, or already running for another request). `keep_alive` (Ollama's per-request field)
    /// replaces the server's keep-alive for this model from now on.
    pub(crate) async fn acquire(
        &self,
        server: &Arc<Server>,
        name: Option<&str>,
        keep_alive: Option<Option<Duration>>,
    ) -> Result<Arc<Ready>, ApiError> {
        // A model busy for a moment (a job ending just after its answer went out) frees its
        // room soon: wait for it up to BUSY_WAIT before answering 503.
        let deadline = Instant::now() + BUSY_WAIT;
        let next = loop {
            match self.decide(name, keep_alive) {
                Err(Decided::Busy(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(Decided::Busy(e) | Decided::Refused(e)) => return Err(e),
                Ok(next) => break next,
            }
        };
        match next {
            Next::Have(r) => Ok(r),
            Next::Wait(rx) => wait(rx).await,
            Next::Load(listing, tx, evicted) => {
                for (id, ready, why) in evicted {
                    server.unloaded(&id, ready, why);
                }
                let rx = tx.subscribe();
                self.load(server, listing, tx);
                wait(rx).await
            }
        }
    }

    /// What `acquire` does next for `name`, decided under the lock.
    fn decide(
        &self,
        name: Option<&str>,
        keep_alive: Option<Option<Duration>>,
    ) -> Result<Next, Decided> {
        let mut slots = lock(&self.slots);
        let i = self.find(&slots, name).map_err(Decided::Refused)?;
        let slot = &mut slots[i];
        slot.last_used = Instant::now();
        if keep_alive.is_some() {
            slot.keep_alive = keep_alive;
        }
        Ok(match &slot.state {
            State::Ready(r) => Next::Have(r.clone()),
            State::Loading(rx) => Next::Wait(rx.clone()),
            State::Unloaded => {
                let listing = slot.listing.clone();
                if self.loader.is_none() {
                    return Err(Decided::Refused(unavailable(
                        "model_unavailable",
                        format!("'{}' is not loaded and this server loads none", listing.id),
                    )));
                }
                if !listing.verified && !self.policy.allow_unverified {
                    return Err(Decided::Refused(
                        ApiError::new(
                            StatusCode::FORBIDDEN,
                            "invalid_request_error",
                            format!(
                                "'{}' did not pass verification ({}); start the server with \
                             --allow-unverified to serve it anyway",
                                listing.id, listing.verdict
                            ),
                        )
                        .with_code("model_unverified"),
                    ));
                }
                let evicted = self.make_room(&mut slots, i)?;
                let (tx, rx) = watch::channel(None);
                slots[i].state = State::Loading(rx);
                Next::Load(listing, tx, evicted)
            }
        })
    }

    /// Unloads idle models until model `i` fits the policy; returns them (id, model, reason)
    /// so they are dropped outside the lock, or the 503 when busy models leave no room.
    fn make_room(&self, slots: &mut [Slot], i: usize) -> Result<Vec<Evicted>, Decided> {
        let p = &self.policy;
        let need = slots[i].listing.bytes;
        let mut evicted = Vec::new();
        loop {
            let count = slots.iter().filter(|s| s.loaded_or_loading()).count();
            let bytes: u64 = slots
                .iter()
                .filter(|s| s.loaded_or_loading())
                .map(|s| s.listing.bytes)
                .sum();
            let over_count = count >= p.models_max;
            let over_memory = bytes.saturating_add(need) > p.memory;
            if !over_count && !over_memory {
                return Ok(evicted);
            }
            // The least recently used idle model.
            let victim = (0..slots.len())
                .filter(|&j| j != i && slots[j].ready().is_some())
                .filter(|&j| !slots[j].busy() && !slots[j].pinned)
                .min_by_key(|&j| slots[j].last_used);
            let Some(j) = victim else {
                let busy: Vec<String> = slots
                    .iter()
                    .filter(|s| s.loaded_or_loading())
                    .map(|s| s.listing.id.clone())
                    .collect();
                let why = if over_count {
                    format!(
                        "{} models are loaded (--models-max {}) and each is in use: {}",
                        count,
                        p.models_max,
                        busy.join(", ")
                    )
                } else {
                    format!(
                        "loading '{}' needs {} MiB and the models in use ({}) leave {} MiB of \
                         the {} MiB memory budget (--models-memory)",
                        slots[i].listing.id,
                        need >> 20,
                        busy.join(", "),
                        p.memory.saturating_sub(bytes) >> 20,
                        p.memory >> 20
                    )
                };
                // A model that cannot fit even alone is refused as such.
                if need > p.memory {
                    return Err(Decided::Refused(unavailable(
                        "insufficient_memory",
                        format!(
                            "'{}' needs {} MiB, more than the {} MiB memory budget \
                             (--models-memory)",
                            slots[i].listing.id,
                            need >> 20,
                            p.memory >> 20
                        ),
                    )));
                }
                for (id, ready, _) in evicted {
                    // Put back what was taken out for nothing.
                    if let Some(s) = slots.iter_mut().find(|s| s.listing.id == id) {
                        s.state = State::Ready(ready);
                    }
                }
                return Err(Decided::Busy(unavailable("insufficient_memory", why)));
            };
            let reason = if over_count { "models-max" } else { "memory" };
            if let State::Ready(r) = std::mem::replace(&mut slots[j].state, State::Unloaded) {
                evicted.push((slots[j].listing.id.clone(), r, reason));
            }
        }
    }

    /// Loads `listing` on a blocking thread; the outcome goes to its waiters through `tx` and
    /// into its slot.
    fn load(&self, server: &Arc<Server>, listing: Listing, tx: watch::Sender<Outcome>) {
        let Some(loader) = self.loader.clone() else {
            return;
        };
        let server = server.clone();
        tracing::info!(model = %listing.id, mib = listing.bytes >> 20, "loading");
        let started = Instant::now();
        tokio::task::spawn_blocking(move || {
            let outcome =
                loader(&listing).and_then(|engine| server.make_ready(&listing.id, engine));
            let outcome = outcome.map(Arc::new);
            let registry = server.registry();
            {
                let mut slots = lock(&registry.slots);
                if let Some(s) = slots.iter_mut().find(|s| s.listing.id == listing.id) {
                    s.state = match &outcome {
                        Ok(r) => State::Ready(r.clone()),
                        Err(_) => State::Unloaded,
                    };
                    s.last_used = Instant::now();
                }
            }
            match &outcome {
                Ok(r) => {
                    server
                        .metrics
                        .model_loaded(&listing.id, started.elapsed().as_secs_f64());
                    tracing::info!(
                        model = %listing.id,
                        ms = started.elapsed().as_millis() as u64,
                        ctx = r.limits.ctx,
                        "loaded"
                    );
                }
                Err(e) => tracing::error!(model = %listing.id, error = %e, "load failed"),
            }
            server.metrics.models_loaded.set(registry.loaded() as i64);
            let _ = tx.send(Some(outcome));
        });
    }

    /// Models loaded now.
    pub(crate) fn loaded(&self) -> usize {
        lock(&self.slots)
            .iter()
            .filter(|s| s.ready().is_some())
            .count()
    }

    /// Unloads the model `name` names (the explicit route): refused while a request holds it.
    pub(crate) fn unload(&self, server: &Server, name: &str) -> Result<bool, ApiError> {
        let taken = {
            let mut slots = lock(&self.slots);
            let i = self.find(&slots, Some(name))?;
            let s = &mut slots[i];
            if s.ready().is_none() {
                return Ok(false);
            }
            if s.pinned {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    format!(
                        "'{}' is the model this server was started with; it stays loaded",
                        s.listing.id
                    ),
                )
                .with_code("model_pinned"));
            }
            if s.busy() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    format!(
                        "'{}' has requests in flight; unload it when they end",
                        s.listing.id
                    ),
                )
                .with_code("model_busy"));
            }
            match std::mem::replace(&mut s.state, State::Unloaded) {
                State::Ready(r) => Some((s.listing.id.clone(), r)),
                _ => None,
            }
        };
        if let Some((id, r)) = taken {
            server.unloaded(&id, r, "request");
        }
        Ok(true)
    }

    /// Unloads every idle model whose keep-alive has run out (called every second).
    pub(crate) fn reap(&self, server: &Server) {
        let now = Instant::now();
        let mut taken = Vec::new();
        {
            let mut slots = lock(&self.slots);
            for s in slots.iter_mut() {
                if s.pinned || s.busy() || s.ready().is_none() {
                    continue;
                }
                let keep = s.keep_alive.unwrap_or(self.policy.keep_alive);
                let Some(keep) = keep else { continue };
                if now.duration_since(s.last_used) >= keep
                    && let State::Ready(r) = std::mem::replace(&mut s.state, State::Unloaded)
                {
                    taken.push((s.listing.id.clone(), r));
                }
            }
        }
        for (id, r) in taken {
            server.unloaded(&id, r, "idle");
        }
    }

    /// Every model with where it stands.
    pub(crate) fn infos(&self) -> Vec<ModelInfo> {
        let now = Instant::now();
        lock(&self.slots)
            .iter()
            .map(|s| {
                let idle = now.duration_since(s.last_used);
                let keep = s.keep_alive.unwrap_or(self.policy.keep_alive);
                ModelInfo {
                    listing: s.listing.clone(),
                    short: s.short.clone(),
                    status: match s.state {
                        State::Unloaded => "unloaded",
                        State::Loading(_) => "loading",
                        State::Ready(_) => "loaded",
                    },
                    ctx: s.ready().map(|r| r.limits.ctx),
                    idle_s: idle.as_secs(),
                    expires_in_s: match (&s.state, keep, s.pinned) {
                        (State::Ready(_), Some(k), false) => Some(k.saturating_sub(idle).as_secs()),
                        _ => None,
                    },
                }
            })
            .collect()
    }

    /// The loaded model `id`, if it is.
    pub(crate) fn loaded_model(&self, id: &str) -> Option<Arc<Ready>> {
        lock(&self.slots)
            .iter()
            .find(|s| s.listing.id == id)
            .and_then(|s| s.ready().cloned())
    }
}

/// The outcome of a load another request started.
async fn wait(mut rx: watch::Receiver<Outcome>) -> Result<Arc<Ready>, ApiError> {
    let outcome = rx
        .wait_for(Option::is_some)
        .await
        .map_err(|_| unavailable("model_failed", "the model's load stopped".into()))?
        .clone();
    match outcome {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(unavailable(
            "model_failed",
            format!("the model failed to load: {e}"),
        )),
        None => Err(unavailable(
            "model_failed",
            "the model's load stopped".into(),
        )),
    }
}
