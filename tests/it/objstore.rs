//! The shared store against a real S3-compatible server (`s3s-fs` on 127.0.0.1): a second machine
//! fetches every stage instead of computing it, `sql` on a third sees the pack, two importers at
//! once publish each entry once, an importer killed mid-upload leaves no entry and its lease
//! lapses, a server restarted mid-import does not fail the import, wrong credentials write
//! nothing, and pyarrow reads the layout as it is.

use crate::s3_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use s3_server::{BUCKET, Proxy, S3Server, SECRET_KEY, aws_env, manifest_keys};
use serde_json::Value;

const STORE: &str = "s3://team/shared";
const PREFIX: &str = "shared/store-v1";

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/q4nx")
        .join(case)
}

fn cmd(home: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    aws_env(&mut c, endpoint, SECRET_KEY);
    c.env("ONEBIT_HOME", home)
        .env("ONEBIT_STORE", STORE)
        .env("ONEBIT_LEASE_TTL_S", "2")
        .args(args);
    c
}

fn run(home: &Path, endpoint: &str, args: &[&str]) -> Output {
    cmd(home, endpoint, args)
        .output()
        .expect("spawn onebit-pipe")
}

fn ok(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `(stage, status, reason, key)` of every finished stage in `--json` output.
fn stages(out: &Output) -> Vec<(String, String, String, String)> {
    let mut v: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "stage_finished")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("stage"), s("status"), s("reason"), s("key"))
        })
        .collect();
    v.sort();
    v
}

fn import(home: &Path, endpoint: &str) -> Output {
    let p = fixture("llama-q41");
    run(
        home,
        endpoint,
        &["--json", "run", "--path", p.to_str().expect("utf8")],
    )
}

/// An import of fixture `case` through `proxy`, which holds its first manifest PUT: returns once
/// the import is held there.
fn held_import(
    home: &Path,
    proxy: &Proxy,
    case: &str,
    out: Stdio,
    err: Stdio,
) -> std::process::Child {
    proxy.arm();
    let p = fixture(case);
    let child = cmd(
        home,
        &proxy.endpoint(),
        &["--json", "run", "--path", p.to_str().expect("utf8")],
    )
    .stdout(out)
    .stderr(err)
    .spawn()
    .expect("spawn");
    proxy.wait_stalled(Duration::from_secs(60));
    child
}

fn sql_json(home: &Path, endpoint: &str, q: &str) -> Vec<Value> {
    let out = run(home, endpoint, &["sql", "--format", "json", q]);
    ok(&out, q);
    let text = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(rows)) => rows,
        _ => text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    }
}

