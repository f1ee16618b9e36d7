//! Bounded JSON numbers. A schema's `integer` or `number` without bounds lets the grammar accept
//! digits without end, and a small model, once it starts a number, may write digits until its
//! token budget runs out (`"population": 1000000000000…`). llama.cpp's schema grammar bounds an
//! integer part to 16 digits; here an unbounded side of an integer or number is held to
//! ±(2⁵³ − 1), the largest integer a JSON reader that uses doubles keeps exactly (16 digits), and
//! a number's fraction to 8 digits, by a `multipleOf` of 10⁻⁸: the finest step the grammar
//! engine compiles (measured on llguidance 1.9: 10⁻⁹ and 10⁻¹⁰ overflow its regex library's
//! 32-bit arithmetic, and from 10⁻¹¹ on the step is not read exactly). A bounded number has no
//! exponent. A bound the schema sets itself is kept as it is, and so is its own `multipleOf`.

use serde_json::{Value, json};

/// The largest integer every JSON reader keeps exactly (2⁵³ − 1, JavaScript's
/// `Number.MAX_SAFE_INTEGER`): the bound of an integer part the schema leaves open.
pub const LARGEST: i64 = (1 << 53) - 1;

/// The step a number's fraction is held to: 8 digits after the decimal point.
pub const FRACTION_STEP: f64 = 1e-8;

fn numeric(t: &Value) -> (bool, bool) {
    let has = |name: &str| match t {
        Value::String(s) => s == name,
        Value::Array(a) => a.iter().any(|v| v == name),
        _ => false,
    };
    (has("integer"), has("number"))
}

/// Bounds every open integer and number of `schema` (and of every schema inside it), in place.
pub fn bound_numbers(schema: &mut Value) {
    super::walk::each_schema(schema, &mut |o| {
        let (integer, number) = o.get("type").map_or((false, false), numeric);
        if integer || number {
            if !o.contains_key("minimum") && !o.contains_key("exclusiveMinimum") {
                o.insert("minimum".into(), json!(-LARGEST));
            }
            if !o.contains_key("maximum") && !o.contains_key("exclusiveMaximum") {
                o.insert("maximum".into(), json!(LARGEST));
            }
            // An integer is a multiple of any power of ten below one: only a number's
            // fraction needs its digits bounded.
            if number && !integer && !o.contains_key("multipleOf") {
                o.insert("multipleOf".into(), json!(FRACTION_STEP));
            }
        }
    });
}

#[cfg(test)]
#[path = "numbers_tests.rs"]
mod tests;
