//! Runs a graph against the store: independent stages in parallel, each looked up by key, run
//! under a per-key lock when missing, and published atomically.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use serde_json::Value;

use crate::dag::Graph;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::hashcache::path_digest;
use crate::key::{params_digest, stage_key};
use crate::lock::{FileLock, LockMode};
use crate::progress::{Event, Reporter};
use crate::record::{StageEvent, Status, write_records};
use crate::refs::{RefRecord, RefStage, read_ref, write_ref};
use crate::stage::{InputSource, Stage, StageContext};
use crate::store::{EntryManifest, Freshness, now_ms, now_ns};
use crate::tiered::Store;

/// How to run a graph.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Stages run at once, at most (at least 1).
    pub jobs: usize,
    /// The ref this run updates (e.g. a pack name); `None` records nothing under refs/.
    pub ref_name: Option<String>,
    /// How to rebuild the ref, stored in it for `status`.
    pub source: Value,
    /// Re-hash every cached file instead of the size/mtime check.
    pub deep_check: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            ref_name: None,
            source: Value::Null,
            deep_check: false,
        }
    }
}

/// The outcome of a successful run.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The run id.
    pub run_id: String,
    /// One event per stage, in completion order.
    pub events: Vec<StageEvent>,
    /// The manifest of each stage's entry.
    pub manifests: BTreeMap<String, EntryManifest>,
    /// Where each stage's outputs live in the store: stage → output → path.
    pub artifacts: BTreeMap<String, BTreeMap<String, PathBuf>>,
}

impl RunReport {
    /// The path of `stage`'s output `output`.
    pub fn artifact(&self, stage: &str, output: &str) -> Option<&PathBuf> {
        self.artifacts.get(stage)?.get(output)
    }

    /// The event of `stage`.
    pub fn event(&self, stage: &str) -> Option<&StageEvent> {
        self.events.iter().find(|e| e.stage == stage)
    }
}

/// Why a stage is about to run, as cargo's `DirtyReason` says why a crate rebuilds.
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// The entry is in the store and intact.
    Hit,
    /// The entry was not cached here; it was fetched from the shared store.
    Fetched,
    /// Fetched from the shared store after another machine, holding its lease, published it.
    FetchedAfterWait,
    /// The entry appeared while this process waited on its lock.
    HitAfterWait,
    /// This ref never ran this stage.
    FirstRun,
    /// The stage's version changed since the ref's last run.
    VersionChanged {
        /// The recorded version.
        old: u32,
        /// The current one.
        new: u32,
    },
    /// Its params changed.
    ParamsChanged,
    /// The content of an input changed.
    InputChanged {
        /// The input name.
        input: String,
    },
    /// Same key as before, but the entry is gone (e.g. removed by `gc`).
    EntryMissing,
    /// The entry's files no longer match its manifest.
    Tampered {
        /// The file.
        file: String,
        /// How.
        why: String,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Hit => write!(f, "entry intact in the store"),
            Reason::HitAfterWait => write!(f, "cached by another process while this one waited"),
            Reason::Fetched => write!(f, "fetched from the shared store"),
            Reason::FetchedAfterWait => {
                write!(
                    f,
                    "published to the shared store by another machine while this one waited"
                )
            }
            Reason::FirstRun => write!(f, "first run"),
            Reason::VersionChanged { old, new } => {
                write!(f, "stage version changed from {old} to {new}")
            }
            Reason::ParamsChanged => write!(f, "params changed"),
            Reason::InputChanged { input } => write!(f, "input {input} changed"),
            Reason::EntryMissing => write!(f, "the cached entry is gone"),
            Reason::Tampered { file, why } => {
                write!(f, "the cached entry was modified ({file}: {why}); rebuilt")
            }
        }
    }
}

struct NodeDone {
    manifest: EntryManifest,
    event: StageEvent,
}

