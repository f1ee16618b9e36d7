//! The example queries of docs/catalog.md, each with its reviewed expected output
//! (`tests/fixtures/catalog/*.sql` and `.out`), run against a store built from the fixtures; plus
//! history after a reader fix, `tensor_values` with bounded memory, SQL error positions, and
//! another engine (pyarrow) reading the same Parquet files.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use onebit_catalog::{Catalog, Format};
use onebit_pipeline::{
    Graph, Input, NullReporter, RunOptions, Stage, StageContext, StageError, StageId, Store,
    run_graph,
};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/catalog")
}

fn versions() -> BTreeMap<String, u32> {
    onebit_stages::stage_versions()
}

fn text(catalog: &Catalog, sql: &str) -> String {
    let batches = catalog.sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out = Vec::new();
    onebit_catalog::format::write(&batches, Format::Table, &mut out).expect("format");
    String::from_utf8(out).expect("utf8")
}

/// Tests of this file run one at a time: one measures the process's peak RSS, which the others'
/// imports (running in the same process) would inflate.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn every_example_query_returns_its_expected_rows() {
    let _serial = serial();
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    // The same store seen by a build whose dequant stage is one version ahead (an upgrade).
    let mut upgraded_versions = versions();
    *upgraded_versions.entry("dequant".into()).or_default() += 1;
    let upgraded = Catalog::open(&store, &upgraded_versions).expect("catalog");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 12,
        "a dozen example queries, found {}",
        files.len()
    );
    for sql_path in files {
        let sql = std::fs::read_to_string(&sql_path).expect("sql");
        let which = if sql_path.to_string_lossy().contains("stale") {
            &upgraded
        } else {
            &catalog
        };
        let got = text(which, sql.trim().trim_end_matches(';'));
        let out_path = sql_path.with_extension("out");
        if update {
            std::fs::write(&out_path, &got).expect("write");
            continue;
        }
        let want = std::fs::read_to_string(&out_path).unwrap_or_else(|_| {
            panic!(
                "no {} (run with UPDATE_SNAPSHOTS=1 and review it)",
                out_path.display()
            )
        });
        assert_eq!(got, want, "{}", sql_path.display());
    }
}

#[test]
fn sql_errors_point_at_the_position() {
    let _serial = serial();
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let e = catalog
        .sql("SELECT name FROM tensors WHERE")
        .expect_err("bad sql")
        .to_string();
    assert!(
        e.ends_with("\n  SELECT name FROM tensors WHERE\n                                ^"),
        "{e}"
    );
    let e = catalog
        .sql("SELECT name FROM tensors WHERE name = = 'x'")
        .expect_err("bad sql")
        .to_string();
    assert!(e.contains("Line: 1, Column: "), "{e}");
    assert!(
        e.contains("\n  SELECT name FROM tensors WHERE name = = 'x'\n  "),
        "{e}"
    );
    let e = catalog
        .sql("SELECT nope FROM tensors")
        .expect_err("bad column")
        .to_string();
    assert!(e.contains("nope"), "{e}");
    let e = catalog
        .sql("SELECT * FROM tensor_values('no-such-pack', 'x')")
        .expect_err("bad pack")
        .to_string();
    assert!(
        e.contains("tensor_values: no pack named \"no-such-pack\""),
        "{e}"
    );
}

/// A stage named `dequant` standing in for a reader before and after a fix: v1 reads the v_proj
/// tiles with the wrong signedness (the bug), v2 reads them right.
struct ReaderStage {
    version: u32,
    model: PathBuf,
    config: PathBuf,
}

impl Stage for ReaderStage {
    fn id(&self) -> StageId<'_> {
        StageId::new("dequant", self.version)
    }
    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::external("model", &self.model),
            Input::external("config", &self.config),
        ]
    }
    fn outputs(&self) -> Vec<String> {
        vec!["tables".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        use onebit_stages::stage::dequant::tensor_stats_table;
        use onebit_stages::stage::write_tables;
        use onebit_stages::stats::tensor::tensor_stats;
        let c = onebit_stages::format::q4nx::Container::open(ctx.input("model")?)?;
        let g = onebit_stages::layout::geometry::Geometry::from_file(ctx.input("config")?)?;
        let mut layouts = onebit_stages::layout::detect::detect_pack(&c, Some(&g))?;
        if self.version == 1 {
            for l in layouts
                .iter_mut()
                .filter(|l| l.name.ends_with("v_proj.weight"))
            {
                if let onebit_stages::layout::Layout::Tiled { kind, .. } = &mut l.layout {
                    *kind = onebit_stages::format::tiles::TileKind::Q40_5120;
                }
            }
        }
        let stats: Vec<_> = layouts
            .iter()
            .map(|l| tensor_stats(&c, l))
            .collect::<Result<_, _>>()?;
        write_tables(
            &ctx.output("tables"),
            &[("tensor_stats", tensor_stats_table(&stats)?)],
        )?;
        Ok(())
    }
}

