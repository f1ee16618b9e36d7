//! Ollama's API beside OpenAI's, on the same port: `/api/chat`, `/api/generate`, `/api/embed`
//! (and the older `/api/embeddings`), `/api/tags`, `/api/ps`, `/api/show`, `/api/version`. Many
//! tools look for Ollama on its port and speak nothing else.
//!
//! A request is translated into the OpenAI request it means (Ollama's `options` into the same
//! sampling fields, `format` into `response_format`, `images` into image parts, `think` into
//! `reasoning_effort`) and runs through the same path: the same model lookup, template, grammar,
//! scheduler and answer splitting. The answer goes back in Ollama's shapes: newline-delimited
//! JSON objects when streamed (the default), one object otherwise, each with `created_at` and
//! the final one with `done_reason` and the counts and durations in nanoseconds. A field Ollama
//! has and this server does not read gets a 400 naming it (dropped with `--lenient`); errors are
//! Ollama's `{"error": "…"}`.

mod listing;
mod reply;
mod request;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

pub(crate) use listing::{ps, show, tags, version};
use reply::{Meta, created_at, streamed, whole};
use request::{OllamaRequest, Result, common, message};

use crate::answer::Answer;
use crate::api::ApiError;
use crate::complete::Started;
use crate::reply::Kind;
use crate::values::{Fields, Route, Unknown};
use crate::{Ready, Server};

impl Server {
    /// Runs the OpenAI request `map` of `kind` on the model `b` names and answers in Ollama's
    /// shapes.
    async fn ollama_complete(
        self: &Arc<Self>,
        b: &OllamaRequest,
        kind: Kind,
        mut map: Map<String, Value>,
        chat: bool,
    ) -> Result<Response> {
        let arrived = Instant::now();
        let num_ctx = common(b, &mut map, self.opts.lenient)?;
        let name = b.model()?;
        let ready = self.model(Some(&name), b.keep_alive()?).await?;
        let load = arrived.elapsed();
        check_num_ctx(num_ctx, &ready)?;
        map.insert("model".into(), json!(ready.id));
        let (fields, _) = Fields::checked(map, kind.fields(), false)?;
        let Started {
            ready,
            mut rxs,
            calls,
            think,
            stream,
            ..
        } = self.start(kind, ready, &fields, arrived).await?;
        let answer = Answer::new(think, calls.map(|p| (p.format, p.tools)));
        let meta = Meta {
            model: ready.id.clone(),
            chat,
            arrived,
            load,
        };
        let rx = rxs.remove(0);
        if stream {
            Ok(streamed(meta, rx, answer))
        } else {
            whole(meta, rx, answer).await
        }
    }
}

