//! An adversary that writes a digit whenever the grammar allows one (then a decimal point, then
//! an exponent) cannot run an open number past its bound, and without the bound it can.

use serde_json::{Value, json};

use super::{FRACTION_STEP, LARGEST, bound_numbers};
use crate::grammar::{Grammars, Spec};
use crate::text::Text;

fn text() -> Text {
    let tok = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/q4nx/llama-q41/tokenizer.json");
    Text::load(&tok, None).expect("tokenizer")
}

/// SplitMix64.
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Walks `spec`'s grammar preferring digits, then `.`, then `e`; returns the text and whether
/// the grammar ended before `cap` tokens.
fn longest_numbers(spec: &Spec, seed: u64, cap: usize) -> (String, bool) {
    let text = text();
    let vocab = 384;
    let eos = 1;
    let grammars = Grammars::new(vocab, &[eos]);
    let mut c = grammars
        .compile(&text, spec, "response_format")
        .expect("compile");
    let pieces: Vec<String> = (0..vocab as u32)
        .map(|t| text.decode_keeping_special(&[t]).unwrap_or_default())
        .collect();
    let mut seed = seed;
    let mut ids = Vec::new();
    while !c.is_finished() && ids.len() < cap {
        let allowed = c.allowed().expect("mask");
        let ok: Vec<u32> = (0..vocab as u32)
            .filter(|&t| allowed[t as usize / 32] >> (t % 32) & 1 == 1)
            .collect();
        assert!(!ok.is_empty(), "no token allowed after {ids:?}");
        let prefer = |f: &dyn Fn(&str) -> bool| -> Vec<u32> {
            ok.iter()
                .copied()
                .filter(|&t| !pieces[t as usize].is_empty() && f(&pieces[t as usize]))
                .collect()
        };
        let digits = prefer(&|p| p.bytes().all(|b| b.is_ascii_digit()));
        let point = prefer(&|p| p == ".");
        let exp = prefer(&|p| p == "e" || p == "E");
        let pool = [digits, point, exp]
            .into_iter()
            .find(|v| !v.is_empty())
            .unwrap_or(ok);
        let t = pool[(next(&mut seed) % pool.len() as u64) as usize];
        if t == eos {
            return (text.decode_keeping_special(&ids).expect("decode"), true);
        }
        c.accept(t).expect("accept");
        ids.push(t);
    }
    (
        text.decode_keeping_special(&ids).expect("decode"),
        c.is_finished(),
    )
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "population": {"type": "integer"},
        "ratio": {"type": "number"},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "enum": {"type": ["number", "null"]}},
        "required": ["population", "ratio", "year", "enum"], "additionalProperties": false})
}

#[test]
fn open_numbers_stop_at_sixteen_digits_and_bounds_the_schema_sets_are_kept() {
    for seed in 0..8 {
        let (out, ended) = longest_numbers(&Spec::JsonSchema(schema()), seed, 400);
        assert!(ended, "seed {seed}: ran to the cap: {out}");
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
        let p = v["population"].as_i64().expect("integer");
        assert!(p.abs() <= LARGEST, "{out}");
        let y = v["year"].as_i64().expect("year");
        assert!((1900..=2100).contains(&y), "{out}");
        for f in ["ratio", "enum"] {
            let raw = out
                .split(&format!("\"{f}\": "))
                .nth(1)
                .and_then(|r| r.split([',', '}']).next())
                .unwrap_or_default();
            let (int, frac) = raw.split_once('.').unwrap_or((raw, ""));
            let int_digits = int.trim_start_matches('-').len();
            assert!(
                int_digits <= 16 && frac.len() <= 8 && !raw.contains(['e', 'E']),
                "{f} = {raw} in {out}"
            );
        }
    }
}

#[test]
fn without_the_bound_the_same_walk_writes_digits_until_the_budget() {
    let spec = Spec::Lark(format!(
        "start: %json {}",
        json!({"type": "object", "properties": {"population": {"type": "integer"}},
               "required": ["population"], "x-guidance": crate::grammar::json_layout()})
    ));
    let (out, ended) = longest_numbers(&spec, 0, 200);
    assert!(!ended && out.len() > 150, "{out}");
}

#[test]
fn bounds_go_only_where_the_schema_leaves_them_open() {
    let mut s = json!({"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0},
        "b": {"type": "number", "multipleOf": 0.5},
        "enum": {"type": "integer"},
        "c": {"enum": [{"type": "integer"}]}},
        "$defs": {"d": {"type": ["integer", "null"], "exclusiveMaximum": 10}}});
    bound_numbers(&mut s);
    let p = &s["properties"];
    assert_eq!(p["a"]["minimum"], 0);
    assert_eq!(p["a"]["maximum"], LARGEST);
    assert_eq!(p["b"]["multipleOf"], 0.5);
    assert_eq!(p["b"]["minimum"], -LARGEST);
    assert_eq!(
        p["enum"]["maximum"], LARGEST,
        "a property named 'enum' is a schema"
    );
    assert_eq!(
        p["c"]["enum"][0],
        json!({"type": "integer"}),
        "data is left alone"
    );
    let d = &s["$defs"]["d"];
    assert_eq!((d.get("maximum"), &d["minimum"]), (None, &json!(-LARGEST)));
    assert!(
        d.get("multipleOf").is_none(),
        "integers need no fraction step"
    );
    let _ = FRACTION_STEP;
}
