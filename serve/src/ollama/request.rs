//! Ollama's requests read: the body with its fields checked, `options`, `format`, `think` and
//! `stream` as the OpenAI fields they mean, and messages as OpenAI messages.

use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::Server;
use crate::api::ApiError;
use crate::body::read_body;
use crate::models::parse_keep_alive;
use crate::values::{Fields, Route};

/// An error in Ollama's shape: `{"error": "…"}` with the status.
pub(crate) struct OllamaError(pub(crate) ApiError);

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        (self.0.status, axum::Json(json!({"error": self.0.message}))).into_response()
    }
}

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

pub(crate) type Result<T> = std::result::Result<T, OllamaError>;

/// Ollama's `options` and the OpenAI fields they become.
const OPTIONS: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("typical_p", "typical_p"),
    ("seed", "seed"),
    ("num_predict", "max_tokens"),
    ("stop", "stop"),
    ("repeat_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("repeat_last_n", "repeat_last_n"),
];

/// An Ollama request's body, read as its route's fields (`values::Fields`: an unknown field
/// refused by name, or dropped and logged with `--lenient`).
pub(super) struct OllamaRequest {
    fields: Fields,
}

impl OllamaRequest {
    /// The body of a request to `route`, once the key is checked and the server started.
    pub(super) async fn read(
        s: &Server,
        headers: &HeaderMap,
        body: Body,
        route: &Route,
    ) -> Result<OllamaRequest> {
        s.authorize(headers)?;
        s.started()?;
        let bytes = read_body(body, headers, s.opts.max_body).await?;
        let (fields, ignored) = Fields::read(&bytes, route, s.opts.lenient)?;
        if !ignored.is_empty() {
            tracing::warn!(fields = ?ignored, "--lenient: unknown Ollama fields ignored");
        }
        Ok(OllamaRequest { fields })
    }

    /// The value of `k`, unless absent or null.
    pub(super) fn get(&self, k: &str) -> Option<&Value> {
        self.fields.get(k).filter(|v| !v.is_null())
    }

    /// A string field, if present.
    pub(super) fn string(&self, k: &str) -> Result<Option<String>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(v)) => Ok(Some(v.clone())),
            Some(v) => Err(ApiError::bad(k, format!("'{k}' must be a string, got {v}")).into()),
        }
    }

    /// `model` (or the older `name`), required.
    pub(super) fn model(&self) -> Result<String> {
        match self.string("model")? {
            Some(m) => Ok(m),
            None => self
                .string("name")?
                .ok_or_else(|| ApiError::bad("model", "'model' is required").into()),
        }
    }

    /// `keep_alive`, if given.
    pub(super) fn keep_alive(&self) -> Result<Option<Option<Duration>>> {
        self.get("keep_alive")
            .map(|v| parse_keep_alive(v).map_err(|e| ApiError::bad("keep_alive", e).into()))
            .transpose()
    }
}

