//! `response_format`: OpenAI's structured outputs on both routes. `{"type": "json_object"}` asks
//! for any JSON object, `{"type": "json_schema", "json_schema": {"schema": …}}` for a value of
//! that schema (llama.cpp's `{"type": "json_object", "schema": …}` is read the same way), and
//! `{"type": "text"}` for no constraint. The answer is held to it by constrained decoding
//! ([`onebit_runtime::grammar`]), whether or not the client set `strict`.

use serde_json::Value;

use super::error::ApiError;
use super::values::Fields;
use onebit_runtime::grammar::Spec;

/// The grammar `response_format` asks for, if any.
pub(crate) fn response_format(b: &Fields) -> Result<Option<Spec>, ApiError> {
    let f = match b.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(v) => {
            return Err(ApiError::bad(
                "response_format",
                format!("'response_format' must be an object, got {v}"),
            ));
        }
    };
    let schema_of = |v: &Value, field: &str| match v {
        Value::Object(_) | Value::Bool(true) => Ok(v.clone()),
        other => Err(ApiError::bad(
            field,
            format!("'{field}' must be a JSON schema object, got {other}"),
        )),
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => match f.get("schema") {
            None | Some(Value::Null) => Ok(Some(Spec::json_object())),
            Some(s) => schema_of(s, "response_format.schema").map(|s| Some(Spec::JsonSchema(s))),
        },
        Some("json_schema") => {
            let js = match f.get("json_schema") {
                Some(Value::Object(js)) => js,
                _ => {
                    return Err(ApiError::bad(
                        "response_format.json_schema",
                        "'json_schema' must be an object holding the 'schema'",
                    ));
                }
            };
            match js.get("schema") {
                Some(s) => schema_of(s, "response_format.json_schema.schema")
                    .map(|s| Some(Spec::JsonSchema(s))),
                None => Err(ApiError::bad(
                    "response_format.json_schema.schema",
                    "'json_schema' needs a 'schema'",
                )),
            }
        }
        Some(other) => Err(ApiError::bad(
            "response_format.type",
            format!(
                "response_format type '{other}' is not supported (text, json_object, json_schema)"
            ),
        )),
        None => Err(ApiError::bad(
            "response_format.type",
            "'response_format' needs a string 'type' (text, json_object, json_schema)",
        )),
    }
}
