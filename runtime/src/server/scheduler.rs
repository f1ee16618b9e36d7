//! Continuous batching. One thread owns every running sequence: each iteration it admits queued
//! requests into free slots, drops sequences whose client went away (their KV cache goes back to
//! the pool), and runs one [`Model::forward_batch`] holding a decode row for every sequence that
//! is generating plus prompt chunks of sequences still being prefilled, up to a row budget. The
//! weights are read once per iteration however many clients are decoding, which is what makes
//! many concurrent streams cheap on a memory-bound CPU; chunked prefill keeps a long prompt from
//! stalling everybody else's tokens.
//!
//! Bounded everywhere: `slots` sequences run at once (each with one `ctx`-token KV cache, pooled
//! and reused, so memory stays flat), `queue` requests wait, and a full queue is refused at once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::batch_shape::{SeqShape, Shape, panic_text};
use super::metrics::Metrics;
use super::prefix::Pool;
use rayon::prelude::*;

use crate::generate::{Decoder, Finish, Request, Step};
use crate::grammar::Grammars;
use crate::model::{Checkpoint, Model, Session};
use crate::text::Text;

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
    Logprob(crate::logprobs::TokenLogprob),
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
    pub embed: Option<crate::embed::Pooling>,
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

/// Why a job was not queued.
#[derive(Debug)]
pub enum Busy {
    /// The queue is full.
    Full,
    /// The scheduler thread has stopped.
    Stopped,
}

/// The handle the HTTP side submits through.
pub struct Scheduler {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

struct Seq {
    job: Job,
    session: Session,
    fed: usize,
    /// Prompt tokens reused from the pool's cache.
    reused: usize,
    /// The recurrent state once the prompt has been read (recurrent models only).
    checkpoint: Option<Checkpoint>,
    dec: Decoder,
    next: Option<u32>,
    ttft: Option<Duration>,
    last: Instant,
    /// An embedding request's states so far.
    pooler: Option<crate::embed::Pooler>,
}

impl Scheduler {
    /// Starts the scheduler thread over `engine`.
    pub fn start(engine: Arc<Engine>, limits: Limits, metrics: Arc<Metrics>) -> Scheduler {
        let (tx, rx) = std::sync::mpsc::sync_channel(limits.queue.max(1));
        let m = metrics.clone();
        std::thread::Builder::new()
            .name("onebit-scheduler".into())
            .spawn(move || run(&engine, limits, &m, rx))
            .map(|_| ())
            .unwrap_or_else(|e| tracing::error!(error = %e, "cannot start the scheduler thread"));
        Scheduler { tx, metrics }
    }

