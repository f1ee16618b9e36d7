//! The scheduler under randomized load, property style: whatever batches continuous batching
//! builds (prompt chunks that need no logits, decode rows only, both mixed, sequences of every
//! mixer kind at different depths), every request's completion is exactly what
//! [`onebit_runtime::generate::generate`] gives the same request alone, token for token.
//!
//! Each case draws `--batch` log-uniformly from 1 to 512 (small batches, where prompts span
//! several passes, are as likely as large ones), `--parallel` from 1 to 4, one to six requests with
//! prompts of 1 to 3 × `--batch` tokens, greedy or seeded sampling, and a consumer per request that
//! reads the whole stream, waits for the whole answer, or goes away after a few pieces. Seeded:
//! `ONEBIT_SCHED_SEED` replays a run, `ONEBIT_SCHED_CASES` sets the cases per mixer kind (100 by
//! default, 300 in all); a failure names its seed, case and request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::unbounded_channel;

use super::job::{Engine, Event, Job, Limits};
use super::metrics::Metrics;
use super::scheduler::Scheduler;
use onebit_pack::spec::{Act, ModelSpec, QkNorm, ValueHeadOrder};
use onebit_runtime::generate::{Finish, Prompt, Request, generate};
use onebit_runtime::model::Model;
use onebit_runtime::pack::Pack;
use onebit_runtime::sample::SamplerConfig;
use onebit_runtime::testing::{V, conv_spec, delta_spec, spec, write_pack_with};
use onebit_runtime::text::Text;

/// Longest `--batch` drawn.
const MAX_BATCH: usize = 512;
/// Context per slot: the longest prompt (3 × 512) plus the longest answer.
const CTX: usize = 3 * MAX_BATCH + 16;

/// SplitMix64: the test's only source of randomness, so a seed replays a run exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// Log-uniform in `1..=hi`.
    fn log_uniform(&mut self, hi: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((hi as f64 + 1.0).powf(u) as usize).clamp(1, hi)
    }
}

/// A word-level tokenizer with one word per id (`w0` … `w63`): decoding joins words with spaces,
/// so equal texts are equal token sequences.
fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..V)
        .map(|i| (format!("w{i}"), serde_json::Value::from(i)))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    })
    .to_string()
}

/// A synthetic pack of `spec` (its head tiled with the 2-bit scan head when `scan`) as an engine.
fn engine(spec: &ModelSpec, scan: bool) -> (tempfile::TempDir, Arc<Engine>) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack_with(dir.path(), spec, scan, scan);
    let tok = dir.path().join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json()).expect("tokenizer");
    let mut model = Model::load(Pack::open(dir.path(), false).expect("open")).expect("load");
    if scan {
        // Four exact candidates: greedy rows take the scan head, rows sampling the whole
        // distribution the tiled head, so one batch mixes both.
        model.set_head_rescore(4);
    }
    let text = Text::load(&tok, None).expect("text");
    (dir, Arc::new(Engine::new(model, text)))
}

/// How a request's client behaves.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// Reads every piece as it comes (SSE).
    Streams,
    /// Waits for the whole answer.
    Waits,
    /// Goes away after this many pieces.
    Leaves(usize),
}

#[derive(Debug)]
struct Drawn {
    ids: Vec<u32>,
    req: Request,
    client: Client,
}