#[test]
fn after_a_reader_fix_history_shows_which_tensors_changed() {
    let _serial = serial();
    let home = tempfile::tempdir().expect("tmp");
    let store = Store::open(home.path()).expect("store");
    let dir = common::fixture("llama-q41");
    for version in [1, 2] {
        let g = Graph::new(vec![Arc::new(ReaderStage {
            version,
            model: dir.join("model.q4nx"),
            config: dir.join("config.json"),
        }) as Arc<dyn Stage>])
        .expect("graph");
        let opts = RunOptions {
            ref_name: Some("llama-q41".into()),
            ..RunOptions::default()
        };
        run_graph(&store, &g, &opts, &NullReporter).expect("run");
    }
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let q = "SELECT new.name, round(old.mean, 5) AS mean_before, round(new.mean, 5) AS mean_after \
             FROM tensor_stats_history new JOIN tensor_stats_history old \
               ON new.pack = old.pack AND new.name = old.name AND new.current AND NOT old.current \
             WHERE new.mean <> old.mean ORDER BY new.name";
    let got = text(&catalog, q);
    assert!(
        got.contains("model.layers.0.self_attn.v_proj.weight"),
        "{got}"
    );
    assert!(
        got.contains("model.layers.1.self_attn.v_proj.weight"),
        "{got}"
    );
    assert_eq!(
        got.lines().filter(|l| l.contains("v_proj")).count(),
        2,
        "{got}"
    );
    assert!(
        !got.contains("q_proj"),
        "only the fixed tensors changed: {got}"
    );
    // The current table holds the fixed import only.
    let cur = text(&catalog, "SELECT count(*) AS n FROM tensor_stats");
    assert!(cur.contains("| 21 |"), "{cur}");
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0)
}

#[test]
fn tensor_values_streams_a_100m_value_tensor_in_bounded_memory() {
    let _serial = serial();
    // A synthetic pack: one 10240 x 10240 Q41_5120 head (104,857,600 values, 65.5 MB of tiles).
    let pack = tempfile::tempdir().expect("tmp");
    let (rows, k) = (10240u64, 10240u64);
    let tiles = (rows / 32) * (k / 256);
    let mut tile = vec![0u8; 5120];
    for s in 0..256 {
        tile[2 * s..2 * s + 2].copy_from_slice(&0x3C00u16.to_le_bytes()); // d = 2^-7
        tile[512 + 2 * s..512 + 2 * s + 2].copy_from_slice(&0xBC80u16.to_le_bytes()); // m = -2^-6
    }
    for (i, b) in tile.iter_mut().enumerate().skip(1024) {
        *b = (i * 37 % 256) as u8;
    }
    let header = serde_json::json!({"lm_head.weight": {"dtype": "I8", "shape": [tiles, 5120], "data_offsets": [0, tiles * 5120]}});
    let mut h = serde_json::to_vec(&header).expect("json");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(pack.path().join("model.q4nx")).expect("create"),
        );
        f.write_all(&(h.len() as u64).to_le_bytes()).expect("w");
        f.write_all(&h).expect("w");
        for _ in 0..tiles {
            f.write_all(&tile).expect("w");
        }
    }
    let cfg = serde_json::json!({"model_type": "llama", "hidden_size": k, "intermediate_size": 256,
        "num_hidden_layers": 1, "num_attention_heads": 40, "vocab_size": rows});
    std::fs::write(pack.path().join("config.json"), cfg.to_string()).expect("config");
    let home = tempfile::tempdir().expect("tmp");
    let store = Store::open(home.path()).expect("store");
    common::import(&store, "big", pack.path(), None);
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    // Reset the peak-RSS mark (Linux: writing 5 to clear_refs), so VmHWM measures the query alone.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = peak_rss_kb();
    let t0 = std::time::Instant::now();
    let got = text(
        &catalog,
        "SELECT count(*) AS n, round(avg(value), 6) AS mean FROM tensor_values('big', 'lm_head.weight')",
    );
    let peak_mb = peak_rss_kb() as f64 / 1024.0;
    let grew_mb = (peak_rss_kb().saturating_sub(before)) as f64 / 1024.0;
    eprintln!(
        "tensor_values over {} values: {:.2} s, peak RSS during the query {peak_mb:.1} MiB (reset: {reset}), \
         grew {grew_mb:.1} MiB; the tensor as f32 would be {} MiB",
        rows * k,
        t0.elapsed().as_secs_f64(),
        (rows * k * 4) >> 20
    );
    if reset {
        assert!(
            peak_mb < 400.0,
            "peak RSS {peak_mb} MiB during the query: not streamed"
        );
    }
    assert!(got.contains("| 104857600 |"), "{got}");
    assert!(grew_mb < 256.0, "peak RSS grew {grew_mb} MiB: not streamed");
}

#[test]
#[ignore = "needs python3 with pyarrow: run scripts/test.sh"]
fn another_engine_reads_the_parquet_tables_with_the_same_row_counts() {
    let _serial = serial();
    let (_home, store) = common::fixture_store();
    let catalog = Catalog::open(&store, &versions()).expect("catalog");
    let refs = onebit_pipeline::refs::list_refs(&store).expect("refs");
    for (table, stage, file) in onebit_catalog::tables::STAGE_TABLES {
        for r in &refs {
            let Some(s) = r.stage(stage) else { continue };
            let path = store.entry_dir(&s.key).join("out").join(file);
            if !path.is_file() {
                continue;
            }
            let out = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import sys, pyarrow.parquet as pq; print(pq.read_table(sys.argv[1]).num_rows)",
                ])
                .arg(&path)
                .output()
                .expect("python3");
            assert!(
                out.status.success(),
                "pyarrow: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let theirs: u64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("count");
            let ours = text(
                &catalog,
                &format!(
                    "SELECT count(*) AS n FROM {table} WHERE pack = '{}'",
                    r.name
                ),
            );
            assert!(
                ours.contains(&format!("| {theirs} ")),
                "{table} {}: ours {ours} vs pyarrow {theirs}",
                r.name
            );
        }
    }
    // And the run records.
    for e in std::fs::read_dir(store.runs_dir()).expect("runs") {
        let p = e.expect("e").path();
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys, pyarrow.parquet as pq; print(pq.read_table(sys.argv[1]).num_rows)",
            ])
            .arg(&p)
            .output()
            .expect("python3");
        assert!(out.status.success());
    }
}
