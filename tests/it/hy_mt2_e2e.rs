//! The headline command end to end on the Hunyuan oracle: its Q4_0 GGUF converted into a
//! `FastFlowLM/Hy-MT2-1.8B-NPU2`-shaped repository, served by a local hub server,
//! `onebit-pipe run --repo FastFlowLM/Hy-MT2-1.8B-NPU2 --endpoint <hub>` (fetch, semantics,
//! detect Q40_4608, dequant, verify against the GGUF, repack, kernels), `onebit-pipe eval` on the
//! oracle's ids, then `onebit-pipe serve`
//! answering a translation request through `/v1/chat/completions` with the official `openai`
//! client. The answer must be the oracle's greedy continuation of the same request (transformers
//! on the GGUF's dequantized weights; every step's top-2 margin clears int8-activation noise).

use crate::hub_server;
use crate::support;
use crate::support::RunOk;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hub_server::HubServer;
use serde_json::Value;
use support::{oracle, oracle_ids, oracle_logits, oracle_reference};

const REPO: &str = "FastFlowLM/Hy-MT2-1.8B-NPU2";
/// The oracle served as that repository.
const CASE: &str = "hunyuan-alpha";

/// Every file of a converted repository, as the hub serves it.
fn repo_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read repo")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&p).expect("read file"),
            )
        })
        .collect()
}

fn onebit(home: &Path, hf: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    c.env("ONEBIT_HOME", home)
        .env("HF_HOME", hf)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    c
}

#[test]
#[ignore = "needs the openai Python client (scripts/test.sh installs it)"]
fn hy_mt2_is_fetched_verified_and_answers_a_translation_through_the_openai_client() {
    let tmp = tempfile::tempdir().expect("tmp");
    let gguf = oracle(CASE).join("model-q4_0.gguf");
    let repo = tmp.path().join("Hy-MT2-1.8B-NPU2");
    onebit_convert::convert(&gguf, &repo, &onebit_convert::ConvertOptions::default())
        .expect("convert");
    let (server, _commit) = HubServer::start(REPO, repo_files(&repo));
    let (home, hf) = (tmp.path().join("home"), tmp.path().join("hf"));

    let out = onebit(&home, &hf)
        .args([
            "run",
            "--repo",
            REPO,
            "--endpoint",
            &server.url,
            "--reference",
        ])
        .arg(&gguf)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains(&format!("{REPO}: verified")),
        "{stdout}\n{stderr}"
    );
    let sql = onebit(&home, &hf)
        .args([
            "sql",
            "SELECT DISTINCT kind FROM tensors WHERE kind LIKE 'Q%' ORDER BY kind",
        ])
        .output()
        .expect("sql");
    let kinds = String::from_utf8_lossy(&sql.stdout);
    assert!(kinds.contains("Q40_4608"), "{kinds}");
    assert!(!kinds.contains("Q41"), "{kinds}");

    let reference = oracle_reference(CASE);
    check_eval(&home, &hf, &server.url, &gguf, &reference);

    let mut cmd = onebit(&home, &hf);
    cmd.args([
        "-q",
        "serve",
        "--port",
        "0",
        "--repo",
        REPO,
        "--endpoint",
        &server.url,
    ])
    .arg("--reference")
    .arg(&gguf);
    let (mut child, addr) = support::spawn_server(cmd);
    let base = format!("http://{addr}/v1");
    let t0 = Instant::now();
    let probe = format!(
        "import openai,sys\ntry:\n openai.OpenAI(base_url='{base}',api_key='none',max_retries=0).models.list()\nexcept Exception:\n sys.exit(1)"
    );
    while !Command::new("python3")
        .args(["-c", &probe])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "not ready in 120 s"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let want = &reference["greedy"]["q4_0"];
    let steps = want["ids"].as_array().expect("ids").len();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/translate_e2e.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            &base,
            REPO,
            want["content"].as_str().expect("content"),
            &steps.to_string(),
        ])
        .output()
        .expect("python3");
    let _ = child.kill();
    let _ = child.wait();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("translation e2e: {said}");
    let got: Value = serde_json::from_str(said.trim()).expect("one JSON line");
    // The server renders the same prompt the oracle did (template + tokenizer), token for token.
    assert_eq!(
        got["prompt_tokens"].as_u64(),
        Some(want["prompt_ids"].as_array().expect("prompt ids").len() as u64),
        "{got}"
    );
    assert_eq!(
        got["completion_tokens"].as_u64(),
        Some(steps as u64),
        "{got}"
    );
    assert_eq!(got["content"], want["text"], "{got}");
}

/// `eval` on the oracle's ids: perplexity of the scored positions (llama.cpp chunking scores the
/// second half) within 1 % of the oracle's, argmax equal wherever the oracle's margin is clear.
fn check_eval(home: &Path, hf: &Path, url: &str, gguf: &Path, reference: &Value) {
    let ids_json = reference["ids"].to_string();
    let out = onebit(home, hf)
        .args(["-q", "--json", "eval", "--repo", REPO, "--endpoint", url])
        .args(["--ids", &ids_json, "--reference"])
        .arg(gguf)
        .run_ok();
    let eval: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("perplexity").is_some())
        .expect("eval result");
    let logits = oracle_logits(reference, "q4_0");
    let ids = oracle_ids(reference);
    let scored = eval["scored"].as_u64().expect("scored") as usize;
    let n = ids.len() - 1;
    let nll: f64 = (n - scored..n)
        .map(|i| {
            let row: Vec<f64> = logits[i].iter().map(|&x| f64::from(x)).collect();
            let max = row.iter().copied().fold(f64::MIN, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            lse - row[ids[i + 1] as usize]
        })
        .sum::<f64>()
        / scored as f64;
    let (ours, theirs) = (eval["perplexity"].as_f64().expect("ppl"), nll.exp());
    eprintln!("eval: perplexity {ours:.3} vs oracle {theirs:.3} over {scored} positions");
    assert!((ours / theirs - 1.0).abs() < 0.01, "{ours} vs {theirs}");
    let argmax = eval["argmax"].as_array().expect("argmax");
    for (i, row) in logits.iter().take(argmax.len()).enumerate() {
        let mut sorted = row.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let top = row.iter().position(|&x| x == sorted[0]).expect("top");
        if sorted[0] - sorted[1] > 0.05 {
            assert_eq!(argmax[i].as_u64(), Some(top as u64), "position {i}");
        }
    }
}
