//! `logprobs` against `eval`: the log-probability the server reports for each greedy token is
//! the one `onebit-pipe eval --ids` scores for the same token after the same ids, and the
//! streamed numbers are the whole reply's.

use crate::support::RunOk;
use std::process::Command;

use serde_json::{Value, json};

use super::{Served, fixture, serve, sse_data};

/// `eval --ids` on the served repository: each id's log-probability after the ones before it,
/// and the most likely next token.
fn eval(s: &Served, ids: &[u64]) -> (Vec<f64>, u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"))
        .env("ONEBIT_HOME", s._home.path().join("home"))
        .env("HF_HUB_OFFLINE", "1")
        .args(["-q", "eval", "--path"])
        .arg(s._home.path().join("llama-q41"))
        .arg("--reference")
        .arg(fixture("llama-q41/model.gguf"))
        .args(["--ids", &json!(ids).to_string(), "-t", "1"])
        .run_ok();
    let v: Value = serde_json::from_slice(&out.stdout).expect("eval json");
    let lps = v["token_logprobs"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    (lps, v["next_argmax"].as_u64().expect("next_argmax"))
}

#[test]
fn greedy_logprobs_are_evals_scores_whole_and_streamed() {
    let s = serve(&[]);
    let (_, t) = s.post("/tokenize", &json!({"content": "the cat sat on"}));
    let prompt: Vec<u64> = t["tokens"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let body = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2});
    let (st, r) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{r}");
    let lp = &r["choices"][0]["logprobs"];
    let got: Vec<f64> = lp["token_logprobs"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    assert_eq!(got.len(), 3, "{r}");
    // Greedy: eval's most likely next token continues the ids, and eval scores it as served.
    let mut ids = prompt.clone();
    for _ in 0..3 {
        let (_, next) = eval(&s, &ids);
        ids.push(next);
    }
    let (scores, _) = eval(&s, &ids);
    for (i, want_lp) in got.iter().enumerate() {
        let (_, d) = s.post("/detokenize", &json!({"tokens": [ids[prompt.len() + i]]}));
        assert_eq!(lp["tokens"][i], d["content"], "token {i}: {r}");
        let eval_lp = scores[prompt.len() + i - 1];
        assert!(
            (eval_lp - want_lp).abs() < 2e-3,
            "token {i}: served {want_lp}, eval {eval_lp}"
        );
        // The chosen token is the best alternative, with the same number.
        let top = lp["top_logprobs"][i].as_object().expect("top");
        assert_eq!(top.len(), 2, "{r}");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::NEG_INFINITY, f64::max);
        assert!((best - want_lp).abs() < 1e-6, "{r}");
    }
    let text = r["choices"][0]["text"].as_str().unwrap_or_default();
    let offsets = &lp["text_offset"];
    assert_eq!(offsets[0], 0, "{r}");
    assert!(text.len() >= offsets[2].as_u64().unwrap_or(0) as usize);

    // Chat, whole and streamed: the same tokens with the same numbers.
    let chat = json!({"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 5,
                      "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let (st, whole) = s.post("/v1/chat/completions", &chat);
    assert_eq!(st, 200, "{whole}");
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!content.is_empty(), "{whole}");
    for c in &content {
        assert_eq!(c["top_logprobs"].as_array().map(Vec::len), Some(3), "{c}");
        let bytes: Vec<u8> = c["bytes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|b| b.as_u64().map(|b| b as u8))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            c["token"].as_str().unwrap_or("?")
        );
    }
    let mut stream = chat.clone();
    stream["stream"] = json!(true);
    let (st, b) = s.post_raw("/v1/chat/completions", "", stream.to_string().as_bytes());
    assert_eq!(st, 200);
    let streamed: Vec<Value> = sse_data(&b)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed, content);
    // Without the flag there are none, and a bad count is named.
    let (_, plain) = s.post("/v1/completions", &json!({"prompt": "a", "max_tokens": 1}));
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
    ] {
        let (st, e) = s.post(path, &body);
        assert_eq!(
            (st, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{e}"
        );
    }
}
