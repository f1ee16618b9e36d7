//! A seeded fuzz of the request parser and the sampler: random bodies of every field the routes
//! read plus unknown ones, with values of every JSON type and edge (0, −1, 2⁶³, 1e−300, empty
//! strings and arrays, special-token text), and byte-level mutations of them. Every body must give
//! a parsed request or a 400 that names its field, never a panic; every parsed request's sampler
//! must be one that `SamplerConfig::check` accepts and that picks a token inside the vocabulary
//! from any finite or infinite logits.
//!
//! `ONEBIT_FUZZ_SEED` replays a run, `ONEBIT_FUZZ_CASES` sets its size (50,000 bodies by default,
//! a quarter of a second).

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use super::api::{self, ApiError, Parsed};
use super::values::{Fields, json_body};
use onebit_runtime::sample::Sampler;

/// A route's parser.
type Parse = fn(&Fields) -> Result<Parsed, ApiError>;

/// xorshift64*: the run is a function of its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Every field either route reads, and some no route reads (a misspelling, the empty name).
fn fields() -> Vec<&'static str> {
    let unknown = ["mirostat", "tfs_z", "max_token", ""];
    api::COMMON_FIELDS
        .iter()
        .chain(api::CHAT_FIELDS)
        .chain(api::COMPLETION_FIELDS)
        .chain(&unknown)
        .copied()
        .collect()
}

fn number(r: &mut Rng) -> Value {
    let edges = [
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(4),
        json!(i64::MIN),
        json!(i64::MAX),
        json!(u64::MAX),
        json!(9_223_372_036_854_775_808u64),
        json!(1e-300),
        json!(1e300),
        json!(-0.0),
        json!(0.5),
        json!(1.0),
        json!(2.000_001),
        json!(0.999_999_9),
        json!(1e-45),
    ];
    if r.below(3) == 0 {
        json!((r.next() as i64) >> r.below(64))
    } else {
        r.pick(&edges).clone()
    }
}

fn string(r: &mut Rng) -> String {
    let parts = [
        "",
        "a",
        " ",
        "\n",
        "<eos>",
        "<start_of_turn>",
        "\u{FFFD}",
        "é",
        "日本",
        "\u{0}",
        "\\",
        "\"",
        "user",
        "text",
        "auto",
        "none",
        "json_object",
        "\u{F0000}",
    ];
    (0..r.below(4)).map(|_| *r.pick(&parts)).collect()
}