/// Runs `graph` against `store`. Writes run records whether or not it succeeds, and the ref (when
/// named) only when every stage succeeded.
pub fn run_graph(
    store: &Store,
    graph: &Graph,
    opts: &RunOptions,
    reporter: &dyn Reporter,
) -> Result<RunReport> {
    let _root = store.lock_root(LockMode::Shared)?;
    let run_id = format!("{:016x}-{:x}", now_ns() as u64, std::process::id());
    // On a shared store the run is leased, so that a gc elsewhere waits for it (and it for gc).
    let _run_lease = match store.shared() {
        Some(sh) => {
            let purpose = format!("import {}", opts.ref_name.as_deref().unwrap_or("(no ref)"));
            Some(crate::shared::gc::begin_run(sh, &run_id, &purpose, |b| {
                tracing::info!(holder = %b.holder, "waiting for a gc of the shared store to finish");
            })?)
        }
        None => None,
    };
    let started = Instant::now();
    reporter.event(&Event::RunStarted {
        run_id: run_id.clone(),
        ref_name: opts.ref_name.clone(),
        stages: graph.len(),
    });
    let previous = match &opts.ref_name {
        Some(name) => read_ref(store, name)?,
        None => None,
    };
    let order: Vec<usize> = graph
        .order()
        .filter_map(|s| graph.index_of(s.name()))
        .collect();
    let Progress {
        mut done,
        events,
        first_error,
        ..
    } = schedule(
        store,
        graph,
        opts,
        reporter,
        &run_id,
        previous.as_ref(),
        &order,
    );

    let hits = events.iter().filter(|e| e.status == Status::Hit).count();
    let misses = events.iter().filter(|e| e.status == Status::Miss).count();
    let records_path = store.runs_dir().join(format!("{run_id}.parquet"));
    let records_result =
        write_records(&records_path, &events).and_then(|()| match store.shared() {
            Some(sh) => sh.write_run(&run_id, &records_path),
            None => Ok(()),
        });
    reporter.event(&Event::RunFinished {
        run_id: run_id.clone(),
        hits,
        misses,
        failed: events.len() - hits - misses,
        duration_ms: started.elapsed().as_secs_f64() * 1e3,
    });
    if let Some(e) = first_error {
        if let Err(re) = records_result {
            tracing::warn!(error = %re, "run records not written");
        }
        return Err(e);
    }
    records_result?;

    let (manifests, artifacts, ref_stages) = collect(store, graph, &order, &mut done)?;
    if let Some(name) = &opts.ref_name {
        write_ref(
            store,
            &RefRecord {
                name: name.clone(),
                source: opts.source.clone(),
                run_id: run_id.clone(),
                updated_unix_ms: now_ms(),
                stages: ref_stages,
            },
        )?;
    }
    Ok(RunReport {
        run_id,
        events,
        manifests,
        artifacts,
    })
}

/// Where a run stands: each stage's result (done or failed), the events so far, and the first
/// error.
struct Progress {
    done: Vec<Option<NodeDone>>,
    failed: Vec<Option<String>>,
    events: Vec<StageEvent>,
    first_error: Option<Error>,
}

/// Runs the stages of `graph` in `order`, each once its parents are done, up to `opts.jobs` at
/// once; after a failure nothing new starts, and the stages never started are recorded as
/// skipped with the stage upstream that failed.
fn schedule(
    store: &Store,
    graph: &Graph,
    opts: &RunOptions,
    reporter: &dyn Reporter,
    run_id: &str,
    previous: Option<&RefRecord>,
    order: &[usize],
) -> Progress {
    let jobs = opts.jobs.max(1);
    let n = graph.len();
    let mut p = Progress {
        done: (0..n).map(|_| None).collect(),
        failed: vec![None; n],
        events: Vec::new(),
        first_error: None,
    };
    let mut started_nodes = vec![false; n];
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, Result<NodeDone>)>();
        let mut running = 0usize;
        loop {
            for &i in order {
                if running >= jobs || p.first_error.is_some() {
                    break;
                }
                if started_nodes[i] || !graph.parents(i).iter().all(|&q| p.done[q].is_some()) {
                    continue;
                }
                started_nodes[i] = true;
                let stage = graph.stage(i).clone();
                let inputs = match resolve_inputs(store, stage.as_ref(), graph, &p.done) {
                    Ok(x) => x,
                    Err(e) => {
                        p.failed[i] = Some(e.to_string());
                        p.events
                            .push(skipped_event(run_id, opts, stage.as_ref(), &e.to_string()));
                        p.first_error = Some(e);
                        break;
                    }
                };
                let prev = previous.and_then(|r| r.stage(stage.name()).cloned());
                let tx = tx.clone();
                running += 1;
                scope.spawn(move || {
                    let r = execute(
                        store,
                        stage.as_ref(),
                        inputs,
                        prev.as_ref(),
                        opts,
                        run_id,
                        reporter,
                    );
                    let _ = tx.send((i, r));
                });
            }
            if running == 0 {
                break;
            }
            let Ok((i, result)) = rx.recv() else { break };
            running -= 1;
            finished(&mut p, graph, i, result, run_id, opts, reporter);
        }
    });
    skip_unstarted(&mut p, graph, order, run_id, opts, reporter);
    p
}

