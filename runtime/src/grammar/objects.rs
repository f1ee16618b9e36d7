//! Closed objects. JSON Schema lets an object hold properties it does not list unless it says
//! `additionalProperties: false`, and a small model held to such a schema pads its answers with
//! keys nobody asked for (`{"city": "Paris", "type": "string"}`, measured on Gemma 3 270M with a
//! tool's parameters). llama.cpp's schema grammar reads an object that lists `properties` and says
//! nothing of `additionalProperties` as closed; so does this. An object that allows more keys
//! explicitly (`true` or a schema) keeps them, and one that lists no properties stays open.

use serde_json::Value;

/// Closes every object schema of `schema` that lists properties and leaves
/// `additionalProperties` unsaid, in place.
pub fn close_objects(schema: &mut Value) {
    super::walk::each_schema(schema, &mut |o| {
        if o.contains_key("properties") && !o.contains_key("additionalProperties") {
            o.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_that_list_properties_are_closed_unless_they_say_otherwise() {
        let mut s = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "string"}}},
            "b": {"type": "object", "properties": {}, "additionalProperties": true},
            "c": {"type": "array", "items": {"properties": {"y": {}}}},
            "properties": {"type": "object"},
            "d": {"enum": [{"properties": 1}]}}});
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["properties"]["b"]["additionalProperties"], true);
        assert_eq!(s["properties"]["c"]["items"]["additionalProperties"], false);
        // A property named `properties` is a schema without a list: open. Data is untouched.
        assert_eq!(
            s["properties"]["properties"].get("additionalProperties"),
            None
        );
        assert_eq!(s["properties"]["d"]["enum"][0], json!({"properties": 1}));
    }
}
