//! A fully cached run of the ten-stage demo graph holding 1 GiB of artifacts, side by side with
//! the named baseline: one blake3 pass over those same bytes (single-threaded, and with rayon).
//!
//! Run: `cargo bench -p onebit-pipeline --bench cached_run` (`ONEBIT_BENCH_BYTES` overrides the
//! size, `ONEBIT_BENCH_DIR` the store location; default: a temp dir).

use std::time::{Duration, Instant};

use onebit_pipeline::demo::demo_graph;
use onebit_pipeline::{NullReporter, RunOptions, Status, Store, run_graph};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let bytes: u64 = std::env::var("ONEBIT_BENCH_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 30);
    let base = std::env::var_os("ONEBIT_BENCH_DIR").map(std::path::PathBuf::from);
    let dir = match &base {
        Some(b) => tempfile::tempdir_in(b),
        None => tempfile::tempdir(),
    }
    .expect("temp dir");
    let store = Store::open(dir.path()).expect("store");
    let graph = demo_graph(bytes, 1, Duration::ZERO).expect("graph");
    let opts = RunOptions {
        ref_name: Some("bench".into()),
        ..RunOptions::default()
    };

    let t = Instant::now();
    let cold = run_graph(&store, &graph, &opts, &NullReporter).expect("cold run");
    let cold_t = t.elapsed();
    assert!(cold.events.iter().all(|e| e.status == Status::Miss));

    let mut warm = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let r = run_graph(&store, &graph, &opts, &NullReporter).expect("cached run");
        warm.push(t.elapsed());
        assert!(
            r.events.iter().all(|e| e.status == Status::Hit),
            "a cached run ran a body"
        );
    }
    let warm_med = median(warm.clone());
    let warm_min = warm.iter().min().copied().unwrap_or_default();

    let files: Vec<_> = cold
        .artifacts
        .values()
        .flat_map(|o| o.values().cloned())
        .collect();
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    let mut single = Vec::new();
    let mut multi = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for f in &files {
            let mut h = blake3::Hasher::new();
            h.update_mmap(f).expect("hash");
            std::hint::black_box(h.finalize());
        }
        single.push(t.elapsed());
        let t = Instant::now();
        for f in &files {
            let mut h = blake3::Hasher::new();
            h.update_mmap_rayon(f).expect("hash");
            std::hint::black_box(h.finalize());
        }
        multi.push(t.elapsed());
    }
    let (single, multi) = (median(single), median(multi));
    let gib = total as f64 / (1u64 << 30) as f64;
    println!(
        "cached_run: 10-stage demo graph, {total} artifact bytes ({gib:.2} GiB), {} threads",
        rayon_threads()
    );
    println!("  cold run (all stages ran)        {:>10.1} ms", ms(cold_t));
    println!(
        "  cached run, median of 20         {:>10.3} ms (min {:.3} ms)",
        ms(warm_med),
        ms(warm_min)
    );
    println!(
        "  baseline: blake3 one pass, 1 thread {:>7.1} ms ({:.2} GB/s)",
        ms(single),
        total as f64 / single.as_secs_f64() / 1e9
    );
    println!(
        "  baseline: blake3 one pass, rayon    {:>7.1} ms ({:.2} GB/s)",
        ms(multi),
        total as f64 / multi.as_secs_f64() / 1e9
    );
    println!(
        "  ratio cached / hash pass (1 thread) {:>7.3} %",
        100.0 * warm_med.as_secs_f64() / single.as_secs_f64()
    );
    println!(
        "  ratio cached / hash pass (rayon)    {:>7.3} %",
        100.0 * warm_med.as_secs_f64() / multi.as_secs_f64()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