/// Records stage `i`'s result.
fn finished(
    p: &mut Progress,
    graph: &Graph,
    i: usize,
    result: Result<NodeDone>,
    run_id: &str,
    opts: &RunOptions,
    reporter: &dyn Reporter,
) {
    match result {
        Ok(node) => {
            reporter.event(&Event::StageFinished(node.event.clone()));
            p.events.push(node.event.clone());
            p.done[i] = Some(node);
        }
        Err(e) => {
            let stage = graph.stage(i);
            let mut ev = skipped_event(run_id, opts, stage.as_ref(), &e.to_string());
            ev.status = Status::Failed;
            ev.reason = "the stage body failed".into();
            reporter.event(&Event::StageFinished(ev.clone()));
            p.events.push(ev);
            p.failed[i] = Some(e.to_string());
            if p.first_error.is_none() {
                p.first_error = Some(e);
            }
        }
    }
}

/// Stages never started because an ancestor failed, recorded as skipped.
fn skip_unstarted(
    p: &mut Progress,
    graph: &Graph,
    order: &[usize],
    run_id: &str,
    opts: &RunOptions,
    reporter: &dyn Reporter,
) {
    for &i in order {
        if p.done[i].is_none() && p.failed[i].is_none() {
            let stage = graph.stage(i);
            let upstream = order
                .iter()
                .copied()
                .find(|&q| p.failed[q].is_some())
                .map(|q| graph.stage(q).name().to_string())
                .unwrap_or_default();
            let msg = Error::UpstreamFailed {
                stage: stage.name().to_string(),
                upstream,
            }
            .to_string();
            let ev = skipped_event(run_id, opts, stage.as_ref(), &msg);
            reporter.event(&Event::StageFinished(ev.clone()));
            p.events.push(ev);
        }
    }
}

/// Each stage's manifest, by stage name.
type Manifests = BTreeMap<String, EntryManifest>;
/// Where each stage's outputs live: stage → output → path.
type Artifacts = BTreeMap<String, BTreeMap<String, PathBuf>>;

/// Every stage's manifest, its outputs' paths, and its entry of the ref, by stage name.
fn collect(
    store: &Store,
    graph: &Graph,
    order: &[usize],
    done: &mut [Option<NodeDone>],
) -> Result<(Manifests, Artifacts, Vec<RefStage>)> {
    let mut manifests = BTreeMap::new();
    let mut artifacts = BTreeMap::new();
    let mut ref_stages = Vec::new();
    for &i in order {
        let node = done[i]
            .take()
            .ok_or_else(|| Error::Internal("a stage neither finished nor failed".into()))?;
        let m = node.manifest;
        let name = graph.stage(i).name().to_string();
        let paths = m
            .outputs
            .keys()
            .map(|o| (o.clone(), store.artifact_path(&m.key, o)))
            .collect();
        ref_stages.push(RefStage {
            stage: name.clone(),
            version: m.version,
            params: m.params.clone(),
            key: m.key,
            inputs: m.inputs.clone(),
            outputs: m
                .outputs
                .iter()
                .map(|(k, a)| (k.clone(), a.digest))
                .collect(),
        });
        artifacts.insert(name.clone(), paths);
        manifests.insert(name, m);
    }
    Ok((manifests, artifacts, ref_stages))
}

type ResolvedInputs = BTreeMap<String, (Digest, PathBuf, u64)>;

fn resolve_inputs(
    store: &Store,
    stage: &dyn Stage,
    graph: &Graph,
    done: &[Option<NodeDone>],
) -> Result<ResolvedInputs> {
    let mut out = BTreeMap::new();
    for input in stage.inputs() {
        let resolved = match &input.source {
            InputSource::Artifact {
                stage: from,
                output,
            } => {
                let idx = graph
                    .index_of(from)
                    .ok_or_else(|| Error::Internal(format!("no stage {from}")))?;
                let node = done[idx]
                    .as_ref()
                    .ok_or_else(|| Error::Internal(format!("{from} not done")))?;
                let art = node
                    .manifest
                    .outputs
                    .get(output)
                    .ok_or_else(|| Error::Internal(format!("{from} has no output {output}")))?;
                (
                    art.digest,
                    store.artifact_path(&node.manifest.key, output),
                    art.bytes(),
                )
            }
            InputSource::External(path) => {
                let (d, size) = path_digest(store, path)?;
                (d, path.clone(), size)
            }
        };
        out.insert(input.name.clone(), resolved);
    }
    Ok(out)
}