fn check_num_ctx(num_ctx: Option<u64>, ready: &Ready) -> Result<()> {
    match num_ctx {
        Some(n) if n > ready.limits.ctx as u64 => Err(ApiError::bad(
            "options.num_ctx",
            format!(
                "num_ctx {n} is more than the {} tokens of context '{}' is served at \
                 (serve --ctx-size)",
                ready.limits.ctx, ready.id
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const ROUTE: Route = Route {
        fields: &[&[
            "model",
            "messages",
            "tools",
            "format",
            "options",
            "stream",
            "keep_alive",
            "think",
        ]],
        unknown: Unknown::ListsFields,
    };
    let b = OllamaRequest::read(&s, &headers, body, &ROUTE).await?;
    let messages = match b.get("messages") {
        Some(Value::Array(m)) => m
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
        Some(v) => {
            return Err(
                ApiError::bad("messages", format!("'messages' must be an array, got {v}")).into(),
            );
        }
    };
    if messages.is_empty() {
        // Ollama's way to load (or, with keep_alive 0, unload) a model.
        return s.preload(&b, true).await;
    }
    let mut map = Map::new();
    map.insert("messages".into(), Value::Array(messages));
    if let Some(t) = b.get("tools") {
        map.insert("tools".into(), t.clone());
    }
    s.ollama_complete(&b, Kind::Chat, map, true).await
}

/// `POST /api/generate`: `prompt` through the chat template as a user turn (with `system`
/// before it), or as is with `raw`.
pub(crate) async fn generate(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const ROUTE: Route = Route {
        fields: &[&[
            "model",
            "prompt",
            "suffix",
            "system",
            "template",
            "context",
            "stream",
            "raw",
            "format",
            "options",
            "keep_alive",
            "images",
            "think",
        ]],
        unknown: Unknown::ListsFields,
    };
    let b = OllamaRequest::read(&s, &headers, body, &ROUTE).await?;
    for (k, why) in [
        ("suffix", "fill-in-the-middle is not served"),
        ("template", "the pack's own chat template is used"),
    ] {
        if b.string(k)?.is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::bad(k, format!("'{k}' is not supported: {why}")).into());
        }
    }
    if b.get("context")
        .is_some_and(|c| c.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApiError::bad(
            "context",
            "'context' (Ollama's deprecated token context) is not supported: send the conversation as /api/chat messages",
        )
        .into());
    }
    let prompt = b.string("prompt")?.unwrap_or_default();
    if prompt.is_empty() && b.get("images").is_none() {
        return s.preload(&b, false).await;
    }
    let raw = matches!(b.get("raw"), Some(Value::Bool(true)));
    let mut map = Map::new();
    if raw {
        if b.get("images").is_some() {
            return Err(
                ApiError::bad("images", "images need the chat template: drop 'raw'").into(),
            );
        }
        map.insert("prompt".into(), json!(prompt));
        s.ollama_complete(&b, Kind::Text, map, false).await
    } else {
        let mut messages = Vec::new();
        if let Some(system) = b.string("system")? {
            messages.push(json!({"role": "system", "content": system}));
        }
        let mut user = json!({"role": "user", "content": prompt});
        if let Some(images) = b.get("images") {
            user["images"] = images.clone();
        }
        messages.push(message(messages.len(), &user)?);
        map.insert("messages".into(), Value::Array(messages));
        s.ollama_complete(&b, Kind::Chat, map, false).await
    }
}

impl Server {
    /// A request with nothing to generate: loads the model (keeping it as `keep_alive` says; 0
    /// unloads it at once) and answers `done` with `done_reason` `load` or `unload`.
    async fn preload(self: &Arc<Self>, b: &OllamaRequest, chat: bool) -> Result<Response> {
        let arrived = Instant::now();
        let name = b.model()?;
        let keep = b.keep_alive()?;
        let unload = matches!(keep, Some(Some(d)) if d.is_zero());
        let id = if unload {
            let id = self.registry().resolve(Some(&name))?;
            if self.registry().on_demand() {
                self.registry().unload(self, &name)?;
            }
            id
        } else {
            self.model(Some(&name), keep).await?.id.clone()
        };
        let mut v = json!({"model": id, "created_at": created_at(), "done": true,
            "done_reason": if unload { "unload" } else { "load" },
            "total_duration": arrived.elapsed().as_nanos() as u64});
        if chat {
            v["message"] = json!({"role": "assistant", "content": ""});
        } else {
            v["response"] = json!("");
        }
        Ok(axum::Json(v).into_response())
    }
}

/// `POST /api/embed`: `input` (a string or strings) → `embeddings`, normalized, one a string.
pub(crate) async fn embed(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const ROUTE: Route = Route {
        fields: &[&[
            "model",
            "input",
            "truncate",
            "options",
            "keep_alive",
            "dimensions",
        ]],
        unknown: Unknown::ListsFields,
    };
    let b = OllamaRequest::read(&s, &headers, body, &ROUTE).await?;
    let arrived = Instant::now();
    if matches!(b.get("truncate"), Some(Value::Bool(true))) {
        tracing::debug!("truncate: an input past the context is refused, not cut");
    }
    let ready = s.model(Some(&b.model()?), b.keep_alive()?).await?;
    let load = arrived.elapsed();
    if let Some(d) = b.get("dimensions")
        && d.as_u64() != Some(ready.engine.model.spec.hidden as u64)
    {
        return Err(ApiError::bad(
            "dimensions",
            format!(
                "this model's embeddings have {} dimensions and cannot be shortened; got {d}",
                ready.engine.model.spec.hidden
            ),
        )
        .into());
    }
    let list = crate::embeddings::inputs(b.get("input"))?;
    let (vectors, tokens) = crate::embeddings::embed_inputs(&s, &ready, list, arrived).await?;
    Ok(axum::Json(json!({
        "model": ready.id,
        "embeddings": vectors,
        "total_duration": arrived.elapsed().as_nanos() as u64,
        "load_duration": load.as_nanos() as u64,
        "prompt_eval_count": tokens,
    }))
    .into_response())
}

/// `POST /api/embeddings` (Ollama's older route): `prompt` → `embedding`.
pub(crate) async fn embeddings(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    const ROUTE: Route = Route {
        fields: &[&["model", "prompt", "options", "keep_alive"]],
        unknown: Unknown::ListsFields,
    };
    let b = OllamaRequest::read(&s, &headers, body, &ROUTE).await?;
    let arrived = Instant::now();
    let ready = s.model(Some(&b.model()?), b.keep_alive()?).await?;
    let prompt = b.string("prompt")?.unwrap_or_default();
    let list = crate::embeddings::inputs(Some(&json!(prompt)))?;
    let (mut vectors, _) = crate::embeddings::embed_inputs(&s, &ready, list, arrived).await?;
    Ok(axum::Json(json!({"embedding": vectors.pop().unwrap_or_default()})).into_response())
}
