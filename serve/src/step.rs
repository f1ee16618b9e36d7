//! One iteration of the scheduler, in its steps: plan the batch's rows (growing each cache for
//! them), mask the rows a grammar restricts, run the forward pass, pool embeddings and advance
//! prompts, fork further choices, sample, send.

use std::time::{Duration, Instant};

use rayon::prelude::*;

use onebit_runtime::generate::{Decoder, Finish, Step};
use onebit_runtime::model::{Checkpoint, Session};

use crate::batch_shape::{SeqShape, Shape};
use crate::job::{Engine, Event, Fork, Job, Limits, Summary};
use crate::metrics::Metrics;
use crate::prefix::Pool;

/// One running sequence: its job, its cache, how far its prompt has been read, its decoder.
pub(crate) struct Seq {
    pub job: Job,
    pub session: Session,
    pub fed: usize,
    /// Prompt tokens reused from the pool's cache.
    pub reused: usize,
    /// The recurrent state once the prompt has been read (recurrent models only).
    pub checkpoint: Option<Checkpoint>,
    pub dec: Decoder,
    pub next: Option<u32>,
    pub ttft: Option<Duration>,
    pub last: Instant,
    /// An embedding request's states so far.
    pub pooler: Option<onebit_runtime::embed::Pooler>,
}

impl Seq {
    /// A further choice of this sequence: the same request with `fork`'s seed, in a copy of its
    /// cache at the same place.
    fn fork(&self, fork: Fork) -> Seq {
        let mut req = self.job.req.clone();
        req.sampler.seed = fork.seed;
        let dec = Decoder::new(&self.job.ids, &req);
        Seq {
            job: Job {
                ids: self.job.ids.clone(),
                req,
                events: fork.events,
                arrived: self.job.arrived,
                forks: Vec::new(),
                embed: None,
                hold: self.job.hold.clone(),
            },
            session: self.session.clone(),
            fed: self.fed,
            reused: self.reused,
            checkpoint: self.checkpoint.clone(),
            dec,
            next: None,
            ttft: None,
            last: self.last,
            pooler: None,
        }
    }
}

/// Tests only: a forward batch of exactly this many rows panics (0: never), to exercise the guard
/// that fails the running requests. No other test builds a batch this large.
#[cfg(test)]
pub(crate) static PANIC_AT_ROWS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// What one iteration runs: the forward batch's rows and what is read back from them.
#[derive(Default)]
struct Plan {
    /// (sequence, token) of every row: decode rows first, then prompt chunks.
    rows: Vec<(usize, u32)>,
    /// (row, sequence): the rows whose logits a sequence samples from.
    want: Vec<(usize, usize)>,
    /// The rows whose hidden states an embedding request pools.
    hidden: Vec<usize>,
    /// (sequence, prompt tokens in this batch).
    prefill: Vec<(usize, usize)>,
    /// Sequences already answered (no room, a failed grammar) and left out of the batch.
    failed: Vec<usize>,
}

/// One forward batch; returns the indices of sequences that ended (ascending).
/// `shape` is filled before the forward pass runs, so a panic inside it can be reported. The
/// steps: plan the rows (growing each cache for them), mask the rows a grammar restricts, run
/// the forward pass, pool embeddings and advance prompts, fork further choices, sample, send.
pub(crate) fn iterate(
    engine: &Engine,
    limits: Limits,
    m: &Metrics,
    active: &mut Vec<Seq>,
    pool: &mut Pool,
    shape: &mut Shape,
) -> Vec<usize> {
    let mut plan = plan(limits, m, active, pool);
    mask(m, active, &mut plan);
    m.batch_rows.observe(plan.rows.len() as f64);
    *shape = describe(active, &plan);
    #[cfg(test)]
    if PANIC_AT_ROWS.load(std::sync::atomic::Ordering::Relaxed) == plan.rows.len() {
        panic!("injected panic at {} rows", plan.rows.len());
    }
    let (mut logits, states) = match forward(engine, active, &plan) {
        Ok(out) => out,
        Err(e) => {
            tracing::error!(error = %e, "forward batch failed");
            for s in active.iter() {
                let _ = s.job.events.send(Event::Failed(e.to_string()));
            }
            return (0..active.len()).collect();
        }
    };
    let mut done = std::mem::take(&mut plan.failed);
    let width = engine.model.spec.hidden;
    pool_prompts(m, active, &plan.prefill, &states, width, &mut done);
    let vocab = engine.model.spec.vocab;
    let (rows_of, mut forked) = fork(active, &plan.want, &logits, vocab, &done);
    let steps = sample(engine, active, &mut logits, &mut forked, &rows_of, &done);
    for (i, st) in steps {
        if send(m, &mut active[i], st) {
            done.push(i);
        }
    }
    done.sort_unstable();
    done
}

