//! What popular clients send beyond the basics, over HTTP: the sampling fields, `/tokenize`,
//! `/detokenize`, `/props`, `--lenient` and CORS.

use serde_json::{Value, json};

use super::{exchange, serve};

fn ids(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[test]
fn tokenize_detokenize_and_logit_bias_agree_on_token_ids() {
    let s = serve(&[]);
    let text = "the cat sat";
    let plain = s.post_ok("/tokenize", &json!({"content": text}));
    let toks = ids(&plain);
    assert!(!toks.is_empty(), "{plain}");
    // Pieces are the bytes of each token: together they spell the text.
    let pieces = s.post_ok("/tokenize", &json!({"content": text, "with_pieces": true}));
    let spelled: String = pieces["tokens"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["piece"].as_str())
                .collect::<String>()
        })
        .unwrap_or_default();
    assert_eq!(spelled, text, "{pieces}");
    let back = s.post_ok("/detokenize", &json!({"tokens": toks}));
    assert_eq!(back["content"], text);
    // A bias of +100 makes one token the answer, greedy or sampled.
    let t = toks[toks.len() - 1];
    let three = s.post_ok("/detokenize", &json!({"tokens": [t, t, t]}));
    for temperature in [0.0, 1.0] {
        let r = s.post_ok(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 3, "temperature": temperature, "seed": 5,
                    "logit_bias": {t.to_string(): 100}}),
        );
        assert_eq!(
            r["choices"][0]["text"], three["content"],
            "temperature {temperature}: {r}"
        );
    }
    // Every sampling field a client sends is read, and a bad one is named.
    s.post_ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1,
                "min_p": 0.1, "typical_p": 0.9, "presence_penalty": 0.5,
                "frequency_penalty": 0.5, "repeat_last_n": 16, "logit_bias": {}}),
    );
    for (body, param) in [
        (
            json!({"prompt": "a", "logit_bias": {"99999999": 1}}),
            "logit_bias.99999999",
        ),
        (json!({"prompt": "a", "min_p": 2}), "min_p"),
        (json!({"prompt": "a", "mirostat": 2}), "mirostat"),
    ] {
        let (st, e) = s.post("/v1/completions", &body);
        assert_eq!(
            (st, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{body}: {e}"
        );
    }
    for (path, body, param) in [
        ("/tokenize", json!({"content": 3}), "content"),
        ("/tokenize", json!({"text": "x"}), "text"),
        ("/detokenize", json!({"tokens": [99_999_999]}), "tokens[0]"),
    ] {
        let (st, e) = s.post(path, &body);
        assert_eq!(
            (st, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{path} {body}: {e}"
        );
    }
}

#[test]
fn props_name_the_context_template_verdict_and_kernel_path() {
    let s = serve(&["--ctx-size", "512", "--parallel", "2"]);
    let (st, b) = s.get("/props");
    assert_eq!(st, 200);
    let p: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 512, "{p}");
    assert_eq!(p["total_slots"], 2, "{p}");
    assert_eq!(p["verification"]["verified"], true, "{p}");
    assert!(
        p["chat_template"]
            .as_str()
            .is_some_and(|t| t.contains("im_start")),
        "{p}"
    );
    assert!(
        p["kernel_path"].as_str().is_some_and(|k| !k.is_empty()),
        "{p}"
    );
    assert!(
        p["backend"].as_str().is_some_and(|k| k.starts_with("host")),
        "{p}"
    );
}

#[test]
fn lenient_answers_with_a_warning_and_cors_answers_only_its_origins() {
    let s = serve(&["--lenient", "--cors-origin", "http://localhost:3000"]);
    let body = json!({"prompt": "a", "max_tokens": 2, "mirostat": 2, "tfs_z": 1}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nOrigin: http://localhost:3000\r\n",
        body.len()
    );
    let (st, headers, _) = exchange(s.addr, &head, body.as_bytes());
    let h = headers.to_ascii_lowercase();
    assert_eq!(st, 200, "{headers}");
    assert!(
        h.contains("warning: 299") && h.contains("mirostat") && h.contains("tfs_z"),
        "{headers}"
    );
    assert!(
        h.contains("access-control-allow-origin: http://localhost:3000"),
        "{headers}"
    );
    // A known field with a bad value is still refused under --lenient.
    let (st, e) = s.post("/v1/completions", &json!({"prompt": "a", "min_p": 7}));
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("min_p")));
    // The preflight is answered before the API key or the route is looked at.
    let pre = |origin: &str| {
        let head = format!(
            "OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n"
        );
        let (st, headers, _) = exchange(s.addr, &head, b"");
        (st, headers.to_ascii_lowercase())
    };
    let (st, h) = pre("http://localhost:3000");
    assert_eq!(st, 200, "{h}");
    assert!(
        h.contains("access-control-allow-origin: http://localhost:3000"),
        "{h}"
    );
    assert!(h.contains("x-stainless-os"), "{h}");
    let (_, h) = pre("http://evil.example");
    assert!(!h.contains("access-control-allow-origin"), "{h}");
    // Without --cors-origin no page of another origin may read the answers.
    let plain = serve(&[]);
    let body = json!({"prompt": "a", "max_tokens": 1}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nOrigin: http://localhost:3000\r\n",
        body.len()
    );
    let (st, headers, _) = exchange(plain.addr, &head, body.as_bytes());
    assert_eq!(st, 200, "{headers}");
    assert!(
        !headers
            .to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{headers}"
    );
}

#[test]
fn template_variables_reach_the_chat_template() {
    let s = super::serve_template(
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}\
         {% if enable_thinking is defined and not enable_thinking %}the cat sat on the mat\n{% endif %}",
        &[],
    );
    let ask = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
            o.extend(e);
        }
        s.post_ok("/v1/chat/completions", &b)["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    let plain = ask(json!({}));
    let off = ask(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    let effort = ask(json!({"reasoning_effort": "none"}));
    assert!(off > plain + 4, "{plain} → {off}");
    assert_eq!(
        effort, off,
        "reasoning_effort none is enable_thinking false"
    );
    assert_eq!(ask(json!({"reasoning_effort": "high"})), plain);
}
