//! End-to-end tests through the built binary, each in its own `ONEBIT_HOME`: concurrent runs,
//! a run killed with SIGKILL mid-write, status after an upgrade, gc, the import of every fixture,
//! and the clear refusal of what is not built.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onebit-pipe"))
}

fn run_in(home: &Path, args: &[&str]) -> Output {
    bin()
        .env("ONEBIT_HOME", home)
        .args(args)
        .output()
        .expect("spawn onebit-pipe")
}

/// Asserts exit code 0, showing stderr (after `what`) when not.
fn assert_success(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn events(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn finished<'a>(evs: &'a [Value], status: &str) -> Vec<&'a str> {
    evs.iter()
        .filter(|e| e["event"] == "stage_finished" && e["status"] == status)
        .filter_map(|e| e["stage"].as_str())
        .collect()
}

/// Every stage of an import with config.json and tokenizer.json, sorted.
const IMPORT_STAGES: [&str; 6] = [
    "dequant",
    "detect",
    "kernels",
    "repack",
    "semantics",
    "verify",
];

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/q4nx")
        .join(case)
}

#[test]
fn two_processes_on_one_graph_both_succeed_and_each_body_runs_once() {
    let home = tempfile::tempdir().expect("tmp");
    let args = [
        "--json",
        "run",
        "--demo",
        "--demo-bytes",
        "4000000",
        "--demo-delay-ms",
        "150",
    ];
    let spawn = || {
        bin()
            .env("ONEBIT_HOME", home.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (
        a.wait_with_output().expect("a"),
        b.wait_with_output().expect("b"),
    );
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let (ea, eb) = (events(&a), events(&b));
    let mut ran: Vec<&str> = finished(&ea, "miss");
    ran.extend(finished(&eb, "miss"));
    ran.sort();
    let want: Vec<String> = (0..10).map(|i| format!("gen-{i}")).collect();
    assert_eq!(
        ran, want,
        "every stage body ran exactly once across both processes"
    );
    assert_eq!(finished(&ea, "hit").len() + finished(&eb, "hit").len(), 10);
}

#[test]
fn a_run_killed_mid_write_leaves_no_trusted_entry_and_the_next_run_succeeds() {
    let home = tempfile::tempdir().expect("tmp");
    let mut child = bin()
        .env("ONEBIT_HOME", home.path())
        .args([
            "--quiet",
            "run",
            "--demo",
            "--demo-bytes",
            "20000000",
            "--demo-delay-ms",
            "30000",
        ])
        .spawn()
        .expect("spawn");
    // Wait until gen-0 is half written into its staging directory.
    let tmp = home.path().join("store-v1/tmp");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let staged = std::fs::read_dir(&tmp)
            .map(|d| {
                d.filter_map(Result::ok).any(|e| {
                    std::fs::metadata(e.path().join("out/data")).is_ok_and(|m| m.len() > 0)
                })
            })
            .unwrap_or(false);
        if staged {
            break;
        }
        assert!(Instant::now() < deadline, "the demo never started writing");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    child.wait().expect("reap");
    let entries = std::fs::read_dir(home.path().join("store-v1/entries"))
        .expect("entries")
        .count();
    assert_eq!(entries, 0, "a killed stage published an entry");

    let out = run_in(
        home.path(),
        &["--json", "run", "--demo", "--demo-bytes", "20000000"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(finished(&events(&out), "miss").len(), 10);
    let status = run_in(home.path(), &["status", "--deep"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("demo (fresh;"), "{text}");
    // gc clears the killed run's staging leftovers.
    let gc = run_in(home.path(), &["gc"]);
    let text = String::from_utf8_lossy(&gc.stdout);
    assert!(text.starts_with("removed 0 entries ("), "{text}");
    assert_eq!(std::fs::read_dir(&tmp).expect("tmp").count(), 0);
}

#[test]
fn status_names_stale_stages_after_an_upgrade() {
    let home = tempfile::tempdir().expect("tmp");
    // A ref built by "older code": every demo stage at version 2, where this build has 1.
    let out = run_in(
        home.path(),
        &[
            "--quiet",
            "run",
            "--demo",
            "--demo-bytes",
            "100000",
            "--demo-version",
            "2",
        ],
    );
    assert!(out.status.success());
    let status = run_in(home.path(), &["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("demo (needs a run;"), "{text}");
    assert!(text.contains("stale: version 2 -> 1"), "{text}");
    assert!(
        text.contains("re-run: onebit-pipe run --demo --demo-bytes 100000 --demo-version 2"),
        "{text}"
    );
}

#[test]
fn every_fixture_imports_and_a_second_run_is_all_hits() {
    let home = tempfile::tempdir().expect("tmp");
    for case in [
        "llama-q41",
        "llama-q40",
        "llama-q80",
        "qwen35-q80",
        "gemma3-q41-quarter/stock",
        "gemma3-q41-quarter/rb16",
    ] {
        let dir = fixture(case);
        let p = dir.to_str().expect("utf8 path");
        let first = run_in(home.path(), &["--json", "run", "--path", p]);
        // Without a GGUF, the tied-head fit still catches llama-q80's broken head: exit 1.
        let want = if case == "llama-q80" { 1 } else { 0 };
        assert_eq!(
            first.status.code(),
            Some(want),
            "{case}: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        let first = events(&first);
        let mut ran = finished(&first, "miss");
        ran.sort();
        assert_eq!(ran, IMPORT_STAGES, "{case}");
        let second = run_in(home.path(), &["--json", "run", "--path", p]);
        assert_eq!(second.status.code(), Some(want));
        let second = events(&second);
        let mut hit = finished(&second, "hit");
        hit.sort();
        assert_eq!(hit, IMPORT_STAGES, "{case}");
    }
}

#[test]
fn a_folder_without_a_pack_is_refused_with_exit_code_1() {
    let home = tempfile::tempdir().expect("tmp");
    let empty = tempfile::tempdir().expect("tmp");
    let out = run_in(
        home.path(),
        &["run", "--path", empty.path().to_str().expect("utf8")],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model.q4nx: the repository folder has no model.q4nx"),
        "{err}"
    );
}

#[test]
fn verification_against_a_gguf_passes_good_packs_and_refuses_the_broken_one() {
    let home = tempfile::tempdir().expect("tmp");
    let dir = fixture("gemma3-q41-quarter/rb16");
    let gguf = fixture("gemma3-q41-quarter/model.gguf");
    let (d, g) = (dir.to_str().expect("utf8"), gguf.to_str().expect("utf8"));
    let ok = run_in(home.path(), &["run", "--path", d, "--reference", g]);
    assert_success(&ok, "");
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(
        err.contains("local/rb16: verified: 16 tensors pass, 0 flagged"),
        "{err}"
    );

    // The same pack without the reference: detect and verify re-run (their input was removed),
    // and repack after them (the verdict it carries changed), and the kernel set of the new pack;
    // the rest hits.
    let again = run_in(home.path(), &["--json", "run", "--path", d]);
    let evs = events(&again);
    assert_eq!(
        finished(&evs, "miss"),
        ["detect", "verify", "repack", "kernels"]
    );
    let verify = evs
        .iter()
        .find(|e| e["event"] == "stage_finished" && e["stage"] == "verify")
        .expect("verify event");
    assert_eq!(verify["reason"], "input reference (removed) changed");

    let dir = fixture("llama-q80");
    let gguf = fixture("llama-q80/model.gguf");
    let (d, g) = (dir.to_str().expect("utf8"), gguf.to_str().expect("utf8"));
    let bad = run_in(home.path(), &["run", "--path", d, "--reference", g]);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("local/llama-q80: refused: 8 of 21 tensors fail verification: lm_head.weight, model.layers.0.mlp.down_proj.weight"),
        "{err}"
    );
    assert!(
        err.contains("FAIL model.layers.0.self_attn.v_proj.weight (gguf:blk.0.attn_v.weight (Q8_0)): structural: broken conversion"),
        "{err}"
    );
}

#[test]
fn semantics_prints_decisions_and_refuses_by_name() {
    let home = tempfile::tempdir().expect("tmp");
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs");
    let ok = run_in(
        home.path(),
        &[
            "semantics",
            cfg.join("gemma3/gemma-3-270m-it").to_str().expect("utf8"),
        ],
    );
    assert_eq!(ok.status.code(), Some(0));
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(text.contains("rope_base[sliding]=10000 <- config:rope_local_base_freq; sliding layers are never scaled"), "{text}");
    assert!(text.contains("norm_form=stored_1+w (apply as stored) <- family:gemma3 (the pack stores 1+w) [seed #2248]"), "{text}");
    let bad = run_in(
        home.path(),
        &[
            "semantics",
            cfg.join("qwen/Qwen3-Next-80B-A3B-Instruct")
                .to_str()
                .expect("utf8"),
        ],
    );
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("model_type \"qwen3_next\" (Qwen3NextForCausalLM) has no semantics table; it is not treated as qwen3_5"), "{err}");
}

#[test]
fn a_reference_can_name_a_file_in_the_local_hugging_face_cache() {
    let home = tempfile::tempdir().expect("tmp");
    let hf = tempfile::tempdir().expect("tmp");
    let snap = hf
        .path()
        .join("hub/models--google--gemma-3-tiny/snapshots/0123abcd");
    std::fs::create_dir_all(&snap).expect("mkdir");
    std::fs::create_dir_all(hf.path().join("hub/models--google--gemma-3-tiny/refs"))
        .expect("mkdir");
    std::fs::write(
        hf.path().join("hub/models--google--gemma-3-tiny/refs/main"),
        "0123abcd",
    )
    .expect("ref");
    std::fs::copy(
        fixture("gemma3-q41-quarter/model.gguf"),
        snap.join("tiny.gguf"),
    )
    .expect("copy");
    let dir = fixture("gemma3-q41-quarter/rb16");
    let run = |reference: &str| {
        bin()
            .env("ONEBIT_HOME", home.path())
            .env("HF_HOME", hf.path())
            .env_remove("HF_HUB_CACHE")
            .args([
                "run",
                "--path",
                dir.to_str().expect("utf8"),
                "--reference",
                reference,
            ])
            .output()
            .expect("spawn")
    };
    let ok = run("google/gemma-3-tiny:tiny.gguf");
    assert_success(&ok, "");
    assert!(String::from_utf8_lossy(&ok.stderr).contains("local/rb16: verified: 16 tensors pass"));
    // Offline, a file the cache lacks is refused by name (online it would be fetched).
    let missing = bin()
        .env("ONEBIT_HOME", home.path())
        .env("HF_HOME", hf.path())
        .env("HF_HUB_OFFLINE", "1")
        .args([
            "run",
            "--path",
            dir.to_str().expect("utf8"),
            "--reference",
            "google/gemma-3-tiny:other.gguf",
        ])
        .output()
        .expect("spawn");
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("google/gemma-3-tiny at revision main has no file other.gguf"),
        "{err}"
    );
}

#[test]
fn sql_answers_in_every_format_and_points_at_errors() {
    let home = tempfile::tempdir().expect("tmp");
    let dir = fixture("llama-q41");
    let gguf = fixture("llama-q41/model.gguf");
    let imported = run_in(
        home.path(),
        &[
            "--quiet",
            "run",
            "--path",
            dir.to_str().expect("utf8"),
            "--reference",
            gguf.to_str().expect("utf8"),
        ],
    );
    assert_success(&imported, "");
    let q = "SELECT kind, count(*) AS n FROM tensors GROUP BY kind ORDER BY kind";
    let csv = run_in(home.path(), &["sql", q, "--format", "csv"]);
    assert_eq!(
        String::from_utf8_lossy(&csv.stdout),
        "kind,n\nQ41_5120,15\nplain,6\n"
    );
    let json = run_in(home.path(), &["sql", q, "--format", "json"]);
    let v: Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(
        v,
        serde_json::json!([{"kind": "Q41_5120", "n": 15}, {"kind": "plain", "n": 6}])
    );
    let table = run_in(home.path(), &["sql", q]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("| Q41_5120 | 15 |"));
    let out = home.path().join("kinds.parquet");
    let pq = run_in(
        home.path(),
        &[
            "sql",
            q,
            "--format",
            "parquet",
            "--out",
            out.to_str().expect("utf8"),
        ],
    );
    assert_eq!(pq.status.code(), Some(0));
    assert_eq!(&std::fs::read(&out).expect("parquet")[..4], b"PAR1");
    let bad = run_in(
        home.path(),
        &["sql", "SELECT kind FROM tensors WHERE kind = = 'x'"],
    );
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("SELECT kind FROM tensors WHERE kind = = 'x'") && err.contains('^'),
        "{err}"
    );
}

/// The catalog's tables, as datafusion-cli shows them: `SHOW TABLES`, `DESCRIBE`, `SHOW COLUMNS`
/// and `information_schema`, listing only the tables and views people query (the store's files
/// behind the views are never named).
#[test]
fn sql_shows_tables_and_describes_them() {
    let home = tempfile::tempdir().expect("tmp");
    let dir = fixture("llama-q41");
    let run = run_in(
        home.path(),
        &["--quiet", "run", "--path", dir.to_str().expect("utf8")],
    );
    assert_success(&run, "import");
    let json = |q: &str| -> Vec<Value> {
        let out = run_in(home.path(), &["sql", q, "--format", "json"]);
        assert_success(&out, q);
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let shown = json("SHOW TABLES");
    let schemas: std::collections::BTreeSet<&str> = shown
        .iter()
        .filter_map(|r| r["table_schema"].as_str())
        .collect();
    assert_eq!(
        schemas,
        ["information_schema", "public"].into(),
        "{shown:?}"
    );
    let public: Vec<String> = shown
        .iter()
        .filter(|r| r["table_schema"] == "public")
        .filter_map(|r| r["table_name"].as_str().map(str::to_string))
        .collect();
    assert!(
        public
            .iter()
            .all(|n| !n.contains("store_files") && !n.ends_with(char::is_numeric)),
        "per-file tables listed: {public:?}"
    );
    for t in [
        "packs",
        "runs",
        "cache",
        "tensors",
        "verification_history",
        "kernels",
    ] {
        assert!(public.iter().any(|n| n == t), "{t} not in {public:?}");
    }
    let cols = json("DESCRIBE packs");
    assert_eq!(cols[0]["column_name"], "name");
    assert_eq!(cols[0]["data_type"], "Utf8");
    let shown = json("SHOW COLUMNS FROM tensors");
    assert!(
        shown.iter().any(|r| r["column_name"] == "pack"),
        "{shown:?}"
    );
    let n = json(
        "SELECT count(*) AS n FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name = 'packs'",
    );
    assert_eq!(n[0]["n"], 10);
}

#[test]
fn the_sql_prompt_lists_tables_and_runs_statements() {
    use std::io::Write;
    let home = tempfile::tempdir().expect("tmp");
    let dir = fixture("llama-q41");
    assert_eq!(
        run_in(
            home.path(),
            &["--quiet", "run", "--path", dir.to_str().expect("utf8")]
        )
        .status
        .code(),
        Some(0)
    );
    let mut child = bin()
        .env("ONEBIT_HOME", home.path())
        .arg("sql")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b".tables\n.schema packs\nSELECT name,\n  needs_run FROM packs;\n.quit\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\ntensor_stats_history\n"), "{text}");
    assert!(
        text.contains("needs_run                    Boolean"),
        "{text}"
    );
    assert!(text.contains("| local/llama-q41 | false     |"), "{text}");
}

#[test]
fn fixture_packs_generate_and_refuse_by_verdict_or_family() {
    let home = tempfile::tempdir().expect("tmp");
    // Verified packs of two families run on the host: greedy twice gives the same tokens.
    for (case, gguf) in [
        ("llama-q41", "llama-q41/model.gguf"),
        ("gemma3-q41-quarter/rb16", "gemma3-q41-quarter/model.gguf"),
    ] {
        let (d, g) = (fixture(case), fixture(gguf));
        let args = [
            "--json",
            "generate",
            "--path",
            d.to_str().expect("utf8"),
            "--reference",
            g.to_str().expect("utf8"),
            "--prompt",
            "the cat",
            "--max-tokens",
            "6",
        ];
        let runs: Vec<Value> = (0..2)
            .map(|_| {
                let out = run_in(home.path(), &args);
                assert_success(&out, case);
                events(&out).pop().expect("result line")
            })
            .collect();
        assert!(
            runs[0]["prompt_tokens"].as_u64().unwrap_or(0) >= 2,
            "{case}: {}",
            runs[0]
        );
        assert_eq!(runs[0]["tokens"], runs[1]["tokens"], "{case}");
        assert!(runs[0]["kernel"].as_str().is_some());
    }
    // Gemma's head is tied and stored as tiles: repack wrote the 2-bit scan head that greedy
    // decoding ranks with, recorded in the manifest with its digest and a decision.
    let gemma = pack_manifests(home.path())
        .into_iter()
        .find(|(_, m)| {
            m["model"]["family"]
                .as_str()
                .is_some_and(|f| f.starts_with("gemma3"))
        })
        .expect("a gemma3 pack");
    let (dir, m) = gemma;
    assert_eq!(m["model"]["tied_head"], true, "{m}");
    let scan = &m["head_scan"];
    let bytes = std::fs::read(dir.join(scan["file"].as_str().expect("file"))).expect("scan file");
    assert_eq!(
        scan["blake3"].as_str(),
        Some(blake3::hash(&bytes).to_hex().as_str()),
        "{scan}"
    );
    assert!(
        m["decisions"]
            .as_array()
            .expect("decisions")
            .iter()
            .any(|d| d
                .as_str()
                .is_some_and(|d| d.starts_with("head_scan=head-scan.bin"))),
        "{m}"
    );
    // The broken pack is refused by its verdict, naming a failing tensor.
    let (d, g) = (fixture("llama-q80"), fixture("llama-q80/model.gguf"));
    let out = run_in(
        home.path(),
        &[
            "generate",
            "--path",
            d.to_str().expect("utf8"),
            "--reference",
            g.to_str().expect("utf8"),
            "--prompt",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not verified") && err.contains("lm_head.weight"),
        "{err}"
    );
}

/// Every pack folder in the store under `home`, with its manifest.
fn pack_manifests(home: &Path) -> Vec<(PathBuf, Value)> {
    let entries = std::fs::read_dir(home.join("store-v1/entries")).expect("entries");
    entries
        .filter_map(|e| {
            let dir = e.ok()?.path().join("out/pack");
            let m = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).ok()?).ok()?;
            Some((dir, m))
        })
        .collect()
}

/// A fake xclbin (AXLF as `xrt/xclbin.h` lays it out) listing `kernels`.
fn xclbin(path: &Path, kernels: &[&str]) {
    std::fs::write(path, onebit_stages::format::axlf::build([3; 16], kernels)).expect("xclbin");
}

#[test]
fn the_kernel_set_lists_shapes_and_refuses_a_kernel_directory_missing_one() {
    let home = tempfile::tempdir().expect("tmp");
    let (d, g) = (fixture("llama-q41"), fixture("llama-q41/model.gguf"));
    let (d, g) = (d.to_str().expect("utf8"), g.to_str().expect("utf8"));
    let base = [
        "--json",
        "kernels",
        "--path",
        d,
        "--reference",
        g,
        "--batch",
        "8",
    ];
    let out = run_in(home.path(), &base);
    assert_success(&out, "");
    let set = events(&out).pop().expect("set");
    let name = set["name"].as_str().expect("name").to_string();
    assert!(
        name.starts_with("kernels-") && name.ends_with("-b8"),
        "{name}"
    );
    let shapes = set["shapes"].as_array().expect("shapes");
    let kernels: Vec<&str> = shapes
        .iter()
        .filter_map(|s| s["npu_kernel"].as_str())
        .collect();
    // Decode (M = 1) and prefill (M = 8) shapes of every role, K and N on the tile grid.
    assert!(
        kernels.iter().any(|k| k.starts_with("gemv_1x")),
        "{kernels:?}"
    );
    assert!(
        kernels.iter().any(|k| k.starts_with("gemm_8x")),
        "{kernels:?}"
    );
    for s in shapes {
        assert_eq!(s["k_padded"].as_u64().unwrap_or(1) % 256, 0, "{s}");
    }
    assert_eq!(
        set["host_self_check_max_rel"].as_f64().map(|r| r < 1e-4),
        Some(true),
        "{set}"
    );

    // A kernel directory providing every shape but one: refused, naming the missing one.
    let kd = tempfile::tempdir().expect("tmp");
    let (last, rest) = kernels.split_last().expect("shapes");
    xclbin(&kd.path().join("a.xclbin"), rest);
    xclbin(&kd.path().join("b.xclbin"), &[]);
    let mut args: Vec<&str> = base.to_vec();
    let kdir = kd.path().to_str().expect("utf8");
    args.extend(["--kernel-dir", kdir]);
    let out = run_in(home.path(), &args);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("no kernel for 1 of {} shapes", kernels.len())) && err.contains(last),
        "{err}"
    );
    // With the last one added, every shape has its provider.
    xclbin(&kd.path().join("b.xclbin"), &[last]);
    let out = run_in(home.path(), &args);
    assert_success(&out, "");
    let set = events(&out).pop().expect("set");
    let providers: Vec<&str> = set["shapes"]
        .as_array()
        .expect("shapes")
        .iter()
        .filter_map(|s| s["npu_provider"].as_str())
        .collect();
    assert_eq!(providers.len(), kernels.len());
    assert!(
        providers.contains(&format!("b.xclbin:{last}").as_str()),
        "{providers:?}"
    );
}

/// Flags no sampler, context or evaluation can honour are refused by name with exit code 2, not
/// a panic: NaN and infinite temperatures, a top-p of 0 or NaN, a repetition penalty of 0 or NaN,
/// a context of 0, 2^56 or past the model's, and evaluations with nothing to score.
#[test]
fn impossible_flags_are_refused_by_name_not_by_a_panic() {
    let home = tempfile::tempdir().expect("tmp");
    let (d, g) = (fixture("llama-q41"), fixture("llama-q41/model.gguf"));
    let src = [
        "--path",
        d.to_str().expect("utf8"),
        "--reference",
        g.to_str().expect("utf8"),
    ];
    let refused = |extra: &[&str], want: &str| {
        let mut args: Vec<&str> = Vec::new();
        args.extend_from_slice(&extra[..1]);
        args.extend_from_slice(&src);
        args.extend_from_slice(&extra[1..]);
        let out = run_in(home.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: wanted {want:?} in {err}");
    };
    let generate = |flag: &'static str, v: &'static str| ["generate", "--prompt", "x", flag, v];
    for v in ["nan", "inf"] {
        refused(&generate("--temperature", v), "temperature");
    }
    for v in ["0", "nan", "1.5"] {
        refused(&generate("--top-p", v), "top_p");
    }
    for v in ["0", "nan", "1e-300"] {
        refused(&generate("--repeat-penalty", v), "repetition_penalty");
    }
    for v in ["0", "1", "72057594037927936", "100000000000"] {
        refused(&generate("--ctx-size", v), "ctx-size");
    }
    refused(&["eval", "--ids", "[]"], "--ids: 0 ids");
    let text = home.path().join("text.txt");
    std::fs::write(&text, "the cat sat on the mat").expect("write");
    refused(
        &["eval", "--file", text.to_str().expect("utf8"), "--ctx", "0"],
        "ctx:",
    );
    // The same pack still generates with sound flags.
    let out = run_in(
        home.path(),
        &[
            "generate",
            src[0],
            src[1],
            src[2],
            src[3],
            "--prompt",
            "x",
            "--max-tokens",
            "2",
            "--ctx-size",
            "64",
        ],
    );
    assert_success(&out, "generate");
}

#[test]
fn a_cache_type_nobody_knows_is_refused_naming_the_flag_and_the_choices() {
    for cmd in ["generate", "chat", "eval", "serve"] {
        let out = bin()
            .args([cmd, "--pack", "/nonexistent", "--cache-type", "q3"])
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("--cache-type") && err.contains("`q3`") && err.contains("q8_0"),
            "{cmd}: {err}"
        );
    }
}

/// clap checks a command's flag rules (conflicts, requires, groups: each names flags that exist)
/// when it builds the command, in debug builds such as this one: `--help` of every subcommand
/// builds it with its flattened source flags, so a rule naming a missing flag panics here.
#[test]
fn every_subcommands_flag_rules_name_flags_that_exist() {
    let top = bin().arg("--help").output().expect("spawn");
    assert_success(&top, "--help");
    let text = String::from_utf8_lossy(&top.stdout);
    let names: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .collect();
    assert!(names.contains(&"serve") && names.len() >= 13, "{names:?}");
    for name in names {
        let out = bin().args([name, "--help"]).output().expect("spawn");
        assert_success(&out, name);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage:"),
            "{name}"
        );
    }
}
