//! The engine against a real store in a temp dir: order, cycles, parallelism, caching, exact
//! invalidation, tampering, and panics. No mocks of the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onebit_pipeline::demo::{DEMO_EDGES, SyntheticStage};
use onebit_pipeline::{
    Error, Graph, Input, NullReporter, RunOptions, Stage, StageContext, StageError, StageId,
    Status, Store, run_graph,
};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    (dir, store)
}

fn opts() -> RunOptions {
    RunOptions {
        jobs: 4,
        ref_name: Some("test".into()),
        ..RunOptions::default()
    }
}

/// The demo lattice with per-stage versions and sizes.
fn lattice(versions: [u32; 10], bytes: [u64; 10]) -> Graph {
    let stages: Vec<Arc<dyn Stage>> = (0..10)
        .map(|i| {
            Arc::new(SyntheticStage {
                name: format!("gen-{i}"),
                version: versions[i],
                parents: DEMO_EDGES[i].iter().map(|p| format!("gen-{p}")).collect(),
                bytes: bytes[i],
                delay: Duration::ZERO,
            }) as Arc<dyn Stage>
        })
        .collect();
    Graph::new(stages).expect("graph")
}

fn ran(report: &onebit_pipeline::RunReport) -> Vec<String> {
    let mut v: Vec<String> = report
        .events
        .iter()
        .filter(|e| e.status == Status::Miss)
        .map(|e| e.stage.clone())
        .collect();
    v.sort();
    v
}

/// A stage that counts how often its body runs and can wait for a partner to be running too.
struct Probe {
    name: String,
    parents: Vec<String>,
    runs: Arc<AtomicUsize>,
    rendezvous: Option<Arc<AtomicUsize>>,
    panic: bool,
}