fn execute(
    store: &Store,
    stage: &dyn Stage,
    inputs: ResolvedInputs,
    prev: Option<&RefStage>,
    opts: &RunOptions,
    run_id: &str,
    reporter: &dyn Reporter,
) -> Result<NodeDone> {
    let t0 = Instant::now();
    let started_unix_ms = now_ms() as i64;
    let params = stage.params();
    let digests: BTreeMap<String, Digest> = inputs
        .iter()
        .map(|(k, (d, _, _))| (k.clone(), *d))
        .collect();
    let bytes_in: u64 = inputs.values().map(|(_, _, b)| *b).sum();
    let key = stage_key(stage.name(), stage.version(), &params, &digests);
    let event = |status: Status, reason: &Reason, manifest: &EntryManifest| StageEvent {
        run_id: run_id.to_string(),
        ref_name: opts.ref_name.clone(),
        stage: stage.name().to_string(),
        version: stage.version(),
        key: key.to_hex(),
        status,
        reason: reason.to_string(),
        started_unix_ms,
        duration_ms: t0.elapsed().as_secs_f64() * 1e3,
        bytes_in,
        bytes_out: manifest.bytes(),
        error: None,
    };

    let shared = store.shared();
    if let Freshness::Fresh(m) = store.check(&key, opts.deep_check)? {
        let m = match shared {
            // Cached here before it was shared: publish it, so that refs never name absent keys.
            Some(sh) if !sh.has(&key)? => sh.push(store, m)?,
            _ => m,
        };
        let ev = event(Status::Hit, &Reason::Hit, &m);
        return Ok(NodeDone {
            manifest: m,
            event: ev,
        });
    }
    let lock_path = store.key_lock_path(&key);
    let _lock = FileLock::acquire(&lock_path, LockMode::Exclusive, || {
        tracing::info!(stage = stage.name(), key = %key.short(), "waiting for another process running this stage");
        reporter.event(&Event::StageWaiting {
            stage: stage.name().to_string(),
            key: key.to_hex(),
        });
    })?;
    let reason = match store.check(&key, opts.deep_check)? {
        Freshness::Fresh(m) => {
            let ev = event(Status::Hit, &Reason::HitAfterWait, &m);
            return Ok(NodeDone {
                manifest: m,
                event: ev,
            });
        }
        Freshness::Tampered { file, why } => {
            tracing::warn!(stage = stage.name(), key = %key.short(), %file, %why, "cached entry modified; rebuilding");
            store.evict(&key)?;
            Reason::Tampered { file, why }
        }
        Freshness::Missing => miss_reason(stage, &params, &digests, &key, prev),
    };
    let _lease = match shared {
        Some(sh) => match claim(sh, store, stage, &key, reporter)? {
            Claim::Fetched(m, reason) => {
                let ev = event(Status::Hit, &reason, &m);
                return Ok(NodeDone {
                    manifest: m,
                    event: ev,
                });
            }
            Claim::Run(lease) => Some(lease),
        },
        None => None,
    };
    reporter.event(&Event::StageStarted {
        stage: stage.name().to_string(),
        key: key.to_hex(),
        reason: reason.to_string(),
    });
    tracing::debug!(stage = stage.name(), key = %key.short(), %reason, "running");
    let staging = store.begin(&key)?;
    let mut ctx = StageContext {
        stage: stage.name().to_string(),
        inputs: inputs
            .iter()
            .map(|(k, (_, p, _))| (k.clone(), p.clone()))
            .collect(),
        out_dir: staging.out_dir(),
        reporter,
    };
    let body = Instant::now();
    let outputs = run_body(stage, &mut ctx, &key, &staging.out_dir())?;
    let manifest = EntryManifest {
        format: crate::store::MANIFEST_FORMAT,
        stage: stage.name().to_string(),
        version: stage.version(),
        params,
        key,
        inputs: digests,
        outputs: BTreeMap::new(),
        created_unix_ms: now_ms(),
        duration_ms: body.elapsed().as_secs_f64() * 1e3,
    };
    let manifest = store.publish(staging, manifest, &outputs)?;
    let manifest = match shared {
        Some(sh) => sh.push(store, manifest)?,
        None => manifest,
    };
    let ev = event(Status::Miss, &reason, &manifest);
    Ok(NodeDone {
        manifest,
        event: ev,
    })
}

