//! `POST /v1/embeddings`: OpenAI's shapes, and the vectors against transformers' own final hidden
//! states (recovered from the oracles' reference logits, `tests/support/embed_ref.py`).

use crate::support::RunOk;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{Served, serve, serve_repo};
use crate::support::{oracle, oracle_ids, oracle_reference};

fn vector(v: &Value) -> Vec<f32> {
    v["embedding"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_f64)
                .map(|x| x as f32)
                .collect()
        })
        .unwrap_or_default()
}

fn embed(s: &Served, body: &Value) -> Value {
    s.post_ok("/v1/embeddings", body)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[test]
fn embeddings_answer_in_openai_shapes_one_or_many_float_or_base64() {
    let s = serve(&["--parallel", "2"]);
    let one = embed(&s, &json!({"input": "the cat sat"}));
    assert_eq!(one["object"], "list");
    let v = vector(&one["data"][0]);
    assert!(!v.is_empty(), "{one}");
    let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "L2-normalized: {norm}");
    assert!(one["usage"]["prompt_tokens"].as_u64() > Some(0), "{one}");
    // A list: each input as it is alone, in order, whatever else is in flight.
    let texts = ["the cat sat", "on the mat", "the dog", "a log"];
    let many = embed(&s, &json!({"input": texts}));
    let data = many["data"].as_array().expect("data");
    assert_eq!(data.len(), texts.len());
    for (i, (d, t)) in data.iter().zip(texts).enumerate() {
        assert_eq!(d["index"], i);
        let alone = vector(&embed(&s, &json!({"input": t}))["data"][0]);
        let got = vector(d);
        let diff = got
            .iter()
            .zip(&alone)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-6, "{t}: batched vs alone differ by {diff}");
    }
    assert!(
        cosine(&vector(&data[0]), &vector(&data[2])) < 0.9999,
        "texts differ"
    );
    // base64: the same f32 values, little-endian.
    let b = embed(
        &s,
        &json!({"input": "the cat sat", "encoding_format": "base64"}),
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().expect("base64 text"))
        .expect("base64");
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, v);
    // Token ids as input, and bad input named.
    let ids = s
        .post(
            "/tokenize",
            &json!({"content": "the cat sat", "add_special": true}),
        )
        .1;
    let by_ids = embed(&s, &json!({"input": ids["tokens"]}));
    assert_eq!(vector(&by_ids["data"][0]), v);
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [1, "a"]}), "input[0]"),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "x", "pooling": "max"}), "pooling"),
    ] {
        let (st, e) = s.post("/v1/embeddings", &body);
        assert_eq!(
            (st, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{body}: {e}"
        );
    }
    assert!(s.metric("onebit_generations_total{reason=\"embedding\"") >= 6.0);
}

/// The served vector of each oracle's ids against transformers' final hidden states, pooled the
/// same way: converted from the oracle's Q4_0 GGUF, imported and verified like any pack.
#[test]
#[ignore = "needs gguf-py and numpy (scripts/test.sh installs them)"]
fn embeddings_match_transformers_hidden_states_on_the_oracles() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/embed_ref.py");
    for case in ["llama", "gemma3", "qwen3"] {
        let reference = oracle_reference(case);
        let ids = oracle_ids(&reference);
        let gguf = oracle(case).join("model-q4_0.gguf");
        for pooling in ["mean", "last"] {
            let home = tempfile::tempdir().expect("tmp");
            let repo = home.path().join("repo");
            onebit_convert::convert(&gguf, &repo, &onebit_convert::ConvertOptions::default())
                .expect("convert");
            let s = serve_repo(home, &repo, &gguf, &["--pooling", pooling]);
            let ours = vector(&embed(&s, &json!({"input": ids}))["data"][0]);
            let out = Command::new("python3")
                .arg(&script)
                .arg(&gguf)
                .arg(oracle(case).join("reference.json"))
                .args(["q4_0", pooling])
                .run_ok();
            let want: Value = serde_json::from_slice(&out.stdout).expect("JSON");
            let residual = want["residual"].as_f64().expect("residual");
            assert!(
                residual < 1e-4,
                "{case}: the logits are the head's product ({residual})"
            );
            let want = vector(&want);
            let cos = cosine(&ours, &want);
            let max = ours
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!("{case} {pooling}: cosine {cos:.6}, max |diff| {max:.5}");
            assert!(cos > 0.999, "{case} {pooling}: cosine {cos}");
        }
    }
}
