//! Ollama's routes about models: `/api/tags`, `/api/ps`, `/api/show`, `/api/version`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::reply::rfc3339;
use super::request::{OllamaRequest, Result};
use crate::Server;
use crate::api::ApiError;
use crate::models::ModelInfo;
use crate::values::{Route, Unknown};

/// The version `/api/version` reports: Ollama's clients compare it to decide what a server
/// speaks, so it is the Ollama release whose API this one follows, with ours beside it.
const OLLAMA_API: &str = "0.12.0";

/// The `details` Ollama gives a model.
fn details(i: &ModelInfo) -> Value {
    json!({
        "parent_model": "",
        "format": "q4nx",
        "family": i.listing.family,
        "families": [i.listing.family],
        "parameter_size": "",
        "quantization_level": "Q4NX",
    })
}

/// `GET /api/tags`: every model the server serves, loaded or not.
pub(crate) async fn tags(State(s): State<Arc<Server>>, headers: HeaderMap) -> Result<Response> {
    s.authorize(&headers)?;
    s.started()?;
    let models: Vec<Value> = s
        .registry()
        .infos()
        .iter()
        .map(|i| {
            json!({
                "name": i.listing.id,
                "model": i.listing.id,
                "modified_at": rfc3339(i.listing.modified),
                "size": i.listing.bytes,
                "digest": i.listing.digest,
                "details": details(i),
            })
        })
        .collect();
    Ok(axum::Json(json!({"models": models})).into_response())
}

/// `GET /api/ps`: the models loaded now, with when each will be unloaded.
pub(crate) async fn ps(State(s): State<Arc<Server>>, headers: HeaderMap) -> Result<Response> {
    s.authorize(&headers)?;
    s.started()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let models: Vec<Value> = s
        .registry()
        .infos()
        .iter()
        .filter(|i| i.status == "loaded")
        .map(|i| {
            // Never unloaded for idleness: a date far ahead, as Ollama writes keep_alive -1.
            let expires = i.expires_in_s.map_or(now + 100 * 365 * 86_400, |e| now + e);
            json!({
                "name": i.listing.id,
                "model": i.listing.id,
                "size": i.listing.bytes,
                "digest": i.listing.digest,
                "details": details(i),
                "expires_at": rfc3339(expires),
                "size_vram": 0,
                "context_length": i.ctx,
            })
        })
        .collect();
    Ok(axum::Json(json!({"models": models})).into_response())
}

/// `POST /api/show {"model": NAME}`: what the model is, from its listing (loading it for its
/// chat template and capabilities when it is not loaded).
pub(crate) async fn show(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const ROUTE: Route = Route {
        fields: &[&["model", "name", "verbose"]],
        unknown: Unknown::ListsFields,
    };
    let b = OllamaRequest::read(&s, &headers, body, &ROUTE).await?;
    let name = b.model()?;
    let id = s.registry().resolve(Some(&name))?;
    let ready = s.model(Some(&id), None).await?;
    let info = s
        .registry()
        .infos()
        .into_iter()
        .find(|i| i.listing.id == id)
        .ok_or_else(|| ApiError::internal("the model left the list"))?;
    let m = &ready.engine.model;
    let family = &info.listing.family;
    let mut capabilities = vec!["completion"];
    let template = ready.engine.text.template().map(str::to_string);
    if template.as_deref().is_some_and(|t| t.contains("tools")) {
        capabilities.push("tools");
    }
    if template
        .as_deref()
        .is_some_and(crate::think::template_thinks)
    {
        capabilities.push("thinking");
    }
    if m.pack
        .manifest
        .towers
        .iter()
        .any(|t| t.served && t.kind == "vision")
    {
        capabilities.push("vision");
    }
    capabilities.push("embedding");
    Ok(axum::Json(json!({
        "modelfile": "",
        "parameters": "",
        "template": template.unwrap_or_default(),
        "details": details(&info),
        "model_info": {
            "general.architecture": family,
            format!("{family}.context_length"): m.spec.context,
            format!("{family}.embedding_length"): m.spec.hidden,
            format!("{family}.block_count"): m.spec.layers.len(),
            "general.parameter_count": Value::Null,
        },
        "capabilities": capabilities,
        "modified_at": rfc3339(info.listing.modified),
        "verification": {"verified": info.listing.verified, "summary": info.listing.verdict},
    }))
    .into_response())
}

/// `GET /api/version`.
pub(crate) async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_API, "onebit_pipe": env!("CARGO_PKG_VERSION")}))
        .into_response()
}
