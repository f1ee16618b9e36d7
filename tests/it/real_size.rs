//! The smallest real-size config of each family `convert` accepts, end to end: a random-weight
//! Q4_0 GGUF at the config's exact dimensions (`scripts/random-gguf.py`, llama.cpp's metadata and
//! tensor names), `convert`, an import through every stage verified against the same GGUF,
//! `generate` 32 tokens, and one `serve` request. The whole matrix up to 4 B parameters, with its
//! timings and memory, is the benchmark `scripts/bench-real-size.py` (docs/benchmarks.md).
//!
//! Needs python3 with numpy and gguf-py (scripts/test.sh installs them), hence `#[ignore]`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn onebit(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    c.env("ONEBIT_HOME", home).env("HF_HUB_OFFLINE", "1");
    c
}

fn ok(c: &mut Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Generates, converts, imports, generates from and serves `config`; `vocab` is its vocabulary.
fn end_to_end(config: &str, vocab: usize) {
    let tmp = tempfile::tempdir().expect("tmp");
    let (gguf, repo, home) = (
        tmp.path().join("model.gguf"),
        tmp.path().join("repo"),
        tmp.path().join("home"),
    );
    ok(
        Command::new("python3")
            .arg(root().join("scripts/random-gguf.py"))
            .arg(root().join("tests/fixtures/configs").join(config))
            .arg("--out")
            .arg(&gguf),
        "random-gguf.py",
    );
    ok(
        onebit(&home)
            .args(["-q", "convert", "--gguf"])
            .arg(&gguf)
            .arg("--out")
            .arg(&repo),
        "convert",
    );
    let src = |c: &mut Command| {
        c.arg("--path").arg(&repo).arg("--reference").arg(&gguf);
    };
    let mut run = onebit(&home);
    run.args(["-q", "--json", "run"]);
    src(&mut run);
    let out = ok(&mut run, "import");
    let verdict = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "verdict")
        .unwrap_or(Value::Null);
    assert_eq!(
        verdict["verdict"]["verified"], true,
        "{config}: not verified: {verdict}"
    );
    let mut generate = onebit(&home);
    generate.args(["-q", "--json", "generate"]);
    src(&mut generate);
    generate.args([
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "32",
        "--ctx-size",
        "256",
    ]);
    let g: Value = serde_json::from_str(
        ok(&mut generate, "generate")
            .lines()
            .last()
            .expect("a line"),
    )
    .expect("json");
    let tokens = g["tokens"].as_array().expect("tokens");
    assert!(!tokens.is_empty(), "{config}: {g}");
    assert!(
        tokens
            .iter()
            .all(|t| t.as_u64().is_some_and(|t| (t as usize) < vocab)),
        "{config}: a token outside the config's {vocab}-token vocabulary: {g}"
    );
    let mut serve = onebit(&home);
    serve.args([
        "serve",
        "--port",
        "0",
        "--parallel",
        "2",
        "--ctx-size",
        "512",
    ]);
    src(&mut serve);
    let (mut child, addr) = support::spawn_server(serve);
    let t0 = Instant::now();
    let answer = loop {
        let health = ureq_get(addr, "/health");
        if health == 200 {
            break ureq_post(
                addr,
                "/v1/completions",
                r#"{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}"#,
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "{config}: not ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    let v: Value = serde_json::from_str(&answer).expect("json answer");
    assert!(
        v["choices"][0]["finish_reason"].is_string(),
        "{config}: {answer}"
    );
}

/// Status of a plain HTTP GET.
fn ureq_get(addr: std::net::SocketAddr, path: &str) -> u16 {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .0
}

/// Body of a JSON POST.
fn ureq_post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    let (status, body) = http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(status, 200, "{body}");
    body
}

fn http(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(300)));
    let _ = c.write_all(request.as_bytes());
    let mut raw = String::new();
    let _ = c.read_to_string(&mut raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[test]
#[ignore = "needs python3 with numpy and gguf-py (scripts/test.sh installs them)"]
fn smollm2_135m_at_real_size() {
    end_to_end("smollm2/SmolLM2-135M-Instruct-partial", 49_152);
}

#[test]
#[ignore = "needs python3 with numpy and gguf-py (scripts/test.sh installs them)"]
fn gemma3_270m_at_real_size() {
    end_to_end("gemma3/gemma-3-270m-it", 262_144);
}

#[test]
#[ignore = "needs python3 with numpy and gguf-py (scripts/test.sh installs them)"]
fn lfm2_450m_at_real_size() {
    end_to_end("lfm2/LFM2-VL-450M", 65_536);
}

#[test]
#[ignore = "needs python3 with numpy and gguf-py (scripts/test.sh installs them)"]
fn qwen2_5_0_5b_at_real_size() {
    end_to_end("qwen/Qwen2.5-0.5B-Instruct-resaved-partial", 151_936);
}

#[test]
#[ignore = "needs python3 with numpy and gguf-py (scripts/test.sh installs them)"]
fn qwen3_0_6b_at_real_size() {
    end_to_end("qwen/Qwen3-0.6B", 151_936);
}

/// Hunyuan's real vocabulary, 120,818 tokens: off the 32-row tile, padded with zero rows.
#[test]
#[ignore = "needs python3 with numpy and gguf-py (scripts/test.sh installs them)"]
fn hunyuan_0_5b_at_real_size() {
    end_to_end("hunyuan/Hunyuan-0.5B-Pretrain", 120_818);
}
