//! Several choices per request (`n`), a thinking model's reasoning apart from its content, and
//! tool calls under a template that has no tool format of its own (the generic format).

use std::path::Path;

use serde_json::{Value, json};

use super::{serve, serve_template, sse_data};

fn texts(r: &Value) -> Vec<String> {
    r["choices"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| c["text"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn n_choices_read_the_prompt_once_and_follow_their_seeds() {
    let s = serve(&["--parallel", "3"]);
    let ask = |n: u32, seed: u64| {
        json!({"prompt": "the cat sat on the", "max_tokens": 8, "temperature": 1.0,
               "seed": seed, "n": n})
    };
    let prompt_read = || s.metric("onebit_prompt_tokens_total");
    let before = prompt_read();
    let three = s.post_ok("/v1/completions", &ask(3, 7));
    let read = prompt_read() - before;
    let prompt = three["usage"]["prompt_tokens"].as_f64().expect("usage");
    assert_eq!(read, prompt, "the prompt is read once for three choices");
    let idx: Vec<u64> = three["choices"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["index"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(idx, [0, 1, 2], "{three}");
    // The same seed gives the same choices; choice k is what seed + k gives alone.
    assert_eq!(
        texts(&s.post_ok("/v1/completions", &ask(3, 7))),
        texts(&three)
    );
    for k in 0..3u64 {
        let one = s.post_ok("/v1/completions", &ask(1, 7 + k));
        assert_eq!(texts(&one)[0], texts(&three)[k as usize], "choice {k}");
    }
    let distinct: std::collections::BTreeSet<String> = texts(&three).into_iter().collect();
    assert!(distinct.len() > 1, "sampled choices differ: {three}");
    // Streamed: each index's chunks spell that choice, each ends once, one [DONE].
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
        "temperature": 1.0, "seed": 3, "n": 2});
    let whole = s.post_ok("/v1/chat/completions", &chat);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (st, body) = s.post_raw("/v1/chat/completions", "", streamed.to_string().as_bytes());
    assert_eq!(st, 200);
    let data = sse_data(&body);
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let mut spelled = [String::new(), String::new()];
    let mut finished = [0, 0];
    for d in data.iter().filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).expect("chunk");
        for c in v["choices"].as_array().into_iter().flatten() {
            let k = c["index"].as_u64().expect("index") as usize;
            spelled[k].push_str(c["delta"]["content"].as_str().unwrap_or_default());
            finished[k] += usize::from(!c["finish_reason"].is_null());
        }
    }
    assert_eq!(finished, [1, 1], "{data:?}");
    for k in 0..2 {
        assert_eq!(
            whole["choices"][k]["message"]["content"].as_str(),
            Some(spelled[k].as_str()),
            "choice {k}"
        );
    }
    // More choices than slots is refused by name.
    let (st, e) = s.post("/v1/completions", &ask(4, 1));
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("n")), "{e}");
}

/// A template whose generation prompt opens a `<think>` block (Qwen 3.5's way).
const THINKING: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n\
    {% if m['role'] == 'assistant' %}<think>\n\n</think>\n\n{% endif %}{{ m['content'] }}<|im_end|>\n\
    {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

#[test]
fn reasoning_comes_back_apart_from_the_content_or_inline() {
    let split = serve_template(THINKING, &[]);
    let inline = serve_template(THINKING, &["--reasoning-format", "none"]);
    // The tiny model, once in a block, writes line breaks only: they are held off.
    let nl = split.post_ok("/tokenize", &json!({"content": "\n"}))["tokens"][0].clone();
    let ask = json!({"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 12,
        "temperature": 0, "logit_bias": {nl.to_string(): -100}});
    let a = split.post_ok("/v1/chat/completions", &ask);
    let b = inline.post_ok("/v1/chat/completions", &ask);
    let raw = b["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(
        b["choices"][0]["message"]["reasoning_content"].is_null(),
        "{b}"
    );
    assert!(!raw.trim().is_empty(), "the model wrote something: {b}");
    // The prompt opened the block and the tiny model never closes it: all of it is reasoning.
    let m = &a["choices"][0]["message"];
    assert_eq!(m["reasoning_content"].as_str(), Some(raw.trim()), "{a}");
    assert_eq!(m["content"].as_str(), Some(""), "{a}");
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let (_, body) = split.post_raw("/v1/chat/completions", "", streamed.to_string().as_bytes());
    let (mut reasoning, mut content) = (String::new(), String::new());
    for d in sse_data(&body).iter().filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).expect("chunk");
        let delta = &v["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        (raw.trim(), ""),
        "streamed"
    );
}

#[test]
fn gemma_templates_get_the_generic_tool_format() {
    let template = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates/gemma3.jinja"),
    )
    .expect("template");
    let s = serve_template(&template, &[]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"], "additionalProperties": false}}}]);
    let user = json!({"role": "user", "content": "Weather in Paris?"});
    let r = s.post_ok(
        "/v1/chat/completions",
        &json!({"messages": [user], "tools": tools, "tool_choice": "required",
                "max_tokens": 200, "temperature": 0}),
    );
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{r}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("args"))
        .expect("JSON arguments");
    assert!(
        args["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 8),
        "{args}"
    );
    // The call and its result go back; the template (no tool role) still renders them.
    let round = json!({"messages": [user, c["message"].clone(),
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"sky\": \"sunny\"}"}],
        "tools": tools, "max_tokens": 40, "temperature": 0});
    let r2 = s.post_ok("/v1/chat/completions", &round);
    let m = &r2["choices"][0]["message"];
    assert!(
        m["content"].is_string() || m["tool_calls"].is_array(),
        "an answer or calls: {r2}"
    );
    assert!(
        r2["usage"]["prompt_tokens"].as_u64() > r["usage"]["prompt_tokens"].as_u64(),
        "{r2}"
    );
}