/// Grows `s`'s cache to `end` tokens, releasing the free caches' blocks first if it must, so an
/// idle prefix never costs a request; a sequence whose cache cannot grow is answered 503
/// (`false`: leave it out of the batch).
fn grow(s: &mut Seq, end: usize, pool: &mut Pool, m: &Metrics) -> bool {
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
}

/// The batch's rows: a decode row for every generating sequence, then prompt chunks up to the
/// row budget (at least one row), each cache grown for its rows.
fn plan(limits: Limits, m: &Metrics, active: &mut [Seq], pool: &mut Pool) -> Plan {
    let mut plan = Plan::default();
    for (i, s) in active.iter_mut().enumerate() {
        if let Some(t) = s.next {
            if !grow(s, s.session.pos + 1, pool, m) {
                plan.failed.push(i);
                continue;
            }
            plan.want.push((plan.rows.len(), i));
            plan.rows.push((i, t));
        }
    }
    let mut budget = limits.batch.saturating_sub(plan.rows.len()).max(1);
    for (i, s) in active.iter_mut().enumerate() {
        if budget == 0 {
            break;
        }
        let left = s.job.ids.len() - s.fed;
        if s.next.is_some() || left == 0 {
            continue;
        }
        // An image's rows go through one pass: the chunk ends before an image it would cut, or
        // takes a whole image that starts it even past the budget.
        let take = s.session.pass_end(s.fed, s.fed + left.min(budget)) - s.fed;
        if !grow(s, s.session.pos + take, pool, m) {
            plan.failed.push(i);
            continue;
        }
        let at = plan.rows.len();
        if s.pooler.is_some() {
            plan.hidden.extend(at..at + take);
        } else if take == left {
            plan.want.push((at + take - 1, i));
        }
        plan.rows
            .extend(s.job.ids[s.fed..s.fed + take].iter().map(|&t| (i, t)));
        plan.prefill.push((i, take));
        budget = budget.saturating_sub(take);
    }
    plan
}

/// A grammar's mask goes to the head with the row it restricts; a grammar that fails answers
/// its request.
fn mask(m: &Metrics, active: &mut [Seq], plan: &mut Plan) {
    for &(_, i) in &plan.want {
        let s = &mut active[i];
        match s.dec.allowed() {
            Ok(a) => s.session.allow_only(a),
            Err(e) => {
                let _ = s.job.events.send(Event::Failed(e.to_string()));
                m.finish("error");
                plan.failed.push(i);
            }
        }
    }
}

/// What the batch holds, for the log line of a panic inside the forward pass.
fn describe(active: &[Seq], plan: &Plan) -> Shape {
    let mut shape = Shape {
        rows: plan.rows.len(),
        logits_rows: plan.want.len(),
        seqs: active
            .iter()
            .map(|s| SeqShape {
                prompt_tokens: s.job.ids.len(),
                fed: s.fed,
                rows: 0,
                generated: s.dec.tokens().len(),
            })
            .collect(),
    };
    for &(i, _) in &plan.rows {
        shape.seqs[i].rows += 1;
    }
    shape
}

