//! What the HTTP side and the scheduler thread share: the engine (model, text, grammars), the
//! limits, a request's job and further choices, and the events its stream receives.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use onebit_runtime::generate::{Finish, Request};
use onebit_runtime::grammar::Grammars;
use onebit_runtime::model::Model;
use onebit_runtime::text::Text;

/// The model and its text side, shared by the handlers (tokenizing) and the scheduler (running).
pub struct Engine {
    /// The loaded model.
    pub model: Model,
    /// Tokenizer and chat template.
    pub text: Text,
    /// The grammar engine over the model's vocabulary (built on the first constrained request).
    pub grammars: Grammars,
}

impl Engine {
    /// The engine of `model` and its `text`.
    pub fn new(model: Model, text: Text) -> Engine {
        let grammars = Grammars::new(model.spec.vocab, &model.spec.eos);
        Engine {
            model,
            text,
            grammars,
        }
    }
}

/// Scheduler limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sequences running at once.
    pub slots: usize,
    /// Requests waiting for a slot before new ones are refused.
    pub queue: usize,
    /// Rows per forward batch (decode rows + prompt chunk rows).
    pub batch: usize,
    /// Context per sequence, tokens.
    pub ctx: usize,
    /// Whether a request starts from the longest prompt prefix a free cache holds.
    pub prefix_cache: bool,
    /// Bytes every KV cache together may hold (`None`: 90 % of the memory available when the
    /// model is ready). A request whose cache would need more gets 503.
    pub cache_budget: Option<usize>,
}

/// What a request's stream receives.
#[derive(Debug)]
pub enum Event {
    /// Final text, in order.
    Text(String),
    /// A generated token's log-probability (requests that ask), sent before the text it adds.
    Logprob(onebit_runtime::logprobs::TokenLogprob),
    /// The end, with the counts.
    Done(Summary),
    /// The model failed on this request.
    Failed(String),
    /// The request's KV cache could not grow (503: the server goes on; retry later).
    NoRoom(String),
    /// An embedding request's pooled, normalized vector (sent before its `Done`).
    Embedding(Vec<f32>),
}

/// Counts and timings of one finished generation.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV cache was reused from an earlier request (not recomputed).
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Arrival to first token.
    pub ttft: Duration,
}

/// One admitted request.
pub struct Job {
    /// Prompt token ids (already checked to fit the context).
    pub ids: Vec<u32>,
    /// Budget, sampling, stop strings.
    pub req: Request,
    /// Where text goes; closed when the client is gone.
    pub events: UnboundedSender<Event>,
    /// When the request arrived.
    pub arrived: Instant,
    /// Its further choices (`n` > 1): each continues from the prompt's last logits in a copy of
    /// this job's KV cache, so the prompt is read once.
    pub forks: Vec<Fork>,
    /// An embedding request: its prompt is read and its states pooled this way; nothing is
    /// generated.
    pub embed: Option<onebit_runtime::embed::Pooling>,
    /// What the job keeps alive until it ends: the model it runs on, so a server of several
    /// models never unloads one with a job in flight (set when it is submitted).
    pub hold: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

/// One further choice of a job: the same request sampled with its own seed.
pub struct Fork {
    /// The seed of its sampler.
    pub seed: u64,
    /// Where its text goes.
    pub events: UnboundedSender<Event>,
}

impl Job {
    /// Slots it takes: one per choice.
    pub fn slots(&self) -> usize {
        1 + self.forks.len()
    }
}
