//! Helpers the binary's integration tests share: where the real model is, and starting
//! `onebit-pipe serve` on a free port.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The Gemma 3 270M GGUF: `$ONEBIT_GEMMA_GGUF`, else where scripts/fetch-gemma.sh puts it.
pub fn gemma_gguf() -> PathBuf {
    std::env::var_os("ONEBIT_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/onebit-models/gemma-3-270m-q4_k_m.gguf")
        })
}

/// Spawns `cmd` (an `onebit-pipe serve --port 0 …`) and returns it with the address it printed
/// (`listening on http://ADDR`); its stderr keeps being drained so the server never blocks.
pub fn spawn_server(cmd: Command) -> (Child, SocketAddr) {
    let (child, addr, _) = spawn_server_logged(cmd);
    (child, addr)
}

/// [`spawn_server`], also keeping every later stderr line of the server.
#[allow(dead_code)]
pub fn spawn_server_logged(
    mut cmd: Command,
) -> (
    Child,
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("serve exited before listening")
            .expect("stderr line");
        if let Some(rest) = line.strip_prefix("listening on http://") {
            let a = rest.split_whitespace().next().expect("address");
            break a.parse::<SocketAddr>().expect("socket address");
        }
    };
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().expect("log").push(line);
        }
    });
    (child, addr, log)
}

/// Runs `onebit-pipe` with `args` in its own store at `home`.
pub fn run_in(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_onebit-pipe"))
        .env("ONEBIT_HOME", home)
        .args(args)
        .output()
        .expect("spawn onebit-pipe")
}

/// `tests/fixtures/oracle/<case>`: an independent oracle (docs/oracles.md).
pub fn oracle(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/oracle")
        .join(case)
}

/// The oracle's `reference.json`.
pub fn oracle_reference(case: &str) -> serde_json::Value {
    let path = oracle(case).join("reference.json");
    serde_json::from_slice(&std::fs::read(&path).expect("reference.json")).expect("json")
}

/// The oracle's fixed ids.
pub fn oracle_ids(reference: &serde_json::Value) -> Vec<u32> {
    reference["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

/// The oracle's logits for `quant` (`f32`, `q4_0`, `q4_1`), one row per position.
pub fn oracle_logits(reference: &serde_json::Value, quant: &str) -> Vec<Vec<f32>> {
    reference["logits"][quant]
        .as_array()
        .expect("logits")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_f64().expect("logit") as f32)
                .collect()
        })
        .collect()
}

/// The rows of a Parquet table as JSON objects (strings, integers and floats; other columns and
/// nulls as null), for asserting on the tables the stages write.
pub fn parquet_rows(path: &Path) -> Vec<serde_json::Value> {
    use arrow_array::{Array, Float64Array, StringArray, UInt64Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let file = std::fs::File::open(path).expect("parquet file");
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader");
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.expect("batch");
        let schema = batch.schema();
        for i in 0..batch.num_rows() {
            let mut row = serde_json::Map::new();
            for (f, col) in schema.fields().iter().zip(batch.columns()) {
                let any = col.as_any();
                let v = if col.is_null(i) {
                    serde_json::Value::Null
                } else if let Some(a) = any.downcast_ref::<StringArray>() {
                    serde_json::json!(a.value(i))
                } else if let Some(a) = any.downcast_ref::<UInt64Array>() {
                    serde_json::json!(a.value(i))
                } else if let Some(a) = any.downcast_ref::<Float64Array>() {
                    serde_json::json!(a.value(i))
                } else {
                    serde_json::Value::Null
                };
                row.insert(f.name().clone(), v);
            }
            out.push(serde_json::Value::Object(row));
        }
    }
    out
}

/// The demo pack (Gemma 3 270M converted with `--tile auto --calibrate`, as scripts/demo.sh
/// makes it) at `…/mirror/FastFlowLM/Gemma3-270M-NPU2`, converted once per build of the binary
/// and shared by the test files that need it: the conversion is over a minute of the suite.
///
/// Kept under `CARGO_TARGET_TMPDIR`, keyed by the blake3 of the binary, the GGUF's path and the
/// calibration text; made in a temporary folder and renamed into place under a file lock, so
/// test binaries running at once convert it once and never see half a pack; the packs of earlier
/// builds are removed. The tests only read it (their stores live in their own temporary homes).
pub fn demo_pack() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    let calibration =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text/calibration.txt");
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(bin).expect("hash the binary");
    h.update(gemma_gguf().as_os_str().as_encoded_bytes());
    h.update(&std::fs::read(&calibration).expect("calibration text"));
    let key = h.finalize().to_hex();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-pack");
    std::fs::create_dir_all(&root).expect("demo-pack folder");
    let done = root.join(&key[..16]);
    let repo = |top: &Path| top.join("mirror/FastFlowLM/Gemma3-270M-NPU2");
    let lock = std::fs::File::create(root.join("lock")).expect("lock file");
    lock.lock().expect("lock");
    if !done.exists() {
        // A pack is half a gigabyte: the ones of earlier builds go.
        for old in std::fs::read_dir(&root)
            .expect("demo-pack folder")
            .flatten()
        {
            if old.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(old.path());
            }
        }
        let tmp = root.join(format!("{}.tmp-{}", &key[..16], std::process::id()));
        std::fs::create_dir_all(repo(&tmp).parent().expect("parent")).expect("mkdir");
        Command::new(bin)
            .env("ONEBIT_HOME", tmp.join("home"))
            .args(["-q", "convert", "--gguf"])
            .arg(gemma_gguf())
            .arg("--out")
            .arg(repo(&tmp))
            .args(["--tile", "auto", "--calibrate"])
            .arg(&calibration)
            .run_ok();
        let _ = std::fs::remove_dir_all(tmp.join("home"));
        std::fs::rename(&tmp, &done).expect("publish the demo pack");
    }
    repo(&done)
}

/// Chromium for the tests in a real browser: `$ONEBIT_CHROMIUM`, else the first of the usual
/// names on PATH.
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("ONEBIT_CHROMIUM") {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(dir) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .find(|d| d.join(name).is_file())
        {
            return dir.join(name);
        }
    }
    panic!("no chromium on PATH (apt-get install chromium, or set ONEBIT_CHROMIUM)");
}

/// Runs a command to completion and fails the test, with the command, its status and both
/// streams, unless it succeeded: the check every end-to-end test makes after a child process.
pub trait RunOk {
    /// The command's output, after asserting that it exited 0.
    fn run_ok(&mut self) -> std::process::Output;
}

impl RunOk for Command {
    fn run_ok(&mut self) -> std::process::Output {
        let out = self
            .output()
            .unwrap_or_else(|e| panic!("{self:?} did not start: {e}"));
        assert!(
            out.status.success(),
            "{self:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// Runs `tests/support/<script>` with python3 and `args`, asserts it succeeded (both outputs in
/// the message otherwise), and returns the JSON object it printed as its last stdout line.
#[allow(dead_code)]
pub fn python_json<A: AsRef<std::ffi::OsStr>>(script: &str, args: &[A]) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(script);
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .expect("python3");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{script}: {stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{script}: no JSON line ({e}): {stdout}"))
}