impl Stage for Probe {
    fn id(&self) -> StageId<'_> {
        StageId::new(&self.name, 1)
    }
    fn inputs(&self) -> Vec<Input> {
        self.parents
            .iter()
            .map(|p| Input::artifact(p, p, "out"))
            .collect()
    }
    fn outputs(&self) -> Vec<String> {
        vec!["out".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if let Some(r) = &self.rendezvous {
            r.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while r.load(Ordering::SeqCst) < 2 {
                if Instant::now() > deadline {
                    return Err("partner stage never ran at the same time".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::fs::write(ctx.output("out"), self.name.as_bytes())?;
        if self.panic {
            panic!("probe {} panics after writing", self.name);
        }
        Ok(())
    }
}

fn probe(name: &str, parents: &[&str], runs: &Arc<AtomicUsize>) -> Probe {
    Probe {
        name: name.into(),
        parents: parents.iter().map(|s| s.to_string()).collect(),
        runs: runs.clone(),
        rendezvous: None,
        panic: false,
    }
}

#[test]
fn topological_order_puts_ancestors_first() {
    let g = lattice([1; 10], [16; 10]);
    let order: Vec<String> = g.order().map(|s| s.name().to_string()).collect();
    for (i, parents) in DEMO_EDGES.iter().enumerate() {
        let at = order
            .iter()
            .position(|n| *n == format!("gen-{i}"))
            .expect("present");
        for p in *parents {
            let pat = order
                .iter()
                .position(|n| *n == format!("gen-{p}"))
                .expect("present");
            assert!(pat < at, "gen-{p} must come before gen-{i}: {order:?}");
        }
    }
    assert_eq!(
        g.descendants("gen-4").into_iter().collect::<Vec<_>>(),
        ["gen-6", "gen-8", "gen-9"]
    );
}

#[test]
fn cycles_and_dangling_inputs_are_refused() {
    let runs = Arc::new(AtomicUsize::new(0));
    let stages: Vec<Arc<dyn Stage>> = vec![
        Arc::new(probe("a", &["c"], &runs)),
        Arc::new(probe("b", &["a"], &runs)),
        Arc::new(probe("c", &["b"], &runs)),
        Arc::new(probe("d", &[], &runs)),
    ];
    let err = Graph::new(stages).err().expect("cycle refused");
    assert!(matches!(err, Error::Cycle { .. }));
    assert_eq!(err.to_string(), "the graph has a cycle: a -> b -> c -> a");

    let stages: Vec<Arc<dyn Stage>> = vec![Arc::new(probe("a", &["nowhere"], &runs))];
    let err = Graph::new(stages).err().expect("dangling refused");
    assert_eq!(
        err.to_string(),
        "stage a: input nowhere reads nowhere.out, which no stage of the graph writes"
    );
}

#[test]
fn independent_stages_run_concurrently() {
    let (_d, store) = store();
    let runs = Arc::new(AtomicUsize::new(0));
    let meet = Arc::new(AtomicUsize::new(0));
    let mut left = probe("left", &["root"], &runs);
    left.rendezvous = Some(meet.clone());
    let mut right = probe("right", &["root"], &runs);
    right.rendezvous = Some(meet.clone());
    let g = Graph::new(vec![
        Arc::new(probe("root", &[], &runs)) as Arc<dyn Stage>,
        Arc::new(left),
        Arc::new(right),
        Arc::new(probe("join", &["left", "right"], &runs)),
    ])
    .expect("graph");
    // Each of left/right waits until the other has started: sequential execution would fail.
    let report = run_graph(&store, &g, &opts(), &NullReporter).expect("run");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(report.events.len(), 4);
}

#[test]
fn second_run_executes_no_stage_body() {
    let (_d, store) = store();
    let runs = Arc::new(AtomicUsize::new(0));
    let g = Graph::new(vec![
        Arc::new(probe("a", &[], &runs)) as Arc<dyn Stage>,
        Arc::new(probe("b", &["a"], &runs)),
    ])
    .expect("graph");
    run_graph(&store, &g, &opts(), &NullReporter).expect("first");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let second = run_graph(&store, &g, &opts(), &NullReporter).expect("second");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a cached run ran a body");
    assert!(second.events.iter().all(|e| e.status == Status::Hit));
    // The run records of both runs are on disk and read back.
    let files: Vec<_> = std::fs::read_dir(store.runs_dir()).expect("runs").collect();
    assert_eq!(files.len(), 2);
    let rec = onebit_pipeline::record::read_records(
        &store.runs_dir().join(format!("{}.parquet", second.run_id)),
    )
    .expect("read records");
    assert_eq!(rec, second.events);
}

#[test]
fn version_bump_and_param_change_rerun_exactly_the_descendants() {
    let (_d, store) = store();
    let sizes = [4096u64; 10];
    let first = run_graph(&store, &lattice([1; 10], sizes), &opts(), &NullReporter).expect("first");
    assert_eq!(ran(&first).len(), 10);

    let mut v = [1u32; 10];
    v[4] = 2;
    let bumped = run_graph(&store, &lattice(v, sizes), &opts(), &NullReporter).expect("bump");
    assert_eq!(ran(&bumped), ["gen-4", "gen-6", "gen-8", "gen-9"]);
    assert_eq!(
        bumped.event("gen-4").expect("gen-4").reason,
        "stage version changed from 1 to 2"
    );
    assert_eq!(
        bumped.event("gen-6").expect("gen-6").reason,
        "input gen-4 changed"
    );

    let mut s = sizes;
    s[5] = 8192;
    let changed = run_graph(&store, &lattice(v, s), &opts(), &NullReporter).expect("params");
    assert_eq!(ran(&changed), ["gen-5", "gen-7", "gen-8", "gen-9"]);
    assert_eq!(
        changed.event("gen-5").expect("gen-5").reason,
        "params changed"
    );
}

#[test]
fn tampered_outputs_are_detected_and_rebuilt() {
    let (_d, store) = store();
    let g = lattice([1; 10], [4096; 10]);
    let first = run_graph(&store, &g, &opts(), &NullReporter).expect("first");
    let path = first.artifact("gen-3", "data").expect("artifact").clone();
    let good = std::fs::read(&path).expect("read");

    // Changed content (mtime moves): the cheap check re-hashes and catches it.
    let mut bad = good.clone();
    bad[100] ^= 0xff;
    std::fs::write(&path, &bad).expect("tamper");
    let r = run_graph(&store, &g, &opts(), &NullReporter).expect("rebuild");
    assert_eq!(
        ran(&r),
        ["gen-3"],
        "the rebuilt output is identical, so descendants hit"
    );
    assert!(
        r.event("gen-3")
            .expect("gen-3")
            .reason
            .starts_with("the cached entry was modified (out/data: blake3")
    );
    assert_eq!(std::fs::read(&path).expect("read"), good);

    // Truncated: the size check catches it.
    std::fs::write(&path, &good[..10]).expect("truncate");
    let r = run_graph(&store, &g, &opts(), &NullReporter).expect("rebuild");
    assert_eq!(ran(&r), ["gen-3"]);
    assert!(
        r.event("gen-3")
            .expect("gen-3")
            .reason
            .contains("size 10 where the manifest says 409")
    );

    // Changed content with the mtime put back: only the deep check sees it.
    let meta = std::fs::metadata(&path).expect("stat");
    let mtime = meta.modified().expect("mtime");
    std::fs::write(&path, &bad).expect("tamper");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("restore mtime");
    let deep = RunOptions {
        deep_check: true,
        ..opts()
    };
    let r = run_graph(&store, &g, &deep, &NullReporter).expect("deep");
    assert_eq!(ran(&r), ["gen-3"]);
    assert_eq!(std::fs::read(&path).expect("read"), good);
}

#[test]
fn a_panicking_or_failing_stage_leaves_nothing_trusted() {
    let (_d, store) = store();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut bad = probe("bad", &["a"], &runs);
    bad.panic = true;
    let g = Graph::new(vec![
        Arc::new(probe("a", &[], &runs)) as Arc<dyn Stage>,
        Arc::new(bad),
        Arc::new(probe("after", &["bad"], &runs)),
    ])
    .expect("graph");
    let err = run_graph(&store, &g, &opts(), &NullReporter).expect_err("fails");
    let msg = err.to_string();
    assert!(msg.starts_with("stage bad (key "), "{msg}");
    assert!(
        msg.ends_with("panicked: probe bad panics after writing; nothing it wrote was kept"),
        "{msg}"
    );
    // Only stage a's entry exists; no staging leftovers; no ref was written.
    assert_eq!(store.entries().expect("entries").len(), 1);
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp"))
            .expect("tmp")
            .count(),
        0
    );
    assert!(
        onebit_pipeline::refs::read_ref(&store, "test")
            .expect("ref")
            .is_none()
    );
    // The failure is in the run records, with the skipped descendant.
    let recs: Vec<_> = std::fs::read_dir(store.runs_dir()).expect("runs").collect();
    assert_eq!(recs.len(), 1);
    let path = recs.into_iter().next().expect("one").expect("entry").path();
    let events = onebit_pipeline::record::read_records(&path).expect("records");
    let status = |s: &str| events.iter().find(|e| e.stage == s).map(|e| e.status);
    assert_eq!(status("a"), Some(Status::Miss));
    assert_eq!(status("bad"), Some(Status::Failed));
    assert_eq!(status("after"), Some(Status::Skipped));
}

#[test]
fn gc_removes_unreferenced_entries_and_reports_bytes() {
    let (_d, store) = store();
    run_graph(
        &store,
        &lattice([1; 10], [1000; 10]),
        &opts(),
        &NullReporter,
    )
    .expect("v1");
    let mut v = [1u32; 10];
    v[9] = 2;
    run_graph(&store, &lattice(v, [1000; 10]), &opts(), &NullReporter).expect("v2");
    // gen-9 v1's entry is no longer referenced by the ref "test".
    let r = onebit_pipeline::maintenance::gc(&store, false).expect("gc");
    assert_eq!(r.entries_removed, 1);
    assert_eq!(r.entries_kept, 10);
    assert!(r.bytes_freed >= 1000, "{r:?}");
    let again = onebit_pipeline::maintenance::gc(&store, false).expect("gc again");
    assert_eq!(again.entries_removed, 0);
}
