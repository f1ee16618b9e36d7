//! The tests of Ollama's request and reply shapes.
use serde_json::json;

use super::reply::{created_at, rfc3339};
use super::request::message;

/// The base64 of `bytes`.
fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn created_at_is_rfc3339_utc_with_nanoseconds() {
    let t = created_at();
    assert_eq!(t.len(), "2026-12-08T02:08:43.123456789Z".len(), "{t}");
    assert!(
        t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T',
        "{t}"
    );
}

#[test]
fn dates_are_civil_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_796_695_713), "2026-12-08T02:08:33Z");
}

#[test]
fn messages_become_openai_messages_with_image_parts_and_call_ids() {
    let m = json!({"role": "user", "content": "what is this?", "images": [b64(b"png")]});
    let v = message(0, &m).unwrap_or_else(|_| panic!("message"));
    assert_eq!(v["content"][0]["type"], "image_url");
    assert_eq!(
        v["content"][0]["image_url"]["url"],
        "data:image/png;base64,cG5n"
    );
    assert_eq!(v["content"][1]["text"], "what is this?");
    let m = json!({"role": "assistant", "content": "",
        "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Paris"}}}]});
    let v = message(3, &m).unwrap_or_else(|_| panic!("message"));
    assert_eq!(v["tool_calls"][0]["id"], "call_3_0");
    assert_eq!(
        v["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Paris\"}"
    );
    let bad = message(1, &json!({"role": "user", "content": "x", "mood": 1}));
    assert!(bad.is_err_and(|e| e.0.message.contains("mood")));
}