/// The OpenAI fields of Ollama's `options`, `format`, `stream` and `think`, into `out`. Returns
/// `num_ctx` when given (checked against the context the model is served at).
pub(super) fn common(
    b: &OllamaRequest,
    out: &mut Map<String, Value>,
    lenient: bool,
) -> Result<Option<u64>> {
    out.insert(
        "stream".into(),
        b.get("stream").cloned().unwrap_or(Value::Bool(true)),
    );
    let mut num_ctx = None;
    if let Some(opts) = b.get("options") {
        let Value::Object(opts) = opts else {
            return Err(ApiError::bad("options", "'options' must be an object").into());
        };
        for (k, v) in opts {
            if v.is_null() {
                continue;
            }
            if k == "num_ctx" {
                num_ctx = Some(v.as_u64().ok_or_else(|| {
                    ApiError::bad("options.num_ctx", "'num_ctx' must be a positive integer")
                })?);
                continue;
            }
            if k == "num_predict" && v.as_i64().is_some_and(|n| n < 0) {
                // -1: until the model stops; -2: until the context fills. Both are the default.
                continue;
            }
            match OPTIONS.iter().find(|(o, _)| o == k) {
                Some((_, field)) => {
                    out.insert((*field).into(), v.clone());
                }
                None if lenient => {
                    tracing::warn!(option = %k, "--lenient: unknown Ollama option ignored");
                }
                None => {
                    return Err(ApiError::bad(
                        format!("options.{k}"),
                        format!(
                            "the option '{k}' is not read by this server (it reads {}, num_ctx); \
                             start it with --lenient to drop such options",
                            OPTIONS
                                .iter()
                                .map(|(o, _)| *o)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                    .into());
                }
            }
        }
    }
    match b.get("format") {
        None => {}
        Some(Value::String(f)) if f == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Value::String(f)) if f.is_empty() => {}
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(v) => {
            return Err(ApiError::bad(
                "format",
                format!("'format' must be \"json\" or a JSON schema object, got {v}"),
            )
            .into());
        }
    }
    match b.get("think") {
        None => {}
        Some(Value::Bool(t)) => {
            let effort = if *t { "medium" } else { "none" };
            out.insert("reasoning_effort".into(), json!(effort));
        }
        Some(Value::String(level)) => {
            out.insert("reasoning_effort".into(), json!(level));
        }
        Some(v) => {
            return Err(
                ApiError::bad("think", format!("'think' must be a boolean, got {v}")).into(),
            );
        }
    }
    Ok(num_ctx)
}

/// An Ollama message as the OpenAI message it means: `images` (base64) as image parts before
/// the text, `tool_calls` with ids and JSON-text arguments, `tool_name` as a tool result's name.
pub(super) fn message(i: usize, m: &Value) -> Result<Value> {
    let field = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(ApiError::bad(field, "a message must be an object").into());
    };
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "role" => {
                out.insert("role".into(), v.clone());
            }
            "content" => {}
            "images" => {}
            // Reasoning a client sends back is not part of the prompt.
            "thinking" => {}
            "tool_name" => {
                out.insert("name".into(), v.clone());
            }
            "tool_calls" => {
                let calls = v.as_array().ok_or_else(|| {
                    ApiError::bad(
                        format!("{field}.tool_calls"),
                        "'tool_calls' must be an array",
                    )
                })?;
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let f = &c["function"];
                        let args = match &f["arguments"] {
                            Value::String(s) => s.clone(),
                            Value::Null => "{}".into(),
                            other => other.to_string(),
                        };
                        json!({"id": format!("call_{i}_{k}"), "type": "function",
                               "function": {"name": f["name"], "arguments": args}})
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            other => {
                return Err(ApiError::bad(
                    format!("{field}.{other}"),
                    format!(
                        "unknown message field '{other}' (a message has role, content, images, \
                         thinking, tool_calls, tool_name)"
                    ),
                )
                .into());
            }
        }
    }
    let text = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(t)) => t.clone(),
        Some(v) => {
            return Err(ApiError::bad(
                format!("{field}.content"),
                format!("'content' must be a string, got {v}"),
            )
            .into());
        }
    };
    match m.get("images") {
        None | Some(Value::Null) => {
            out.insert("content".into(), Value::String(text));
        }
        Some(Value::Array(images)) => {
            let mut parts: Vec<Value> = images
                .iter()
                .map(|b64| match b64 {
                    Value::String(b) => Ok(json!({"type": "image_url",
                        "image_url": {"url": format!("data:image/png;base64,{b}")}})),
                    v => Err(ApiError::bad(
                        format!("{field}.images"),
                        format!("an image must be a base64 string, got {v}"),
                    )),
                })
                .collect::<std::result::Result<_, _>>()?;
            parts.push(json!({"type": "text", "text": text}));
            out.insert("content".into(), Value::Array(parts));
        }
        Some(v) => {
            return Err(ApiError::bad(
                format!("{field}.images"),
                format!("'images' must be an array of base64 strings, got {v}"),
            )
            .into());
        }
    }
    Ok(Value::Object(out))
}
