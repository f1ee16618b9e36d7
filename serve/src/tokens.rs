//! `POST /tokenize` and `POST /detokenize` in llama-server's shapes: clients count tokens,
//! build `logit_bias` maps and check prompts against the context with them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Server;
use super::api::ApiError;
use super::values::{Route, Unknown};

/// `/tokenize`'s fields.
const TOKENIZE: Route = Route {
    fields: &[&["content", "add_special", "parse_special", "with_pieces"]],
    unknown: Unknown::ListsFields,
};

/// `/detokenize`'s fields.
const DETOKENIZE: Route = Route {
    fields: &[&["tokens"]],
    unknown: Unknown::ListsFields,
};

/// A piece as llama-server writes it: the text when its bytes are UTF-8, else the bytes.
fn piece_value(p: Option<Vec<u8>>) -> Value {
    match p {
        None => Value::Null,
        Some(b) => match String::from_utf8(b) {
            Ok(s) => Value::String(s),
            Err(e) => json!(e.into_bytes()),
        },
    }
}

/// `POST /tokenize`: `content` (required), `add_special` (BOS as the model's prompts get it;
/// default false), `parse_special` (special-token text read as those tokens; default true),
/// `with_pieces` (each id with the text or bytes it stands for).
pub(super) async fn tokenize(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ready, b, _) = s.open(&headers, body, &TOKENIZE).await?;
    let content = match b.get("content") {
        Some(Value::String(c)) => c.clone(),
        None | Some(Value::Null) => return Err(ApiError::bad("content", "'content' is required")),
        Some(v) => {
            return Err(ApiError::bad(
                "content",
                format!("'content' must be a string, got {v}"),
            ));
        }
    };
    let add_special = b.flag("add_special", false)?;
    let parse_special = b.flag("parse_special", true)?;
    let with_pieces = b.flag("with_pieces", false)?;
    let out = tokio::task::spawn_blocking(move || {
        let e = &ready.engine;
        let mut ids = e
            .text
            .encode_parsing(&content, parse_special)
            .map_err(|err| ApiError::bad("content", err.to_string()))?;
        if add_special
            && e.model.spec.add_bos
            && let Some(bos) = e.model.spec.bos
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        Ok::<Value, ApiError>(if with_pieces {
            let pieces = e
                .text
                .with_tokenizer(|t| onebit_runtime::grammar::token_pieces(t, &ids));
            let tokens: Vec<Value> = ids
                .iter()
                .zip(pieces)
                .map(|(&id, p)| json!({"id": id, "piece": piece_value(p)}))
                .collect();
            json!({ "tokens": tokens })
        } else {
            json!({ "tokens": ids })
        })
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(axum::Json(out).into_response())
}

/// `POST /detokenize`: `tokens` (ids) back to text, special tokens written out.
pub(super) async fn detokenize(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ready, b, _) = s.open(&headers, body, &DETOKENIZE).await?;
    let vocab = ready.engine.model.spec.vocab;
    let ids: Vec<u32> = match b.get("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .filter(|&t| t < vocab as u64)
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| {
                        ApiError::bad(
                            format!("tokens[{i}]"),
                            format!("{v} is not a token id of the {vocab}-token vocabulary"),
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
        None | Some(Value::Null) => return Err(ApiError::bad("tokens", "'tokens' is required")),
        Some(v) => {
            return Err(ApiError::bad(
                "tokens",
                format!("'tokens' must be an array of token ids, got {v}"),
            ));
        }
    };
    let content = tokio::task::spawn_blocking(move || {
        ready
            .engine
            .text
            .decode_keeping_special(&ids)
            .map_err(|e| ApiError::bad("tokens", e.to_string()))
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(axum::Json(json!({ "content": content })).into_response())
}
