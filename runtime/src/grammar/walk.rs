//! A visit of every schema inside a JSON schema (the schema itself, its properties, items,
//! alternatives and definitions), for the rewrites the grammar engine gets ([`super::engine_schema`]).

use serde_json::{Map, Value};

/// Keywords whose values are data, not schemas: they are never visited.
const DATA: &[&str] = &["enum", "const", "default", "examples", "x-guidance"];

/// Keywords whose values map names to schemas (a property may be called `enum`).
const NAMED: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Calls `f` on every schema object of `schema`, outermost first.
pub fn each_schema(schema: &mut Value, f: &mut dyn FnMut(&mut Map<String, Value>)) {
    match schema {
        Value::Object(o) => {
            f(o);
            for (k, v) in o.iter_mut() {
                match (k.as_str(), v) {
                    (k, _) if DATA.contains(&k) => {}
                    (k, Value::Object(m)) if NAMED.contains(&k) => {
                        m.values_mut().for_each(|v| each_schema(v, f));
                    }
                    (_, v) => each_schema(v, f),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| each_schema(v, f)),
        _ => {}
    }
}
