//! `/metrics`: Prometheus text exposition of what the server did — requests by route and status,
//! tokens in and out, latency histograms (request, time to first token, per output token), and
//! the scheduler's state (running sequences, queued requests, batch sizes).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a finished HTTP request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route (`/v1/chat/completions`, …), not the raw path: bounded cardinality.
    pub route: String,
    /// HTTP status code.
    pub status: u16,
}

/// Labels of a latency observation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Route {
    /// The route.
    pub route: String,
}

/// Labels of a finished generation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishLabels {
    /// `stop`, `length`, `cancelled` or `error`.
    pub reason: String,
}

type Hist = Family<Route, Histogram, fn() -> Histogram>;

/// A model, for the load counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Its id.
    pub model: String,
}

/// A model and why it was unloaded.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnloadLabels {
    /// Its id.
    pub model: String,
    /// `idle` (keep-alive), `models-max`, `memory`, `request` (the unload route).
    pub reason: String,
}

/// Every metric the server exports; cheap to update from any thread.
pub struct Metrics {
    registry: Registry,
    /// Requests by route and status.
    pub requests: Family<RouteLabels, Counter>,
    /// Request latency (headers in to last byte out) by route.
    pub latency: Hist,
    /// Prompt tokens processed.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub completion_tokens: Counter,
    /// Requests that started from a cached prompt prefix.
    pub prefix_hits: Counter,
    /// Prompt tokens whose KV cache was reused instead of recomputed.
    pub prefix_tokens: Counter,
    /// Generations by finish reason.
    pub finished: Family<FinishLabels, Counter>,
    /// Time from a request's arrival to its first token.
    pub ttft: Histogram,
    /// Time between consecutive output tokens of one sequence.
    pub inter_token: Histogram,
    /// Rows per forward batch.
    pub batch_rows: Histogram,
    /// Sequences holding a slot.
    pub running: Gauge,
    /// Requests waiting for a slot.
    pub queued: Gauge,
    /// 1 once the model is loaded.
    pub ready: Gauge,
    /// Bytes the KV caches hold now (blocks allocated as sequences fill them).
    pub kv_bytes: Gauge,
    /// The most bytes the KV caches have held at once.
    pub kv_peak_bytes: Gauge,
    /// Bytes the KV caches may hold (their budget).
    pub kv_budget_bytes: Gauge,
    /// Forward passes that panicked. Each is a bug in the model code: the requests in that batch
    /// failed, and the log holds the batch's shape.
    pub model_panics: Counter,
    /// Models loaded now.
    pub models_loaded: Gauge,
    /// Loads by model.
    pub model_loads: Family<ModelLabels, Counter>,
    /// Seconds each load took, by model (the last one).
    pub model_load_seconds: Family<ModelLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Unloads by model and reason.
    pub model_unloads: Family<UnloadLabels, Counter>,
}

fn latency_hist() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

impl Metrics {
    /// A registry with every metric under the `onebit_` prefix.
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("onebit"),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_hist as fn() -> Histogram),
            prompt_tokens: Counter::default(),
            completion_tokens: Counter::default(),
            prefix_hits: Counter::default(),
            prefix_tokens: Counter::default(),
            finished: Family::default(),
            ttft: latency_hist(),
            inter_token: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            batch_rows: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            running: Gauge::default(),
            queued: Gauge::default(),
            ready: Gauge::default(),
            kv_bytes: Gauge::default(),
            kv_peak_bytes: Gauge::default(),
            kv_budget_bytes: Gauge::default(),
            model_panics: Counter::default(),
            models_loaded: Gauge::default(),
            model_loads: Family::default(),
            model_load_seconds: Family::default(),
            model_unloads: Family::default(),
        };
        let registry = &mut m.registry;
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            m.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency, headers in to last byte out",
            m.latency.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens processed",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "completion_tokens",
            "Tokens generated",
            m.completion_tokens.clone(),
        );
        registry.register(
            "prefix_cache_hits",
            "Requests that started from a cached prompt prefix",
            m.prefix_hits.clone(),
        );
        registry.register(
            "prefix_cache_tokens",
            "Prompt tokens whose KV cache was reused instead of recomputed",
            m.prefix_tokens.clone(),
        );
        registry.register(
            "kv_cache_bytes",
            "Bytes the KV caches hold now (allocated in blocks as sequences fill them)",
            m.kv_bytes.clone(),
        );
        registry.register(
            "kv_cache_peak_bytes",
            "The most bytes the KV caches have held at once",
            m.kv_peak_bytes.clone(),
        );
        registry.register(
            "kv_cache_budget_bytes",
            "Bytes the KV caches may hold; a request needing more gets 503",
            m.kv_budget_bytes.clone(),
        );
        registry.register(
            "generations",
            "Generations by finish reason",
            m.finished.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Arrival of a request to its first generated token",
            m.ttft.clone(),
        );
        registry.register(
            "inter_token_seconds",
            "Time between consecutive output tokens of one sequence",
            m.inter_token.clone(),
        );
        registry.register("batch_rows", "Rows per forward batch", m.batch_rows.clone());
        registry.register(
            "running_sequences",
            "Sequences holding a slot",
            m.running.clone(),
        );
        registry.register(
            "queued_requests",
            "Requests waiting for a slot",
            m.queued.clone(),
        );
        registry.register(
            "ready",
            "1 once the model is loaded and serving",
            m.ready.clone(),
        );
        registry.register(
            "model_panics",
            "Forward passes that panicked (a bug; the batch's requests failed and its shape is logged)",
            m.model_panics.clone(),
        );
        registry.register(
            "models_loaded",
            "Models loaded now",
            m.models_loaded.clone(),
        );
        registry.register("model_loads", "Model loads", m.model_loads.clone());
        registry.register(
            "model_load_seconds",
            "How long the model's last load took",
            m.model_load_seconds.clone(),
        );
        registry.register(
            "model_unloads",
            "Model unloads by reason (idle, models-max, memory, request)",
            m.model_unloads.clone(),
        );
        m
    }

    /// Counts a model's load, which took `seconds`.
    pub fn model_loaded(&self, model: &str, seconds: f64) {
        let l = ModelLabels {
            model: model.to_string(),
        };
        self.model_loads.get_or_create(&l).inc();
        self.model_load_seconds.get_or_create(&l).set(seconds);
    }

    /// Counts a model's unload, for `reason`.
    pub fn model_unloaded(&self, model: &str, reason: &str) {
        self.model_unloads
            .get_or_create(&UnloadLabels {
                model: model.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts one finished HTTP request.
    pub fn request(&self, route: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RouteLabels {
                route: route.to_string(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&Route {
                route: route.to_string(),
            })
            .observe(seconds);
    }

    /// Counts one finished generation.
    pub fn finish(&self, reason: &str) {
        self.finished
            .get_or_create(&FinishLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Copies the KV caches' current, largest and allowed sizes into their gauges.
    pub fn kv_cache(&self, memory: &onebit_kernels::kv::CacheMemory) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.kv_bytes.set(g(memory.used()));
        self.kv_peak_bytes.set(g(memory.peak()));
        self.kv_budget_bytes.set(g(memory.limit()));
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
