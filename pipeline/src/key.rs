//! Cache keys: what a stage's output depends on, hashed with a canonical encoding.
//!
//! | goes into the key | does not |
//! |---|---|
//! | the stage name | paths of the store or of inputs |
//! | the stage `VERSION` (bumped when its output bytes change) | wall-clock time |
//! | the canonical params (JSON, object keys sorted, no whitespace) | thread count, `--jobs` |
//! | each input's name and the digest of its artifact content | the order inputs are declared in |
//!
//! Every field is length-prefixed, so no two different tuples encode to the same bytes. The
//! encoding never depends on `std::hash::Hash` or on map iteration order, so keys are stable across
//! versions of Rust, platforms and runs.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::digest::Digest;

/// The domain string that starts every key; bumping it invalidates every store entry.
pub const KEY_DOMAIN: &str = "onebit-pipe/stage-key/v1";

/// Builds a key from length-prefixed fields.
pub struct KeyHasher(blake3::Hasher);

impl KeyHasher {
    /// A hasher for `domain`.
    pub fn new(domain: &str) -> Self {
        let mut h = KeyHasher(blake3::Hasher::new());
        h.field(b"domain", domain.as_bytes());
        h
    }

    /// Adds one tagged field.
    pub fn field(&mut self, tag: &[u8], bytes: &[u8]) {
        self.0.update(&(tag.len() as u64).to_le_bytes());
        self.0.update(tag);
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// The digest of every field added.
    pub fn finish(self) -> Digest {
        Digest(*self.0.finalize().as_bytes())
    }
}

/// Canonical JSON: object keys sorted, no whitespace. Two equal values always encode the same.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The digest of canonical params, recorded to tell a params change from other causes.
pub fn params_digest(params: &Value) -> Digest {
    Digest::of_bytes(canonical_json(params).as_bytes())
}

/// The cache key of a stage run: see the module table for what goes in.
pub fn stage_key(
    stage: &str,
    version: u32,
    params: &Value,
    inputs: &BTreeMap<String, Digest>,
) -> Digest {
    let mut h = KeyHasher::new(KEY_DOMAIN);
    h.field(b"stage", stage.as_bytes());
    h.field(b"version", &version.to_le_bytes());
    h.field(b"params", canonical_json(params).as_bytes());
    h.field(b"inputs", &(inputs.len() as u64).to_le_bytes());
    for (name, digest) in inputs {
        h.field(b"input", name.as_bytes());
        h.field(b"digest", &digest.0);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"z": [1, {"y": 2, "x": 3}], "c": null}});
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"c":null,"z":[1,{"x":3,"y":2}]},"b":1}"#
        );
    }

    #[test]
    fn key_changes_with_every_field() {
        let mut inputs = BTreeMap::new();
        inputs.insert("x".to_string(), Digest::of_bytes(b"1"));
        let base = stage_key("s", 1, &json!({"p": 1}), &inputs);
        assert_ne!(base, stage_key("t", 1, &json!({"p": 1}), &inputs));
        assert_ne!(base, stage_key("s", 2, &json!({"p": 1}), &inputs));
        assert_ne!(base, stage_key("s", 1, &json!({"p": 2}), &inputs));
        let mut other = inputs.clone();
        other.insert("x".to_string(), Digest::of_bytes(b"2"));
        assert_ne!(base, stage_key("s", 1, &json!({"p": 1}), &other));
        assert_eq!(base, stage_key("s", 1, &json!({"p": 1}), &inputs));
    }

    #[test]
    fn fields_are_length_prefixed() {
        // "ab" + "c" must not collide with "a" + "bc".
        let mut h1 = KeyHasher::new("d");
        h1.field(b"ab", b"c");
        let mut h2 = KeyHasher::new("d");
        h2.field(b"a", b"bc");
        assert_ne!(h1.finish(), h2.finish());
    }
}