    /// Queues `job`, or says why not (full queue: the caller answers 503 at once).
    pub fn submit(&self, job: Job) -> Result<(), Busy> {
        self.metrics.queued.inc();
        self.tx.try_send(job).map_err(|e| {
            self.metrics.queued.dec();
            match e {
                TrySendError::Full(_) => Busy::Full,
                TrySendError::Disconnected(_) => Busy::Stopped,
            }
        })
    }
}

fn run(engine: &Engine, limits: Limits, m: &Metrics, rx: Receiver<Job>) {
    let mut active: Vec<Seq> = Vec::new();
    // Every slot's cache, empty: each grows in blocks as its sequence fills it.
    let mut pool = Pool::new(&engine.model, limits.slots, limits.ctx, limits.prefix_cache);
    let memory = engine.model.cache_memory().clone();
    // A job waiting for as many free slots as it has choices.
    let mut parked: Option<Job> = None;
    tracing::info!(
        slots = limits.slots,
        ctx = limits.ctx,
        cache_type = %engine.model.cache_type(),
        full_mib = (limits.slots * engine.model.session_bytes(limits.ctx)) >> 20,
        budget_mib = memory.limit() >> 20,
        "KV caches ready (allocated as they fill)"
    );
    loop {
        // Admit: block when idle, otherwise take what is waiting.
        while active.len() < limits.slots {
            let job = if let Some(j) = parked.take() {
                j
            } else if active.is_empty() {
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            if job.events.is_closed() && job.forks.iter().all(|f| f.events.is_closed()) {
                m.queued.dec();
                m.finish(Finish::Cancelled.as_str());
                continue;
            }
            if active.len() + job.slots() > limits.slots {
                parked = Some(job);
                break;
            }
            m.queued.dec();
            // The free caches the further choices take; each becomes a copy of this one's.
            for _ in &job.forks {
                drop(pool.take(&[]));
            }
            // An embedding reads every token's state, so it reuses no cached prefix.
            let prefix: &[u32] = if job.embed.is_some() { &[] } else { &job.ids };
            let (mut session, reused) = match pool.take(prefix) {
                Some(t) => (t.session, t.reused),
                None => (engine.model.session(limits.ctx), 0),
            };
            if reused > 0 {
                m.prefix_hits.inc();
                m.prefix_tokens.inc_by(reused as u64);
            }
            session.read_top(job.req.reads_top());
            let dec = Decoder::new(&job.ids, &job.req);
            let pooler = job
                .embed
                .map(|p| crate::embed::Pooler::new(p, engine.model.spec.hidden));
            active.push(Seq {
                pooler,
                job,
                session,
                fed: reused,
                reused,
                checkpoint: None,
                dec,
                next: None,
                ttft: None,
                last: Instant::now(),
            });
        }
        // Clients that went away free their slot and cache now.
        active.retain_mut(|s| {
            if s.job.events.is_closed() {
                m.finish(Finish::Cancelled.as_str());
                give_back(&mut pool, s);
                false
            } else {
                true
            }
        });
        m.running.set(active.len() as i64);
        if active.is_empty() {
            continue;
        }
        let mut shape = Shape::default();
        let step = std::panic::catch_unwind(AssertUnwindSafe(|| {
            iterate(engine, limits, m, &mut active, &mut pool, &mut shape)
        }));
        let (done, failed) = match step {
            Ok(done) => (done, false),
            Err(panic) => {
                // A bug, not an answer: counted, and logged with what the batch held so the
                // failing shape can be replayed.
                m.model_panics.inc();
                tracing::error!(
                    panic = panic_text(panic.as_ref()),
                    batch = %shape,
                    "the model panicked; failing the running requests"
                );
                for s in &active {
                    m.finish("error");
                    let _ = s
                        .job
                        .events
                        .send(Event::Failed("internal error in the model".into()));
                }
                ((0..active.len()).collect(), true)
            }
        };
        for &i in done.iter().rev() {
            let mut s = active.swap_remove(i);
            if failed {
                pool.give_cleared(s.session);
            } else {
                give_back(&mut pool, &mut s);
            }
        }
        m.running.set(active.len() as i64);
        m.kv_cache(&memory);
    }
}

/// Returns `s`'s cache to the pool with the tokens it holds: the prompt, then what was generated
/// and fed back.
fn give_back(pool: &mut Pool, s: &mut Seq) {
    let mut tokens = Vec::with_capacity(s.job.ids.len() + s.dec.tokens().len());
    tokens.extend_from_slice(&s.job.ids);
    tokens.extend_from_slice(s.dec.tokens());
    let session = std::mem::replace(&mut s.session, Session::empty());
    pool.give(session, tokens, s.checkpoint.take());
}

/// Tests only: a forward batch of exactly this many rows panics (0: never), to exercise the guard
/// that fails the running requests. No other test builds a batch this large.
#[cfg(test)]
pub(crate) static PANIC_AT_ROWS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// One forward batch; returns the indices of sequences that ended (ascending).
/// `shape` is filled before the forward pass runs, so a panic inside it can be reported.
fn iterate(
    engine: &Engine,
    limits: Limits,
    m: &Metrics,
    active: &mut Vec<Seq>,
    pool: &mut Pool,
    shape: &mut Shape,
) -> Vec<usize> {
    let mut rows: Vec<(usize, u32)> = Vec::new();
    let mut want: Vec<(usize, usize)> = Vec::new(); // (row, sequence)
    let mut hidden: Vec<usize> = Vec::new(); // rows of embedding requests
    let mut failed = Vec::new();
    // A sequence whose cache cannot grow for its rows is answered 503 and left out of the batch;
    // the free caches' blocks are released first, so an idle prefix never costs a request.
    let room = |s: &mut Seq, end: usize, pool: &mut Pool| -> bool {
        let grown = s.session.grow(end).or_else(|_| {
            pool.release();
            s.session.grow(end)
        });
        match grown {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "request refused: no room for its KV cache");
                let _ = s.job.events.send(Event::NoRoom(e.to_string()));
                m.finish("error");
                false
            }
        }
    };
    for (i, s) in active.iter_mut().enumerate() {
        if let Some(t) = s.next {
            if !room(s, s.session.pos + 1, pool) {
                failed.push(i);
                continue;
            }
            want.push((rows.len(), i));
            rows.push((i, t));
        }
    }
    let mut budget = limits.batch.saturating_sub(rows.len()).max(1);
    let mut prefill = Vec::new();
    for (i, s) in active.iter_mut().enumerate() {
        if budget == 0 {
            break;
        }
        let left = s.job.ids.len() - s.fed;
        if s.next.is_some() || left == 0 {
            continue;
        }
        let take = left.min(budget);
        if !room(s, s.session.pos + take, pool) {
            failed.push(i);
            continue;
        }
        if s.pooler.is_some() {
            hidden.extend(rows.len()..rows.len() + take);
        } else if take == left {
            want.push((rows.len() + take - 1, i));
        }
        rows.extend(s.job.ids[s.fed..s.fed + take].iter().map(|&t| (i, t)));
        prefill.push((i, take));
        budget -= take;
    }
    // A grammar's mask goes to the head with the row it restricts.
    for &(_, i) in &want {
        let s = &mut active[i];
        match s.dec.allowed() {
            Ok(a) => s.session.allow_only(a),
            Err(e) => {
                let _ = s.job.events.send(Event::Failed(e.to_string()));
                m.finish("error");
                failed.push(i);
            }
        }
    }
    m.batch_rows.observe(rows.len() as f64);
    shape.rows = rows.len();
    shape.logits_rows = want.len();
    shape.seqs = active
        .iter()
        .map(|s| SeqShape {
            prompt_tokens: s.job.ids.len(),
            fed: s.fed,
            rows: 0,
            generated: s.dec.tokens().len(),
        })
        .collect();
    for &(i, _) in &rows {
        shape.seqs[i].rows += 1;
    }
    #[cfg(test)]
    if PANIC_AT_ROWS.load(std::sync::atomic::Ordering::Relaxed) == rows.len() {
        panic!("injected panic at {} rows", rows.len());
    }
    let wanted: Vec<usize> = want.iter().map(|&(r, _)| r).collect();
    let out = {
        let mut sessions: Vec<&mut Session> = active.iter_mut().map(|s| &mut s.session).collect();
        engine
            .model
            .forward_batch_with(&mut sessions, &rows, &wanted, &hidden)
    };
    let (mut logits, states) = match out {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "forward batch failed");
            for s in active.iter() {
                let _ = s.job.events.send(Event::Failed(e.to_string()));
            }
            return (0..active.len()).collect();
        }
    };
    let width = engine.model.spec.hidden;
    let mut states = states.chunks_exact(width);
    let mut done = failed;
    for (i, take) in prefill {
        let s = &mut active[i];
        s.fed += take;
        if s.fed == s.job.ids.len() {
            s.checkpoint = s.session.checkpoint();
        }
        m.prompt_tokens.inc_by(take as u64);
        if let Some(p) = &mut s.pooler {
            for _ in 0..take {
                p.push(states.next().unwrap_or_default());
            }
            if s.fed == s.job.ids.len() {
                let _ = s.job.events.send(Event::Embedding(p.finish()));
                let _ = s.job.events.send(Event::Done(Summary {
                    prompt_tokens: s.job.ids.len(),
                    cached_tokens: 0,
                    completion_tokens: 0,
                    finish: Finish::Stop,
                    ttft: s.job.arrived.elapsed(),
                }));
                m.finish("embedding");
                done.push(i);
            }
        }
    }
    // Sample every sequence that got logits, in parallel (a full-vocabulary softmax each).
    let vocab = engine.model.spec.vocab;
    let mut rows_of: Vec<Option<usize>> = vec![None; active.len()];
    for (k, &(_, i)) in want.iter().enumerate() {
        rows_of[i] = Some(k);
    }
    // Further choices start from the prompt's last logits, each in a copy of its cache.
    let mut forked_rows: Vec<Vec<f32>> = Vec::new();
    for i in 0..active.len() {
        let Some(k) = rows_of[i] else { continue };
        if active[i].job.forks.is_empty() || done.contains(&i) {
            continue;
        }
        let forks = std::mem::take(&mut active[i].job.forks);
        for fork in forks {
            let parent = &active[i];
            let mut req = parent.job.req.clone();
            req.sampler.seed = fork.seed;
            let dec = Decoder::new(&parent.job.ids, &req);
            let seq = Seq {
                job: Job {
                    ids: parent.job.ids.clone(),
                    req,
                    events: fork.events,
                    arrived: parent.job.arrived,
                    forks: Vec::new(),
                    embed: None,
                },
                session: parent.session.clone(),
                fed: parent.fed,
                reused: parent.reused,
                checkpoint: parent.checkpoint.clone(),
                dec,
                next: None,
                ttft: None,
                last: parent.last,
                pooler: None,
            };
            forked_rows.push(logits[k * vocab..(k + 1) * vocab].to_vec());
            rows_of.push(Some(want.len() + forked_rows.len() - 1));
            active.push(seq);
        }
    }
    let mut chunks: Vec<Option<&mut [f32]>> = logits
        .chunks_mut(vocab)
        .chain(forked_rows.iter_mut().map(Vec::as_mut_slice))
        .map(Some)
        .collect();
    let mut targets = Vec::with_capacity(want.len());
    for (i, s) in active.iter_mut().enumerate() {
        if let Some(l) = rows_of[i].and_then(|k| chunks[k].take())
            && !done.contains(&i)
        {
            targets.push((i, s, l));
        }
    }
    let steps: Vec<(usize, crate::Result<Step>)> = targets
        .into_par_iter()
        .map(|(i, s, l)| {
            let room = s.session.pos + 1 < s.session.capacity;
            (i, s.dec.step(&engine.model, &engine.text, l, room))
        })
        .collect();
    for (i, st) in steps {
        let s = &mut active[i];
        let st = match st {
            Ok(st) => st,
            Err(e) => {
                let _ = s.job.events.send(Event::Failed(e.to_string()));
                m.finish("error");
                done.push(i);
                continue;
            }
        };
        let now = Instant::now();
        if s.ttft.is_none() {
            let t = s.job.arrived.elapsed();
            m.ttft.observe(t.as_secs_f64());
            s.ttft = Some(t);
        } else if st.token.is_some() {
            m.inter_token
                .observe(now.duration_since(s.last).as_secs_f64());
        }
        s.last = now;
        if st.token.is_some() {
            m.completion_tokens.inc();
        }
        if let Some(lp) = st.logprob {
            let _ = s.job.events.send(Event::Logprob(lp));
        }
        if !st.piece.is_empty() {
            let _ = s.job.events.send(Event::Text(st.piece));
        }
        match st.finish {
            Some(f) => {
                m.finish(f.as_str());
                let _ = s.job.events.send(Event::Done(Summary {
                    prompt_tokens: s.job.ids.len(),
                    cached_tokens: s.reused,
                    completion_tokens: s.dec.tokens().len(),
                    finish: f,
                    ttft: s.ttft.unwrap_or_default(),
                }));
                done.push(i);
            }
            None => s.next = st.token,
        }
    }
    done.sort_unstable();
    done
}