#[test]
fn a_second_machine_fetches_every_stage_and_a_third_queries_the_shared_catalog() {
    let server = S3Server::start();
    let (a, b, c) = (
        tempfile::tempdir(),
        tempfile::tempdir(),
        tempfile::tempdir(),
    );
    let (a, b, c) = (a.expect("tmp"), b.expect("tmp"), c.expect("tmp"));
    let ep = server.endpoint();
    let first = import(a.path(), &ep);
    ok(&first, "first import");
    let first = stages(&first);
    assert_eq!(first.len(), 6);
    assert!(first.iter().all(|s| s.1 == "miss"), "{first:?}");
    assert_eq!(manifest_keys(&server, PREFIX).len(), 6);

    let second = import(b.path(), &ep);
    ok(&second, "import on a second machine");
    let second = stages(&second);
    for (x, y) in first.iter().zip(&second) {
        assert_eq!((&x.0, &x.3), (&y.0, &y.3), "same stage, same key");
        assert_eq!(y.1, "hit");
        assert_eq!(y.2, "fetched from the shared store");
    }
    // The fetched entries are whole: a deep status re-hashes every file.
    let st = run(b.path(), &ep, &["--json", "status", "--deep"]);
    ok(&st, "status --deep");
    assert!(!String::from_utf8_lossy(&st.stdout).contains("tampered"));

    // A third machine with an empty cache: the catalog is read from the bucket.
    let rows = sql_json(
        c.path(),
        &ep,
        "SELECT pack, count(*) AS n FROM tensors GROUP BY pack",
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["pack"], "local/llama-q41");
    assert_eq!(rows[0]["n"], 21);
    let rows = sql_json(
        c.path(),
        &ep,
        "SELECT status, count(*) AS n FROM runs GROUP BY status ORDER BY status",
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0]["status"].clone(), rows[0]["n"].clone()),
        ("hit".into(), 6.into())
    );
    assert_eq!(
        (rows[1]["status"].clone(), rows[1]["n"].clone()),
        ("miss".into(), 6.into())
    );
    let rows = sql_json(
        c.path(),
        &ep,
        "SELECT count(*) AS n FROM cache WHERE referenced",
    );
    assert_eq!(rows[0]["n"], 6);
    let rows = sql_json(c.path(), &ep, "SELECT needs_run FROM packs");
    assert_eq!(rows[0]["needs_run"], false);
    let rows = sql_json(
        c.path(),
        &ep,
        "SELECT count(DISTINCT import_key) AS imports, bool_and(current) AS current \
         FROM verification_history",
    );
    assert_eq!(
        (rows[0]["imports"].clone(), rows[0]["current"].clone()),
        (1.into(), true.into())
    );
    assert!(
        !c.path().join("store-v1/entries").exists()
            || std::fs::read_dir(c.path().join("store-v1/entries"))
                .expect("list")
                .next()
                .is_none(),
        "sql fetched no entry into the cache"
    );
    // The report reads the same tables (and fetches the detect entry to decode values).
    let page = c.path().join("report.html");
    let out = run(
        c.path(),
        &ep,
        &[
            "report",
            "--pack",
            "local/llama-q41",
            "--out",
            page.to_str().expect("utf8"),
        ],
    );
    ok(&out, "report from the shared catalog");
    let html = std::fs::read_to_string(&page).expect("report written");
    assert!(
        html.contains("local/llama-q41") && html.contains("model.layers.0.mlp.down_proj.weight")
    );
}

