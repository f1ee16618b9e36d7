//! Every format's forced-call grammar compiles in the grammar engine, and every answer it lets
//! through reads back as calls to the offered functions with arguments of their schemas: seeded
//! random walks through the grammar (any allowed token, uniformly) over a real byte-level BPE
//! vocabulary.

use serde_json::{Value, json};

use super::{Format, Tool, forced_grammar, parse_calls};
use onebit_runtime::grammar::{Grammars, Spec};
use onebit_runtime::text::Text;

fn text() -> Text {
    let tok = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/q4nx/llama-q41/tokenizer.json");
    Text::load(&tok, None).expect("tokenizer")
}

fn tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"}},
                "required": ["city", "days"], "additionalProperties": false}),
        },
        Tool {
            name: "stop".into(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
    ]
}

/// Checks `args` against the test tools' schemas.
fn valid(name: &str, args: &Value) -> bool {
    let o = match args.as_object() {
        Some(o) => o,
        None => return false,
    };
    match name {
        "get_weather" => {
            o.keys()
                .all(|k| ["city", "days", "metric"].contains(&k.as_str()))
                && o["city"].as_str().is_some_and(|c| c.chars().count() <= 6)
                && o["days"].as_i64().is_some_and(|d| (1..=7).contains(&d))
                && o.get("metric").is_none_or(Value::is_boolean)
        }
        "stop" => o.is_empty(),
        _ => false,
    }
}

/// SplitMix64.
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn every_forced_answer_reads_back_as_valid_calls_in_every_format() {
    let text = text();
    let vocab = 384;
    let grammars = Grammars::new(vocab, &[1]);
    let formats = [
        Format::Hermes,
        Format::QwenXml,
        Format::Hunyuan,
        Format::Lfm2,
        Format::Llama3,
        Format::Mistral,
        Format::Generic,
    ];
    for format in formats {
        for parallel in [false, true] {
            let spec = Spec::Lark(forced_grammar(format, &tools(), parallel));
            let walks = walk(&text, &grammars, vocab, &spec, format as u64, parallel);
            for (walk, out) in walks.into_iter().enumerate() {
                let read = parse_calls(format, &out, &tools());
                let what = format!("{format:?} (parallel {parallel}, walk {walk}): {out:?}");
                assert!(!read.calls.is_empty(), "{what}: no call read");
                assert!(parallel || read.calls.len() == 1, "{what}: one call");
                assert!(read.content.is_empty(), "{what}: text outside the calls");
                for call in &read.calls {
                    let args: Value = serde_json::from_str(&call.arguments).expect("JSON");
                    assert!(valid(&call.name, &args), "{what}: {call:?}");
                }
            }
        }
    }
}

/// A generic answer with `tool_choice: auto` is a valid call or a `response`, and both come up.
#[test]
fn every_generic_auto_answer_is_a_valid_call_or_a_response() {
    let text = text();
    let vocab = 384;
    let grammars = Grammars::new(vocab, &[1]);
    let spec = Spec::Lark(super::generic::grammar(&tools(), false, true));
    let (mut calls, mut responses) = (0, 0);
    for out in walk(&text, &grammars, vocab, &spec, 99, true) {
        let read = parse_calls(Format::Generic, &out, &tools());
        if read.calls.is_empty() {
            let v: Value = serde_json::from_str(&out).expect("JSON");
            assert_eq!(v["response"].as_str(), Some(read.content.as_str()), "{out}");
            responses += 1;
        } else {
            for call in &read.calls {
                let args: Value = serde_json::from_str(&call.arguments).expect("JSON");
                assert!(valid(&call.name, &args), "{out}: {call:?}");
            }
            calls += 1;
        }
    }
    assert!(
        calls > 0 && responses > 0,
        "{calls} calls, {responses} responses"
    );
}

/// Twelve seeded random walks through `spec`'s grammar, each as the text it spells.
fn walk(
    text: &Text,
    grammars: &Grammars,
    vocab: usize,
    spec: &Spec,
    salt: u64,
    parallel: bool,
) -> Vec<String> {
    let mut outs = Vec::new();
    let c = grammars
        .compile(text, spec, "tool_choice")
        .unwrap_or_else(|e| panic!("{e}\n{spec:?}"));
    for walk in 0..12u64 {
        let mut c = c.clone();
        let mut seed = walk ^ salt << 8 ^ u64::from(parallel) << 16;
        let mut ids = Vec::new();
        while !c.is_finished() && ids.len() < 3000 {
            let allowed = c.allowed().expect("mask");
            let ok: Vec<u32> = (0..vocab as u32)
                .filter(|&t| {
                    allowed
                        .get(t as usize / 32)
                        .is_some_and(|w| w >> (t % 32) & 1 == 1)
                })
                .collect();
            assert!(!ok.is_empty(), "no token allowed after {ids:?}");
            let t = ok[(next(&mut seed) % ok.len() as u64) as usize];
            if t == 1 {
                break; // end of sequence: the grammar was complete
            }
            c.accept(t).expect("accept");
            ids.push(t);
        }
        let out = text.decode_keeping_special(&ids).expect("decode");
        assert_eq!(c.error(), None, "the engine stopped on an error");
        outs.push(out);
    }
    outs
}
