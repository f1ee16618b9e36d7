//! Progress events. The engine publishes them through [`Reporter`]; only the binary knows how to
//! draw them (indicatif bars, JSON lines, nothing).

use serde::Serialize;

use crate::record::StageEvent;

/// One thing that happened during a run.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A run began.
    RunStarted {
        /// The run id.
        run_id: String,
        /// The ref (named graph instance) being run, if any.
        ref_name: Option<String>,
        /// How many stages the graph has.
        stages: usize,
    },
    /// A stage missed the cache and its body starts.
    StageStarted {
        /// The stage name.
        stage: String,
        /// Its key (hex).
        key: String,
        /// Why it runs, as a sentence.
        reason: String,
    },
    /// Another process holds the stage's lock; this one waits for it.
    StageWaiting {
        /// The stage name.
        stage: String,
        /// Its key (hex).
        key: String,
    },
    /// A long stage reports how far it is.
    StageProgress {
        /// The stage name.
        stage: String,
        /// Units done.
        done: u64,
        /// Units in all (0 when unknown).
        total: u64,
    },
    /// A stage finished: hit, miss (ran), failed or skipped.
    StageFinished(StageEvent),
    /// A run ended.
    RunFinished {
        /// The run id.
        run_id: String,
        /// Stages served from the cache.
        hits: usize,
        /// Stages whose body ran.
        misses: usize,
        /// Stages that failed or were skipped.
        failed: usize,
        /// Wall time of the run.
        duration_ms: f64,
    },
}

/// A sink for [`Event`]s. Must be cheap: it is called from stage threads.
pub trait Reporter: Send + Sync {
    /// Receives one event.
    fn event(&self, event: &Event);
}

/// Drops every event (`--quiet`, tests, benchmarks).
pub struct NullReporter;

impl Reporter for NullReporter {
    fn event(&self, _event: &Event) {}
}
