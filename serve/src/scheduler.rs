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
use std::time::Instant;

use onebit_runtime::generate::{Decoder, Finish, place_images};
use onebit_runtime::model::Session;

use crate::batch_shape::{Shape, panic_text};
use crate::job::{Engine, Event, Job, Limits};
use crate::metrics::Metrics;
use crate::prefix::Pool;
use crate::step::{Seq, iterate};

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
            let images = image_places(&engine.model, &job.ids, &job.req.images);
            let (mut session, reused) = match pool.take_with_images(prefix, &images) {
                Some(t) => (t.session, t.reused),
                None => (engine.model.session(limits.ctx), 0),
            };
            // Checked when the request was bound; a failure here is the cache's.
            if let Err(e) = place_images(&engine.model, &mut session, &job.ids, &job.req.images) {
                tracing::error!(error = %e, "placing the prompt's images");
                m.finish("error");
                let _ = job.events.send(Event::Failed(e.to_string()));
                pool.give_cleared(session);
                continue;
            }
            if reused > 0 {
                m.prefix_hits.inc();
                m.prefix_tokens.inc_by(reused as u64);
            }
            session.read_top(job.req.reads_top());
            let dec = Decoder::new(&job.ids, &job.req);
            let pooler = job
                .embed
                .map(|p| onebit_runtime::embed::Pooler::new(p, engine.model.spec.hidden));
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
/// Where the prompt `ids`' images go: (first position, content digest) of each run of the
/// model's image token, with the request's images in order.
fn image_places(
    model: &onebit_runtime::Model,
    ids: &[u32],
    images: &[Arc<onebit_runtime::ImageEmbeds>],
) -> Vec<(usize, [u8; 32])> {
    match model.images() {
        Some(enc) => onebit_runtime::image_input::image_runs(ids, enc.spec().image_token)
            .into_iter()
            .zip(images)
            .map(|((at, _), im)| (at, im.digest))
            .collect(),
        None => Vec::new(),
    }
}

fn give_back(pool: &mut Pool, s: &mut Seq) {
    let mut tokens = Vec::with_capacity(s.job.ids.len() + s.dec.tokens().len());
    tokens.extend_from_slice(&s.job.ids);
    tokens.extend_from_slice(s.dec.tokens());
    let session = std::mem::replace(&mut s.session, Session::empty());
    pool.give(session, tokens, s.checkpoint.take());
}
