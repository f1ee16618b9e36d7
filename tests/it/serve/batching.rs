//! Continuous batching through the server: recurrent sequences (short convolution, gated
//! DeltaNet) keep their own state when they share batches, the served pack links its report, and
//! prompts longer than the batch answer as they do alone, for every mixer kind.

use super::*;

/// An LFM2 pack (the transformers oracle's Q4_0 GGUF, converted) under continuous batching:
/// completions sent all at once share forward batches, and each must be exactly its answer when
/// sent alone, so every sequence kept its own convolution state; a finished slot's state is
/// cleared for the next request (the solo answers run one after another in the same slots). The
/// chat request answers the oracle's greedy continuation (transformers on the same weights).
#[test]
fn lfm2_sequences_keep_their_own_convolution_state_under_continuous_batching() {
    recurrent_sequences_keep_their_own_state("lfm2");
}

/// The same for Qwen3.5: gated-DeltaNet layers (a convolution state and a delta-rule state per
/// sequence) beside gated attention.
#[test]
fn qwen35_sequences_keep_their_own_deltanet_state_under_continuous_batching() {
    recurrent_sequences_keep_their_own_state("qwen35");
}

fn recurrent_sequences_keep_their_own_state(case: &str) {
    let home = tempfile::tempdir().expect("tmp");
    let gguf = support::oracle(case).join("model-q4_0.gguf");
    let repo = home.path().join(case);
    onebit_convert::convert(&gguf, &repo, &onebit_convert::ConvertOptions::default())
        .expect("convert");
    let s = serve_repo(home, &repo, &gguf, &["--parallel", "4"]);
    let prompts = [
        "Tokyo is the capital",
        "Berlin",
        "Der Hund",
        "def f(x): return",
        "12 + 30 =",
        "La ville",
    ];
    let ask = |p: &str| {
        let (st, v) = s.post("/v1/completions", &completion(p, 24, false));
        assert_eq!(st, 200, "{v}");
        v["choices"][0]["text"].as_str().expect("text").to_string()
    };
    let passes = || s.metric("onebit_batch_rows_count");
    let p0 = passes();
    let alone: Vec<String> = prompts.iter().map(|p| ask(p)).collect();
    let p1 = passes();
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(move || ask(p))).collect();
        hs.into_iter().map(|h| h.join().expect("client")).collect()
    });
    let p2 = passes();
    assert_eq!(together, alone);
    // Sharing forward passes is what makes it continuous batching (one pass per token alone).
    assert!(
        p2 - p1 < p1 - p0,
        "{} passes together vs {} alone",
        p2 - p1,
        p1 - p0
    );
    assert!(
        alone
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1,
        "different prompts, different answers: {alone:?}"
    );
    let reference = support::oracle_reference(case);
    let greedy = &reference["greedy"]["q4_0"];
    let want = greedy["ids"].as_array().expect("ids").len();
    let (st, v) = s.post(
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": greedy["content"]}],
            "max_tokens": want,
            "temperature": 0,
        }),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(greedy["prompt_ids"].as_array().expect("prompt ids").len() as u64),
        "{v}"
    );
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        greedy["text"].as_str(),
        "{v}"
    );
    // The next turn resumes from the recurrent state the first one left (at least its prompt's
    // checkpoint), and answers as a fresh server does.
    let next = json!({
        "messages": [{"role": "user", "content": greedy["content"]},
            {"role": "assistant", "content": v["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And then?"}],
        "max_tokens": 8,
        "temperature": 0,
    });
    let (st, w) = s.post("/v1/chat/completions", &next);
    assert_eq!(st, 200, "{w}");
    let cached = w["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(
        cached >= v["usage"]["prompt_tokens"].as_u64(),
        "turn 2 reused {cached:?} tokens: {w}"
    );
    let home = tempfile::tempdir().expect("tmp");
    let fresh = serve_repo(home, &repo, &gguf, &[]);
    let (st, c) = fresh.post("/v1/chat/completions", &next);
    assert_eq!(st, 200, "{c}");
    assert_eq!(
        c["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{c}"
    );
    assert_eq!(c["choices"], w["choices"], "warm and cold answers");
}

#[test]
fn the_served_pack_has_its_verification_report_at_report_model() {
    let s = serve(&[]);
    let (_, body) = s.get("/v1/models");
    let models: Value = serde_json::from_slice(&body).expect("json");
    let id = models["data"][0]["id"].as_str().expect("id").to_string();
    let (st, page) = s.get(&format!("/report/{id}"));
    let page = String::from_utf8_lossy(&page);
    assert_eq!(st, 200, "{page}");
    assert!(page.starts_with("<!DOCTYPE html>"), "{page:.200}");
    assert!(
        page.contains("<h1>local/llama-q41</h1>"),
        "the pack's own report"
    );
    assert!(page.contains("<b>Verified</b>"));
    assert!(page.contains("<table id=\"agreement\">"));
    let (st, body) = s.get("/report/some-other-model");
    assert_eq!(st, 404, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("model_not_found"));
    assert!(s.metric("onebit_http_requests_total{route=\"/report/{id}\",status=\"200\"}") >= 1.0);
}

/// Prompts longer than `--batch` are prefilled in chunks, and a chunk cut before the prompt's end
/// needs no logits: the batch shape that once made every prompt of `--batch` tokens or more fail.
/// On a pack of each mixer kind (attention, short convolution, gated DeltaNet), seeded prompts of
/// 1 to 3 × `--batch` tokens (and, on the attention pack at the default `--batch` of 256, the
/// lengths of the original report) go in at once, streamed, whole and abandoned mid-stream; every
/// answer equals the same request's answer alone, and no forward pass panics.
#[test]
fn prompts_longer_than_the_batch_answer_as_alone_for_every_mixer_kind() {
    for (case, batch, fixed) in [
        ("llama", 256usize, &[201usize, 256, 257, 300, 600][..]),
        ("lfm2", 8, &[8, 9, 16][..]),
        ("qwen35", 8, &[8, 9, 16][..]),
    ] {
        let home = tempfile::tempdir().expect("tmp");
        let gguf = support::oracle(case).join("model-q4_0.gguf");
        let repo = home.path().join(case);
        onebit_convert::convert(&gguf, &repo, &onebit_convert::ConvertOptions::default())
            .expect("convert");
        let b = batch.to_string();
        let s = serve_repo(
            home,
            &repo,
            &gguf,
            &["--parallel", "3", "--batch", &b, "--ctx-size", "1024"],
        );
        // SplitMix64, seeded per case: the same prompts every run.
        let mut state = 0x37u64 ^ case.len() as u64;
        let mut rng = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut lengths: Vec<usize> = fixed.to_vec();
        lengths.extend((0..6).map(|_| 1 + (rng() % (3 * batch as u64)) as usize));
        let prompts: Vec<Vec<u32>> = lengths
            .iter()
            .map(|&n| (0..n).map(|_| 3 + (rng() % 300) as u32).collect())
            .collect();
        let body = |ids: &[u32], stream: bool| json!({"prompt": ids, "max_tokens": 6, "temperature": 0, "stream": stream});
        let alone: Vec<String> = prompts
            .iter()
            .map(|ids| {
                let (st, v) = s.post("/v1/completions", &body(ids, false));
                assert_eq!(st, 200, "{case}, {} prompt tokens alone: {v}", ids.len());
                v["choices"][0]["text"].as_str().expect("text").to_string()
            })
            .collect();
        let addr = s.addr;
        let together: Vec<Option<String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, ids)| {
                    let s = &s;
                    sc.spawn(move || match i % 3 {
                        0 => {
                            let (st, v) = s.post("/v1/completions", &body(ids, false));
                            assert_eq!(st, 200, "{case}, {} prompt tokens: {v}", ids.len());
                            Some(v["choices"][0]["text"].as_str().expect("text").to_string())
                        }
                        1 => {
                            let raw = body(ids, true).to_string();
                            let (st, out) = s.post_raw("/v1/completions", "", raw.as_bytes());
                            assert_eq!(st, 200, "{case}, {} prompt tokens streamed", ids.len());
                            let data = sse_data(&out);
                            assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
                            Some(
                                data[..data.len() - 1]
                                    .iter()
                                    .filter_map(|d| {
                                        let v: Value = serde_json::from_str(d).ok()?;
                                        v["choices"][0]["text"].as_str().map(str::to_string)
                                    })
                                    .collect(),
                            )
                        }
                        _ => {
                            // Sends the request, reads the first bytes of the stream, hangs up.
                            let raw = body(ids, true).to_string();
                            let mut c = TcpStream::connect(addr).expect("connect");
                            write!(
                                c,
                                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{raw}",
                                raw.len()
                            )
                            .expect("send");
                            let mut buf = [0u8; 64];
                            let _ = c.read(&mut buf);
                            None
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("client"))
                .collect()
        });
        for ((got, want), n) in together.iter().zip(&alone).zip(&lengths) {
            if let Some(got) = got {
                assert_eq!(got, want, "{case}: {n} prompt tokens together vs alone");
            }
        }
        let t0 = Instant::now();
        while s.metric("onebit_running_sequences") > 0.0 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{case}: slots not freed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(s.metric("onebit_model_panics_total"), 0.0, "{case}");
        assert_eq!(
            s.metric("onebit_generations_total{reason=\"error\""),
            0.0,
            "{case}"
        );
    }
}
