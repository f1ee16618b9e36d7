//! `POST /models/load` and `POST /models/unload` (llama-server's router routes): a model loaded
//! ahead of its first request, or let go of before its keep-alive runs out.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::Server;
use crate::api::ApiError;
use crate::body::read_body;
use crate::values::{Fields, Route, Unknown};

/// The fields both routes read.
const FIELDS: Route = Route {
    fields: &[&["model"]],
    unknown: Unknown::ListsFields,
};

/// The body's `model`, required.
async fn named(s: &Server, headers: &HeaderMap, body: Body) -> Result<String, ApiError> {
    s.authorize(headers)?;
    s.started()?;
    let bytes = read_body(body, headers, s.opts.max_body).await?;
    let (f, _) = Fields::read(&bytes, &FIELDS, false)?;
    match f.get("model") {
        Some(Value::String(m)) => Ok(m.clone()),
        None | Some(Value::Null) => Err(ApiError::bad("model", "'model' is required")),
        Some(v) => Err(ApiError::bad(
            "model",
            format!("'model' must be a string, got {v}"),
        )),
    }
}

/// `POST /models/load {"model": NAME}`: loads it (waiting for the load) and says so.
pub(crate) async fn load(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = named(&s, &headers, body).await?;
    let ready = s.model(Some(&name), None).await?;
    Ok(axum::Json(json!({
        "success": true,
        "model": ready.id,
        "status": "loaded",
        "n_ctx": ready.limits.ctx,
    }))
    .into_response())
}

/// `POST /models/unload {"model": NAME}`: unloads it now (409 while requests hold it); says
/// whether it was loaded.
pub(crate) async fn unload(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = named(&s, &headers, body).await?;
    let id = s.registry().resolve(Some(&name))?;
    let was = s.registry().unload(&s, &name)?;
    Ok(axum::Json(json!({"success": true, "model": id, "was_loaded": was})).into_response())
}