/// A request of up to 3 × `batch` random tokens; half of them, when there are `earlier` prompts,
/// start with a prefix of one (all of it, at times), so freed caches get reused.
fn draw_request(rng: &mut Rng, batch: usize, earlier: &[Vec<u32>]) -> Drawn {
    let mut ids: Vec<u32> = Vec::new();
    if !earlier.is_empty() && rng.range(0, 1) == 0 {
        let from = &earlier[rng.range(0, earlier.len() - 1)];
        // All of it a third of the time: a recurrent model resumes only at a prompt's end.
        let k = if rng.range(0, 2) == 0 {
            from.len()
        } else {
            rng.range(1, from.len())
        };
        ids.extend_from_slice(&from[..k]);
    }
    let len = rng.range(usize::from(ids.is_empty()), 3 * batch - ids.len());
    ids.extend((0..len).map(|_| rng.range(0, V - 1) as u32));
    let sampler = if rng.range(0, 3) == 0 {
        SamplerConfig {
            temperature: 0.9,
            seed: rng.next(),
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::default()
    };
    let client = match rng.range(0, 2) {
        0 => Client::Streams,
        1 => Client::Waits,
        _ => Client::Leaves(rng.range(0, 3)),
    };
    Drawn {
        ids,
        req: Request {
            prompt: Prompt::Tokens(Vec::new()),
            max_tokens: rng.range(1, 6),
            sampler,
            stop: Vec::new(),
            constraint: None,
            keep_special: false,
            logprobs: None,
            images: Vec::new(),
        },
        client,
    }
}

/// What a client saw: its text pieces and how the request ended (`None` when it left first).
struct Seen {
    text: String,
    done: Option<(usize, usize, Finish)>,
}

fn run_cases(name: &str, spec: &ModelSpec, scan: bool) {
    let (_dir, engine) = engine(spec, scan);
    let seed: u64 = std::env::var("ONEBIT_SCHED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_0037);
    let cases: usize = std::env::var("ONEBIT_SCHED_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let mut rng = Rng(seed ^ blake3::hash(name.as_bytes()).as_bytes()[0] as u64);
    let mut session = engine.model.session(CTX);
    let mut reused = 0;
    for case in 0..cases {
        let batch = rng.log_uniform(MAX_BATCH);
        let parallel = rng.range(1, 4);
        let n = rng.range(1, 6);
        let mut drawn: Vec<Drawn> = Vec::new();
        for _ in 0..n {
            let earlier: Vec<Vec<u32>> = drawn.iter().map(|d| d.ids.clone()).collect();
            drawn.push(draw_request(&mut rng, batch, &earlier));
        }
        let at = format!("{name}, seed {seed}, case {case}: batch {batch}, parallel {parallel}");
        let metrics = Arc::new(Metrics::new());
        let sched = Scheduler::start(
            engine.clone(),
            Limits {
                slots: parallel,
                queue: 8,
                batch,
                ctx: CTX,
                prefix_cache: true,
                cache_budget: None,
            },
            metrics.clone(),
        );
        let clients: Vec<_> = drawn
            .iter()
            .map(|d| {
                let (tx, mut rx) = unbounded_channel();
                let job = Job {
                    ids: d.ids.clone(),
                    req: d.req.clone(),
                    events: tx,
                    arrived: Instant::now(),
                    forks: Vec::new(),
                    embed: None,
                    hold: None,
                };
                assert!(sched.submit(job).is_ok(), "{at}: queued");
                let client = d.client;
                std::thread::spawn(move || {
                    let mut seen = Seen {
                        text: String::new(),
                        done: None,
                    };
                    let mut pieces = 0;
                    while let Some(ev) = rx.blocking_recv() {
                        match ev {
                            Event::Text(t) => {
                                seen.text.push_str(&t);
                                pieces += 1;
                                if matches!(client, Client::Leaves(k) if pieces > k) {
                                    // Dropping the receiver is a client going away mid-stream.
                                    return seen;
                                }
                            }
                            Event::Done(s) => {
                                seen.done = Some((s.prompt_tokens, s.completion_tokens, s.finish));
                                return seen;
                            }
                            Event::Logprob(l) => {
                                panic!("log-probabilities nobody asked for: {l:?}")
                            }
                            Event::Embedding(_) => panic!("a vector nobody asked for"),
                            Event::Failed(e) | Event::NoRoom(e) => panic!("request failed: {e}"),
                        }
                    }
                    seen
                })
            })
            .collect();
        for (r, (d, c)) in drawn.iter().zip(clients).enumerate() {
            let seen = c
                .join()
                .unwrap_or_else(|_| panic!("{at}, request {r}: the client saw a failure"));
            let mut alone_req = d.req.clone();
            alone_req.prompt = Prompt::Tokens(d.ids.clone());
            let alone = generate(
                &engine.model,
                &engine.text,
                &mut session,
                &alone_req,
                |_| true,
            )
            .expect("generate alone");
            let what = format!(
                "{at}, request {r} ({} prompt tokens, {:?}, {:?})",
                d.ids.len(),
                d.client,
                d.req.sampler
            );
            match seen.done {
                Some((prompt, completion, finish)) => {
                    assert_eq!(seen.text, alone.text, "{what}: text");
                    assert_eq!(prompt, d.ids.len(), "{what}: prompt tokens");
                    assert_eq!(completion, alone.tokens.len(), "{what}: completion tokens");
                    assert_eq!(finish, alone.finish, "{what}: finish");
                }
                None => {
                    assert!(matches!(d.client, Client::Leaves(_)), "{what}: stream cut");
                    assert!(
                        alone.text.starts_with(&seen.text),
                        "{what}: {:?} is not a prefix of {:?}",
                        seen.text,
                        alone.text
                    );
                }
            }
        }
        drop(sched);
        reused += metrics.prefix_tokens.get();
        assert_eq!(metrics.model_panics.get(), 0, "{at}: model panics");
        // Clients that left are noticed at the scheduler's next turn: idle means zero running.
        let t0 = Instant::now();
        while metrics.running.get() != 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            metrics.running.get(),
            0,
            "{at}: running sequences when idle"
        );
    }
    // The shared prefixes were taken from the cache, not recomputed, in some of the cases.
    assert!(reused > 0, "{name}: no prompt prefix was ever reused");
}

#[test]
fn attention_completions_under_random_batches_equal_generating_each_alone() {
    run_cases(
        "attention",
        &spec(QkNorm::BeforeRope, Act::GeluTanh, true),
        true,
    );
}

#[test]
fn short_convolution_completions_under_random_batches_equal_generating_each_alone() {
    run_cases("short convolution", &conv_spec(), false);
}

#[test]
fn gated_deltanet_completions_under_random_batches_equal_generating_each_alone() {
    run_cases("gated deltanet", &delta_spec(ValueHeadOrder::Tiled), false);
}

/// A panic in the model fails the running requests, counts in `/metrics` (`model_panics`, an
/// `error` generation) and leaves the scheduler serving the next request.
#[test]
fn a_panic_in_the_model_fails_the_batch_is_counted_and_the_server_goes_on() {
    const ROWS: usize = 777; // no other test builds a batch of this many rows
    let (_dir, engine) = engine(&conv_spec(), false);
    super::step::PANIC_AT_ROWS.store(ROWS, std::sync::atomic::Ordering::Relaxed);
    let metrics = Arc::new(Metrics::new());
    let sched = Scheduler::start(
        engine.clone(),
        Limits {
            slots: 2,
            queue: 4,
            batch: ROWS,
            ctx: 1024,
            prefix_cache: true,
            cache_budget: None,
        },
        metrics.clone(),
    );
    let ask = |len: usize| {
        let (tx, mut rx) = unbounded_channel();
        let job = Job {
            ids: (0..len).map(|i| (i % (V - 3) + 3) as u32).collect(),
            req: Request {
                prompt: Prompt::Tokens(Vec::new()),
                max_tokens: 3,
                sampler: SamplerConfig::default(),
                stop: Vec::new(),
                constraint: None,
                keep_special: false,
                logprobs: None,
                images: Vec::new(),
            },
            events: tx,
            arrived: Instant::now(),
            forks: Vec::new(),
            embed: None,
            hold: None,
        };
        assert!(sched.submit(job).is_ok(), "queued");
        let mut last = None;
        while let Some(ev) = rx.blocking_recv() {
            let end = !matches!(ev, Event::Text(_));
            last = Some(ev);
            if end {
                break;
            }
        }
        last
    };
    // A 777-token prompt fills one 777-row batch: the injected panic.
    assert!(
        matches!(ask(ROWS), Some(Event::Failed(ref e)) if e.contains("internal error")),
        "the request fails"
    );
    assert_eq!(metrics.model_panics.get(), 1);
    let errors = metrics
        .finished
        .get_or_create(&super::metrics::FinishLabels {
            reason: "error".into(),
        })
        .get();
    assert_eq!(errors, 1, "counted as an error generation");
    // The next request is served.
    assert!(
        matches!(ask(5), Some(Event::Done(_))),
        "served after the panic"
    );
    assert_eq!(metrics.model_panics.get(), 1);
}
