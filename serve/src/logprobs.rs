//! `logprobs` in OpenAI's two shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and the completions route's parallel lists (`tokens`, `token_logprobs`,
//! `top_logprobs` as an object per token, `text_offset`).

use serde_json::{Map, Value, json};

use onebit_runtime::logprobs::TokenLogprob;

fn token_text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A finite log-probability as JSON; a token of probability 0 (masked) as OpenAI's floor.
fn number(l: f32) -> Value {
    if l.is_finite() {
        json!(l)
    } else {
        json!(-9999.0)
    }
}

/// Chat's `logprobs` object for `entries`.
pub(super) fn chat(entries: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "token": token_text(&e.piece),
                "logprob": number(e.logprob),
                "bytes": e.piece,
                "top_logprobs": e.top.iter().map(|(_, p, l)| json!({
                    "token": token_text(p), "logprob": number(*l), "bytes": p,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions route's `logprobs` object for `entries`, whose text starts `offset` bytes
/// into the answer.
pub(super) fn completion(entries: &[TokenLogprob], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        offsets.push(at);
        at += e.piece.len();
    }
    json!({
        "tokens": entries.iter().map(|e| token_text(&e.piece)).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| number(e.logprob)).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| {
            let mut m = Map::new();
            for (_, p, l) in &e.top {
                m.entry(token_text(p)).or_insert_with(|| number(*l));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}
