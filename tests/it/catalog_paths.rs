//! The catalog reads a local store and a shared store by one code path: the same packs imported
//! into a local store and into a shared one (`s3s-fs` on 127.0.0.1) answer the same queries with
//! the same rows, every stage table, every `*_history` view and the tables the catalog builds
//! itself, and both list the same tables in `information_schema`.

use crate::s3_server;

use std::path::Path;
use std::process::{Command, Output};

use s3_server::{S3Server, SECRET_KEY, aws_env};
use serde_json::Value;

const STORE: &str = "s3://team/paths";
const CASES: [&str; 2] = ["llama-q41", "qwen35-q80"];

/// `onebit-pipe` with `home` as its local store, and the shared store at `endpoint` when given.
fn cmd(home: &Path, shared: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    c.env("ONEBIT_HOME", home).env_remove("ONEBIT_STORE");
    if let Some(endpoint) = shared {
        aws_env(&mut c, endpoint, SECRET_KEY);
        c.env("ONEBIT_STORE", STORE);
    }
    let out = c.args(args).output().expect("spawn onebit-pipe");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The rows of `q`, each as its JSON text, sorted: row for row, whatever order the plan gives.
fn rows(home: &Path, shared: Option<&str>, q: &str) -> Vec<String> {
    let out = cmd(home, shared, &["sql", "--format", "json", q]);
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(rows)) => rows,
        _ => text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    };
    let mut v: Vec<String> = rows.iter().map(Value::to_string).collect();
    v.sort();
    v
}

#[test]
fn a_local_and_a_shared_store_of_the_same_packs_answer_every_query_alike() {
    let server = S3Server::start();
    let ep = server.endpoint();
    let (local, shared) = (tempfile::tempdir(), tempfile::tempdir());
    let (local, shared) = (local.expect("tmp"), shared.expect("tmp"));
    for case in CASES {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/q4nx")
            .join(case);
        let dir = dir.to_str().expect("utf8");
        cmd(local.path(), None, &["-q", "run", "--path", dir]);
        cmd(shared.path(), Some(&ep), &["-q", "run", "--path", dir]);
    }
    // Run ids and times differ between the two sittings, and `cache.bytes`/`files` count what each
    // store holds (a local entry's whole folder, a shared entry's published outputs); everything
    // else is the packs' own.
    let queries = [
        "SELECT * FROM tensors",
        "SELECT * FROM tensor_stats",
        "SELECT * FROM block_stats",
        "SELECT * FROM verification",
        "SELECT * FROM semantics",
        "SELECT * FROM layers",
        "SELECT * FROM kernels",
        "SELECT * EXCLUDE (first_run, last_run) FROM tensors_history",
        "SELECT * EXCLUDE (first_run, last_run) FROM verification_history",
        "SELECT * EXCLUDE (first_run, last_run) FROM kernels_history",
        "SELECT ref_name, stage, version, key, status FROM runs",
        "SELECT key, stage, version, referenced, packs FROM cache",
        "SELECT name, source, dir, stages, needs_run, stale_stages, verified, verdict FROM packs",
        "SELECT table_name, table_type FROM information_schema.tables \
         WHERE table_schema = 'public'",
        "SELECT table_name, column_name, data_type, is_nullable \
         FROM information_schema.columns WHERE table_schema = 'public'",
    ];
    for q in queries {
        let (a, b) = (
            rows(local.path(), None, q),
            rows(shared.path(), Some(&ep), q),
        );
        assert!(!a.is_empty(), "{q}: no rows on the local store");
        assert_eq!(a.len(), b.len(), "{q}: row counts differ");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y, "{q}: local and shared rows differ");
        }
    }
}