fn value(r: &mut Rng, depth: usize) -> Value {
    match r.below(if depth > 2 { 4 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(r.below(2) == 0),
        2 => number(r),
        3 => Value::String(string(r)),
        4 => Value::Array((0..r.below(6)).map(|_| value(r, depth + 1)).collect()),
        5 => {
            let keys = [
                "type",
                "text",
                "include_usage",
                "role",
                "content",
                "x",
                "0",
                "7",
            ];
            Value::Object(
                (0..r.below(4))
                    .map(|_| (r.pick(&keys).to_string(), value(r, depth + 1)))
                    .collect(),
            )
        }
        _ => message(r),
    }
}

fn message(r: &mut Rng) -> Value {
    let roles = [
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
        "",
        "wizard",
    ];
    let mut m = Map::new();
    if r.below(8) != 0 {
        m.insert("role".into(), json!(r.pick(&roles)));
    }
    let content = match r.below(5) {
        0 => json!([{"type": "text", "text": string(r)}]),
        1 => value(r, 2),
        _ => Value::String(string(r)),
    };
    if r.below(8) != 0 {
        m.insert("content".into(), content);
    }
    Value::Object(m)
}

/// A body: mostly plausible values for the fields it names, sometimes anything at all.
fn body(r: &mut Rng, chat: bool, fields: &[&str]) -> Map<String, Value> {
    let mut b = Map::new();
    if r.below(10) != 0 {
        if chat {
            b.insert(
                "messages".into(),
                Value::Array((0..1 + r.below(3)).map(|_| message(r)).collect()),
            );
        } else {
            let prompt = match r.below(3) {
                0 => json!(
                    (0..1 + r.below(4))
                        .map(|_| r.next() % 70_000)
                        .collect::<Vec<_>>()
                ),
                _ => Value::String(string(r)),
            };
            b.insert("prompt".into(), prompt);
        }
    }
    for _ in 0..r.below(6) {
        let f = r.pick(fields).to_string();
        let v = match (f.as_str(), r.below(3)) {
            ("temperature" | "top_p" | "repetition_penalty" | "seed" | "top_k", 0 | 1) => number(r),
            ("stop", 0) => json!([string(r), string(r)]),
            _ => value(r, 0),
        };
        b.insert(f, v);
    }
    b
}

/// What must hold of one parse.
fn check(route: &str, b: &Map<String, Value>, got: Result<Parsed, ApiError>, r: &mut Rng) {
    let shown = Value::Object(b.clone());
    match got {
        Err(e) => {
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{route} {shown}: {e:?}");
            assert!(
                e.param
                    .as_deref()
                    .is_some_and(|p| !p.is_empty() || b.contains_key(""))
                    || e.code.is_some(),
                "{route} {shown}: a refusal must name its field: {e:?}"
            );
        }
        Ok(p) => {
            let s = &p.common.sampler;
            s.check()
                .unwrap_or_else(|e| panic!("{route} {shown}: parsed into a bad sampler: {e}"));
            assert!((0.0..=2.0).contains(&s.temperature), "{route} {shown}");
            assert!(p.common.stop.len() <= 4 && p.common.stop.iter().all(|s| !s.is_empty()));
            let mut sampler = Sampler::new(s.clone());
            for _ in 0..3 {
                let n = 1 + r.below(300);
                let mut logits: Vec<f32> = (0..n)
                    .map(|_| match r.below(20) {
                        0 => f32::INFINITY,
                        1 => f32::NEG_INFINITY,
                        2 => f32::MAX,
                        3 => -f32::MAX,
                        _ => (r.next() % 2000) as f32 / 100.0 - 10.0,
                    })
                    .collect();
                let seen: Vec<u32> = (0..r.below(8)).map(|_| r.below(n + 5) as u32).collect();
                let prompt = r.below(seen.len() + 1);
                let t = sampler.pick(&mut logits, &seen, prompt);
                assert!((t as usize) < n, "{route} {shown}: token {t} of {n}");
            }
        }
    }
}

#[test]
fn random_requests_parse_or_are_refused_by_name_and_sample_inside_the_vocabulary() {
    let seed = std::env::var("ONEBIT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0DDB_1A5E_5EED_u64);
    let cases: usize = std::env::var("ONEBIT_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000);
    eprintln!("fuzz seed {seed:#x}, {cases} cases (ONEBIT_FUZZ_SEED / ONEBIT_FUZZ_CASES)");
    let mut r = Rng(seed | 1);
    let fields = fields();
    let (mut parsed, mut refused) = (0usize, 0usize);
    for _ in 0..cases {
        let chat = r.below(2) == 0;
        let b = body(&mut r, chat, &fields);
        // The body as bytes, sometimes cut or with a byte changed: the JSON reader's turn.
        let mut bytes = serde_json::to_vec(&Value::Object(b.clone())).expect("serialize");
        match r.below(6) {
            0 if !bytes.is_empty() => bytes.truncate(r.below(bytes.len())),
            1 if !bytes.is_empty() => {
                let at = r.below(bytes.len());
                bytes[at] = r.next() as u8;
            }
            _ => {}
        }
        let body = match json_body(&bytes) {
            Ok(b) => b,
            Err(e) => {
                assert_eq!(e.code, Some("invalid_json"), "{e:?}");
                refused += 1;
                continue;
            }
        };
        let route = if chat { "chat" } else { "completions" };
        let (known, parse): (_, Parse) = if chat {
            (&api::CHAT, api::chat)
        } else {
            (&api::COMPLETION, api::completion)
        };
        let got = Fields::checked(body.clone(), known, false).and_then(|(f, _)| parse(&f));
        if got.is_ok() {
            parsed += 1;
        } else {
            refused += 1;
        }
        check(route, &body, got, &mut r);
    }
    eprintln!("parsed {parsed}, refused {refused}");
    // A fuzz that never reaches a parse (or never a refusal) tests one side only.
    assert!(
        parsed * 20 > cases && refused * 20 > cases,
        "parsed {parsed}, refused {refused} of {cases}"
    );
}