/// The forward pass over every row: the wanted rows' logits and the pooled rows' states.
fn forward(
    engine: &Engine,
    active: &mut [Seq],
    plan: &Plan,
) -> onebit_runtime::Result<(Vec<f32>, Vec<f32>)> {
    let wanted: Vec<usize> = plan.want.iter().map(|&(r, _)| r).collect();
    let mut sessions: Vec<&mut Session> = active.iter_mut().map(|s| &mut s.session).collect();
    engine
        .model
        .forward_batch_with(&mut sessions, &plan.rows, &wanted, &plan.hidden)
}

/// Advances every prompt by the tokens this batch read (a finished prompt keeps its recurrent
/// checkpoint) and pools the states of embedding requests, answering those whose prompt ended.
fn pool_prompts(
    m: &Metrics,
    active: &mut [Seq],
    prefill: &[(usize, usize)],
    states: &[f32],
    width: usize,
    done: &mut Vec<usize>,
) {
    let mut states = states.chunks_exact(width);
    for &(i, take) in prefill {
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
}

/// Starts the further choices of every job whose prompt just ended: each a new sequence in a
/// copy of its cache, from a copy of the prompt's last logits. Returns, per sequence (the new ones
/// last), the index of its logits row among the batch's rows then the copies, and the copies.
fn fork(
    active: &mut Vec<Seq>,
    want: &[(usize, usize)],
    logits: &[f32],
    vocab: usize,
    done: &[usize],
) -> (Vec<Option<usize>>, Vec<Vec<f32>>) {
    let mut rows_of: Vec<Option<usize>> = vec![None; active.len()];
    for (k, &(_, i)) in want.iter().enumerate() {
        rows_of[i] = Some(k);
    }
    let mut forked_rows: Vec<Vec<f32>> = Vec::new();
    for i in 0..active.len() {
        let Some(k) = rows_of[i] else { continue };
        if active[i].job.forks.is_empty() || done.contains(&i) {
            continue;
        }
        let forks = std::mem::take(&mut active[i].job.forks);
        for fork in forks {
            let seq = active[i].fork(fork);
            forked_rows.push(logits[k * vocab..(k + 1) * vocab].to_vec());
            rows_of.push(Some(want.len() + forked_rows.len() - 1));
            active.push(seq);
        }
    }
    (rows_of, forked_rows)
}

/// Samples every sequence that got logits and has not ended, in parallel (a full-vocabulary
/// softmax each).
fn sample(
    engine: &Engine,
    active: &mut [Seq],
    logits: &mut [f32],
    forked: &mut [Vec<f32>],
    rows_of: &[Option<usize>],
    done: &[usize],
) -> Vec<(usize, onebit_runtime::Result<Step>)> {
    let vocab = engine.model.spec.vocab;
    let mut chunks: Vec<Option<&mut [f32]>> = logits
        .chunks_mut(vocab)
        .chain(forked.iter_mut().map(Vec::as_mut_slice))
        .map(Some)
        .collect();
    let mut targets = Vec::new();
    for (i, s) in active.iter_mut().enumerate() {
        if let Some(l) = rows_of[i].and_then(|k| chunks[k].take())
            && !done.contains(&i)
        {
            targets.push((i, s, l));
        }
    }
    targets
        .into_par_iter()
        .map(|(i, s, l)| {
            let room = s.session.pos + 1 < s.session.capacity;
            (i, s.dec.step(&engine.model, &engine.text, l, room))
        })
        .collect()
}

/// Sends a sampled step to its client (log-probability, text, the end with its counts) and
/// counts it; returns whether the sequence ended.
fn send(m: &Metrics, s: &mut Seq, st: onebit_runtime::Result<Step>) -> bool {
    let st = match st {
        Ok(st) => st,
        Err(e) => {
            let _ = s.job.events.send(Event::Failed(e.to_string()));
            m.finish("error");
            return true;
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
            true
        }
        None => {
            s.next = st.token;
            false
        }
    }
}
