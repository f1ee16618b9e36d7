//! A typical aggregate query over the statistics of 60 packs (generated from a fixture), warm,
//! against the named baseline of a full scan of the same table (`SELECT count(*)`).
//!
//! Run: `cargo bench -p onebit-catalog --bench aggregate`.

use std::path::Path;
use std::time::{Duration, Instant};

use onebit_catalog::Catalog;
use onebit_pipeline::{NullReporter, RunOptions, Store, run_graph};
use onebit_stages::{ImportSource, import_graph};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/q4nx/llama-q41");
    let home = tempfile::tempdir().expect("tmp");
    let store = Store::open(home.path()).expect("store");
    let t = Instant::now();
    for i in 0..60 {
        // Each pack is its own folder (links to the fixture's files); entries are shared by content.
        let dir = home.path().join(format!("pack-{i:02}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in ["config.json", "model.q4nx", "tokenizer.json"] {
            std::os::unix::fs::symlink(fixture.join(f), dir.join(f)).expect("link");
        }
        let source = ImportSource {
            dir: dir.clone(),
            reference: Some(fixture.join("model.gguf")),
            mmproj: None,
            fetch: None,
            repair: false,
        };
        let opts = RunOptions {
            ref_name: Some(format!("pack-{i:02}")),
            source: serde_json::json!({"dir": dir.display().to_string()}),
            ..RunOptions::default()
        };
        run_graph(
            &store,
            &import_graph(&source, std::sync::Arc::new(onebit_runtime::HostKernels))
                .expect("graph"),
            &opts,
            &NullReporter,
        )
        .expect("import");
    }
    let setup = t.elapsed();
    let t = Instant::now();
    let catalog = Catalog::open(&store, &onebit_stages::stage_versions()).expect("catalog");
    let open = t.elapsed();
    let query = "SELECT t.pack, t.kind, count(*) AS tensors, avg(s.mean) AS mean, max(s.absmax) AS absmax, \
                 avg(s.zero_point_mean / s.scale_mean) AS m_over_d \
                 FROM tensor_stats s JOIN tensors t ON s.pack = t.pack AND s.name = t.name \
                 GROUP BY t.pack, t.kind ORDER BY t.pack, t.kind";
    let baseline = "SELECT count(*) FROM tensor_stats";
    let mut q = Vec::new();
    let mut b = Vec::new();
    let rows = catalog
        .sql(query)
        .expect("query")
        .iter()
        .map(|b| b.num_rows())
        .sum::<usize>();
    for _ in 0..20 {
        let t = Instant::now();
        std::hint::black_box(catalog.sql(query).expect("query"));
        q.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(catalog.sql(baseline).expect("baseline"));
        b.push(t.elapsed());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("aggregate: 60 packs, {} tensor_stats rows", 60 * 21);
    println!(
        "  import of 60 packs (setup)            {:>9.1} ms",
        ms(setup)
    );
    println!(
        "  Catalog::open (reads every table)     {:>9.1} ms",
        ms(open)
    );
    println!(
        "  aggregate join + group by, warm median {:>8.2} ms ({rows} rows out)",
        ms(median(q))
    );
    println!(
        "  baseline count(*), warm median        {:>9.2} ms",
        ms(median(b))
    );
}