#[test]
fn wrong_credentials_fail_clearly_and_write_nothing() {
    let server = S3Server::start();
    let home = tempfile::tempdir().expect("tmp");
    let before = server.objects("");
    let p = fixture("llama-q41");
    let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    aws_env(&mut c, &server.endpoint(), "not-the-secret");
    let out = c
        .env("ONEBIT_HOME", home.path().join("h"))
        .args(["--store", STORE, "run", "--path", p.to_str().expect("utf8")])
        .output()
        .expect("spawn");
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("shared store s3://team/shared")
            && err.contains("refused the credentials")
            && err.contains("secret key <- AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    assert!(!home.path().join("h").exists(), "nothing written locally");
    assert_eq!(server.objects(""), before, "nothing written to the server");
}

#[test]
fn two_importers_at_once_publish_each_entry_once_and_agree() {
    let server = S3Server::start();
    let ep = server.endpoint();
    let homes: Vec<_> = (0..2).map(|_| tempfile::tempdir().expect("tmp")).collect();
    let p = fixture("llama-q41");
    let children: Vec<_> = homes
        .iter()
        .map(|h| {
            cmd(
                h.path(),
                &ep,
                &["--json", "run", "--path", p.to_str().expect("utf8")],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    for o in &outs {
        ok(o, "concurrent import");
    }
    let (x, y) = (stages(&outs[0]), stages(&outs[1]));
    for (s, t) in x.iter().zip(&y) {
        assert_eq!((&s.0, &s.3), (&t.0, &t.3), "both name the same key");
    }
    let mut keys = manifest_keys(&server, PREFIX);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 6, "one manifest per stage key");
    // Each stage body ran at most once per machine, and the store ends whole: a third machine
    // fetches all six and re-hashes them.
    let c = tempfile::tempdir().expect("tmp");
    let third = import(c.path(), &ep);
    ok(&third, "third import");
    assert!(stages(&third).iter().all(|s| s.1 == "hit"));
    ok(
        &run(c.path(), &ep, &["status", "--deep"]),
        "status --deep on the third machine",
    );
}

#[test]
fn an_importer_killed_mid_upload_leaves_no_entry_and_its_lease_lapses() {
    let server = S3Server::start();
    let proxy = Proxy::start(server.port);
    let a = tempfile::tempdir().expect("tmp");
    let mut child = held_import(a.path(), &proxy, "llama-q41", Stdio::null(), Stdio::null());
    child.kill().expect("kill");
    let _ = child.wait();
    proxy.release();
    // Files of an upload are there, its manifest is not.
    let uploads = server.objects(&format!("{PREFIX}/entries"));
    let manifests = manifest_keys(&server, PREFIX);
    assert!(
        uploads
            .iter()
            .any(|o| o.contains("/out/") && !manifests.iter().any(|k| o.contains(k.as_str()))),
        "an upload without a manifest: {uploads:?}"
    );

    let b = tempfile::tempdir().expect("tmp");
    let out = import(b.path(), &server.endpoint());
    ok(&out, "import after the kill");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lease lapsed"), "{err}");
    assert_eq!(manifest_keys(&server, PREFIX).len(), 6);

    // Its run lease lapses too (renewed until the kill, like the stage lease B waited out).
    std::thread::sleep(Duration::from_millis(2500));
    let gc = run(b.path(), &server.endpoint(), &["--json", "gc"]);
    ok(&gc, "gc");
    let report: Value = serde_json::from_slice(&gc.stdout).expect("gc json");
    assert!(
        report["shared"]["uploads_removed"].as_u64() >= Some(1),
        "{report}"
    );
    assert_eq!(report["shared"]["entries_kept"], 6);
    // What gc left is whole.
    let c = tempfile::tempdir().expect("tmp");
    let third = import(c.path(), &server.endpoint());
    ok(&third, "import after gc");
    assert!(stages(&third).iter().all(|s| s.1 == "hit"));
}

#[test]
fn a_server_restarted_mid_import_does_not_fail_the_import() {
    let mut server = S3Server::start();
    let proxy = Proxy::start(server.port);
    let a = tempfile::tempdir().expect("tmp");
    let child = held_import(
        a.path(),
        &proxy,
        "llama-q41",
        Stdio::piped(),
        Stdio::piped(),
    );
    server.restart();
    proxy.release();
    let out = child.wait_with_output().expect("wait");
    ok(&out, "import across the restart");
    assert_eq!(stages(&out).len(), 6);
    assert_eq!(manifest_keys(&server, PREFIX).len(), 6);
    let c = tempfile::tempdir().expect("tmp");
    let again = import(c.path(), &server.endpoint());
    ok(&again, "import after the restart");
    assert!(stages(&again).iter().all(|s| s.1 == "hit"));
}

#[test]
fn gc_on_a_shared_store_refuses_while_an_import_runs() {
    let server = S3Server::start();
    let proxy = Proxy::start(server.port);
    let a = tempfile::tempdir().expect("tmp");
    ok(&import(a.path(), &server.endpoint()), "first import");
    // A second pack's import, held at its first publication.
    let mut child = held_import(a.path(), &proxy, "llama-q40", Stdio::null(), Stdio::null());
    let b = tempfile::tempdir().expect("tmp");
    let gc = run(b.path(), &server.endpoint(), &["gc"]);
    assert_ne!(gc.status.code(), Some(0));
    let err = String::from_utf8_lossy(&gc.stderr);
    assert!(err.contains("is running import local/llama-q40"), "{err}");
    child.kill().expect("kill");
    let _ = child.wait();
    proxy.release();
}

#[test]
fn pyarrow_reads_the_shared_layout_as_it_is() {
    let server = S3Server::start();
    let a = tempfile::tempdir().expect("tmp");
    ok(&import(a.path(), &server.endpoint()), "import");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/objstore_pyarrow.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--endpoint", &server.endpoint(), "--bucket", BUCKET])
        .args(["--root", PREFIX, "--access-key", s3_server::ACCESS_KEY])
        .args(["--secret-key", SECRET_KEY])
        .output()
        .expect("python3");
    ok(&out, "pyarrow over the bucket");
    let got: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(got["packs"], serde_json::json!(["local/llama-q41"]));
    assert_eq!(got["run_rows"], 6);
    assert_eq!(got["tensor_rows"], 21);
}

#[test]
fn a_damaged_shared_entry_is_refused_with_both_readings_and_nothing_is_kept() {
    let server = S3Server::start();
    let a = tempfile::tempdir().expect("tmp");
    ok(&import(a.path(), &server.endpoint()), "import");
    // Flip bytes of one published file on the server's disk (same size).
    let victim = server
        .objects(PREFIX)
        .into_iter()
        .find(|o| o.ends_with("/out/tables/tensors.parquet"))
        .expect("the dequant entry's tensors table");
    let path = server.root.path().join(BUCKET).join(&victim);
    let mut bytes = std::fs::read(&path).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write");

    let b = tempfile::tempdir().expect("tmp");
    let out = import(b.path(), &server.endpoint());
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tables/tensors.parquet")
            && err.contains("where the manifest says")
            && err.contains("blake3"),
        "{err}"
    );
    // Nothing of the damaged entry was kept in the local cache.
    let entries = b.path().join("store-v1/entries");
    let kept: Vec<_> = std::fs::read_dir(&entries)
        .expect("entries")
        .flatten()
        .filter(|e| e.path().join("out/tables/tensors.parquet").exists())
        .collect();
    assert!(kept.is_empty(), "{kept:?}");
}

#[test]
fn large_artifacts_go_up_in_parts_and_come_down_in_ranges_intact() {
    let server = S3Server::start();
    let ep = server.endpoint();
    let (a, b) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    // 18 MB per stage (the demo splits its bytes over ten stages): above the 16 MB part size, so
    // multipart uploads and ranged GETs, one part whole and one short.
    let args = ["--json", "run", "--demo", "--demo-bytes", "180000000"];
    let first = run(a.path(), &ep, &args);
    ok(&first, "demo graph, first machine");
    assert!(stages(&first).iter().all(|s| s.1 == "miss"));
    let second = run(b.path(), &ep, &args);
    ok(&second, "demo graph, second machine");
    let second = stages(&second);
    assert_eq!(second.len(), 10);
    let big = String::from_utf8_lossy(&first.stdout).contains("\"bytes_out\":18000000");
    assert!(big, "each stage wrote 18 MB");
    assert!(
        second
            .iter()
            .all(|s| s.2 == "fetched from the shared store"),
        "{second:?}"
    );
    let deep = run(b.path(), &ep, &["--json", "status", "--deep"]);
    ok(&deep, "status --deep");
    let text = String::from_utf8_lossy(&deep.stdout);
    assert!(
        text.contains("fresh") && !text.contains("tampered"),
        "{text}"
    );
}

#[test]
fn a_stage_longer_than_its_lease_keeps_it_by_renewing_and_runs_once() {
    let server = S3Server::start();
    let ep = server.endpoint();
    let homes: Vec<_> = (0..2).map(|_| tempfile::tempdir().expect("tmp")).collect();
    // Each stage body sleeps 4 s against a 1.5 s lease (renewed every 0.5 s, so a renewal may come
    // 1 s late on a loaded machine): only renewal keeps the other importer out.
    let args = [
        "--json",
        "run",
        "--demo",
        "--demo-bytes",
        "100000",
        "--demo-delay-ms",
        "4000",
    ];
    // The second starts a moment later: s3s-fs checks If-None-Match and then writes, so two
    // creations in the same instant can both succeed there (S3 itself decides atomically).
    let children: Vec<_> = homes
        .iter()
        .map(|h| {
            let c = cmd(h.path(), &ep, &args)
                .env("ONEBIT_LEASE_TTL_S", "1.5")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            std::thread::sleep(Duration::from_millis(300));
            c
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    let mut misses = 0;
    for o in &outs {
        ok(o, "concurrent demo");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("lease lapsed"), "{err}");
        misses += stages(o).iter().filter(|s| s.1 == "miss").count();
    }
    assert_eq!(misses, 10, "every stage body ran once across both machines");
}
