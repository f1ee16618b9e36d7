//! The routes that describe the server rather than run the model: `/health`, `/metrics`,
//! `/v1/models[/{id}]` and the served pack's verification report at `/report/{id}`.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::api::ApiError;
use super::models::ModelInfo;
use super::{Phase, Ready, Server};

pub(super) async fn health(State(s): State<Arc<Server>>) -> Response {
    let g = match s.phase.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    match &*g {
        // Whether the API needs a key: the chat page asks for one before its first call.
        Phase::Ready => {
            let infos = s.registry.infos();
            let loaded: Vec<&str> = infos
                .iter()
                .filter(|i| i.status == "loaded")
                .map(|i| i.listing.id.as_str())
                .collect();
            let mut v = json!({
                "status": "ok",
                "models": infos.len(),
                "loaded": loaded,
                "key_required": s.opts.api_key.is_some(),
            });
            if let [one] = &infos[..] {
                v["model"] = json!(one.listing.id);
            }
            axum::Json(v).into_response()
        }
        Phase::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading"})),
        )
            .into_response(),
        Phase::Failed(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "failed", "error": e})),
        )
            .into_response(),
    }
}

pub(super) async fn metrics_text(State(s): State<Arc<Server>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

/// A model as `/v1/models` lists it: OpenAI's fields, then what this server adds: its
/// verification verdict, size, context, family, the names it answers to, and whether it is
/// loaded (with the context it serves at).
pub(super) fn model_object(i: &ModelInfo, loaded: Option<&Ready>) -> Value {
    let l = &i.listing;
    let mut v = json!({
        "id": l.id,
        "object": "model",
        "created": l.modified,
        "owned_by": "onebit-pipe",
        "context_length": l.context,
        "family": l.family,
        "size": l.bytes,
        "short_name": i.short,
        "aliases": l.aliases,
        "verification": {"verified": l.verified, "summary": l.verdict},
        "status": {"value": i.status, "idle_s": i.idle_s, "expires_in_s": i.expires_in_s},
        "loaded": i.status == "loaded",
    });
    if let Some(r) = loaded {
        let sp = &r.engine.model.spec;
        v["n_ctx"] = json!(r.limits.ctx);
        v["meta"] = json!({"vocab": sp.vocab, "layers": sp.layers.len(), "hidden": sp.hidden});
    }
    v
}

impl Server {
    /// The entry of the model `id` names when the request may see it: the API key checked,
    /// 503 while the server's own pack loads, 404 for a name that matches nothing.
    fn listed(&self, headers: &HeaderMap, id: &str) -> Result<ModelInfo, ApiError> {
        self.authorize(headers)?;
        self.started()?;
        let id = self.registry.resolve(Some(id))?;
        self.registry
            .infos()
            .into_iter()
            .find(|i| i.listing.id == id)
            .ok_or_else(|| ApiError::internal("the model left the list"))
    }
}

pub(super) async fn models(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    s.authorize(&headers)?;
    s.started()?;
    let data: Vec<Value> = s
        .registry
        .infos()
        .iter()
        .map(|i| model_object(i, s.registry.loaded_model(&i.listing.id).as_deref()))
        .collect();
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

pub(super) async fn model(
    State(s): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let i = s.listed(&headers, &id)?;
    let loaded = s.registry.loaded_model(&i.listing.id);
    Ok(axum::Json(model_object(&i, loaded.as_deref())).into_response())
}

/// The `model` of a query string (`/props?model=ID`).
#[derive(serde::Deserialize)]
pub(super) struct ModelQuery {
    model: Option<String>,
}

/// `GET /props` (llama-server's route): the context and slots served at, the chat template,
/// the special tokens, and what this server adds: the pack's verification verdict, its towers
/// (each with its verdict and whether it is served), and where the forward pass runs (the backend
/// and its kernel path).
pub(super) async fn props(
    State(s): State<Arc<Server>>,
    Query(q): Query<ModelQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    s.authorize(&headers)?;
    let r = s.model(q.model.as_deref(), None).await?;
    let e = &r.engine;
    let m = &e.model;
    let v = &m.pack.manifest.verification;
    let token = |id: Option<u32>| {
        id.and_then(|t| e.text.decode_keeping_special(&[t]).ok())
            .unwrap_or_default()
    };
    Ok(axum::Json(json!({
        "model": r.id,
        "model_path": m.pack.dir,
        "total_slots": r.limits.slots,
        "default_generation_settings": {
            "n_ctx": r.limits.ctx,
            "params": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                       "typical_p": 1.0, "repeat_last_n": -1, "repeat_penalty": 1.0,
                       "presence_penalty": 0.0, "frequency_penalty": 0.0},
        },
        "model_context": m.spec.context,
        "vocab": m.spec.vocab,
        "chat_template": e.text.template(),
        "bos_token": token(m.spec.bos),
        "eos_token": token(m.spec.eos.first().copied()),
        "kv_cache_type": m.cache_type().to_string(),
        "verification": {
            "verified": v.verified,
            "summary": v.summary,
            "repaired": v.repaired,
            "reference": m.pack.manifest.provenance.reference,
        },
        // Each tower file with its own verdict and whether it is served; a failing tower leaves
        // the language model served as text only.
        "towers": m.pack.manifest.towers,
        "modalities": {"text": true, "image": m.pack.manifest.towers.iter().any(|t| t.served && t.kind == "vision")},
        "backend": m.backend_name(),
        "kernel_path": m.kernel_path().name(),
        "build_info": concat!("onebit-pipe ", env!("CARGO_PKG_VERSION")),
        "report": s.opts.report.as_ref().map(|_| format!("/report/{}", r.id)),
    }))
    .into_response())
}

/// `/report/<model>`: the served pack's verification report, built from the store's catalog now.
pub(super) async fn report(
    State(s): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    s.listed(&headers, &id)?;
    let Some(source) = s.opts.report.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "'{id}' has no report here: it was loaded from a pack folder that no store \
                 names, or this server serves several packs (`onebit-pipe report` builds each)"
            ),
        )
        .with_code("report_not_found"));
    };
    // The catalog runs queries on a runtime of its own: build the page on a plain thread.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send((source.0)());
    });
    let page = rx
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the report thread stopped",
            )
        })?
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("the report of '{id}' could not be built: {e}"),
            )
        })?;
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response())
}