/// What a shared store says of a stage's entry: published (fetched now, with how it was
/// found), or ours to compute under the lease held.
enum Claim {
    Fetched(EntryManifest, Reason),
    Run(crate::shared::lease::Lease),
}

/// Fetches `key`'s entry from the shared store when it is published; otherwise takes the lease
/// on it (waiting for another machine computing it, then fetching what it published).
fn claim(
    sh: &std::sync::Arc<crate::shared::SharedStore>,
    store: &Store,
    stage: &dyn Stage,
    key: &Digest,
    reporter: &dyn Reporter,
) -> Result<Claim> {
    if let Some(m) = sh.pull(store, key)? {
        return Ok(Claim::Fetched(m, Reason::Fetched));
    }
    let purpose = format!("stage {}", stage.name());
    let on_wait = |b: &crate::shared::lease::LeaseBody| {
        tracing::info!(stage = stage.name(), key = %key.short(), holder = %b.holder, "waiting for another machine running this stage");
        reporter.event(&Event::StageWaiting {
            stage: stage.name().to_string(),
            key: key.to_hex(),
        });
    };
    match crate::shared::lease::acquire(sh, &key.to_hex(), &purpose, on_wait, || sh.has(key))? {
        crate::shared::lease::Acquired::Held(l) => {
            // Published between the pull and the lease: fetch it rather than recompute.
            match sh.pull(store, key)? {
                Some(m) => Ok(Claim::Fetched(m, Reason::FetchedAfterWait)),
                None => Ok(Claim::Run(l)),
            }
        }
        crate::shared::lease::Acquired::Done => {
            let m = sh.pull(store, key)?.ok_or_else(|| {
                Error::Internal(format!("entry {} published, then gone", key.short()))
            })?;
            Ok(Claim::Fetched(m, Reason::FetchedAfterWait))
        }
    }
}

/// Runs the stage's body into its staging folder, a panic caught as the stage's failure; returns
/// its outputs once each is there.
fn run_body(
    stage: &dyn Stage,
    ctx: &mut StageContext<'_>,
    key: &Digest,
    out_dir: &std::path::Path,
) -> Result<Vec<String>> {
    match catch_unwind(AssertUnwindSafe(|| stage.run(ctx))) {
        Ok(Ok(())) => {}
        Ok(Err(source)) => {
            return Err(Error::StageFailed {
                stage: stage.name().to_string(),
                key: key.to_hex(),
                source,
            });
        }
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            return Err(Error::StagePanicked {
                stage: stage.name().to_string(),
                key: key.to_hex(),
                message,
            });
        }
    }
    let outputs = stage.outputs();
    for o in &outputs {
        if !out_dir.join(o).exists() {
            return Err(Error::MissingOutput {
                stage: stage.name().to_string(),
                output: o.clone(),
            });
        }
    }
    Ok(outputs)
}

fn miss_reason(
    stage: &dyn Stage,
    params: &Value,
    inputs: &BTreeMap<String, Digest>,
    key: &Digest,
    prev: Option<&RefStage>,
) -> Reason {
    let Some(prev) = prev else {
        return Reason::FirstRun;
    };
    if prev.key == *key {
        return Reason::EntryMissing;
    }
    if prev.version != stage.version() {
        return Reason::VersionChanged {
            old: prev.version,
            new: stage.version(),
        };
    }
    if params_digest(&prev.params) != params_digest(params) {
        return Reason::ParamsChanged;
    }
    for (name, d) in inputs {
        if prev.inputs.get(name) != Some(d) {
            return Reason::InputChanged {
                input: name.clone(),
            };
        }
    }
    if let Some(name) = prev.inputs.keys().find(|k| !inputs.contains_key(*k)) {
        return Reason::InputChanged {
            input: format!("{name} (removed)"),
        };
    }
    Reason::FirstRun
}

fn skipped_event(run_id: &str, opts: &RunOptions, stage: &dyn Stage, error: &str) -> StageEvent {
    StageEvent {
        run_id: run_id.to_string(),
        ref_name: opts.ref_name.clone(),
        stage: stage.name().to_string(),
        version: stage.version(),
        key: String::new(),
        status: Status::Skipped,
        reason: "an ancestor failed".into(),
        started_unix_ms: now_ms() as i64,
        duration_ms: 0.0,
        bytes_in: 0,
        bytes_out: 0,
        error: Some(error.to_string()),
    }
}
