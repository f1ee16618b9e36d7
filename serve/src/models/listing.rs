//! What a server knows of a pack before loading it, the policy its loads follow, and the names
//! and durations people write.

use std::sync::Arc;
use std::time::Duration;

use crate::job::Engine;

/// A pack the server can serve, as listed before it is loaded.
#[derive(Clone, Debug)]
pub struct Listing {
    /// The id requests name it by: the store's name for it (a repository id such as
    /// `FastFlowLM/Gemma3-270M-NPU2`, or a local folder's name).
    pub id: String,
    /// Further names it answers to (`--alias`).
    pub aliases: Vec<String>,
    /// The model family (`gemma3`, `qwen3`, …).
    pub family: String,
    /// Bytes of the pack's files: what loading it maps.
    pub bytes: u64,
    /// The model's context in tokens.
    pub context: usize,
    /// Whether its verification passed.
    pub verified: bool,
    /// The verification's one-line summary.
    pub verdict: String,
    /// When the pack was last imported (seconds since the epoch).
    pub modified: u64,
    /// The pack's content address (its repack entry's key, hex): Ollama's `digest`.
    pub digest: String,
}

/// Loads a listed pack into an engine (the binary's: opening the pack, the kernel self-check,
/// the device); an error is the reason, said to the client in a 503 and logged.
pub type Loader = Arc<dyn Fn(&Listing) -> Result<Engine, String> + Send + Sync>;

/// When models are loaded and unloaded.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Most models loaded at once (`--models-max`).
    pub models_max: usize,
    /// Bytes of pack files loaded models may map together (`--models-memory`); loading one that
    /// does not fit unloads idle ones first, least recently used first, and answers 503 when the
    /// busy ones alone leave no room.
    pub memory: u64,
    /// How long a model stays loaded after its last request (`--keep-alive`; Ollama's
    /// `keep_alive` per request); `None`: until another needs the room.
    pub keep_alive: Option<Duration>,
    /// Serve packs whose verification failed (`--allow-unverified`).
    pub allow_unverified: bool,
}

/// What a model's entry says about it, for `/v1/models`, `/api/tags` and `/api/ps`.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The listing.
    pub listing: Listing,
    /// Its short name.
    pub short: String,
    /// `unloaded`, `loading` or `loaded`.
    pub status: &'static str,
    /// With status `loaded`: the context it serves at.
    pub ctx: Option<usize>,
    /// Seconds since its last request.
    pub idle_s: u64,
    /// When it will be unloaded for idleness, in seconds from now (`None`: not planned).
    pub expires_in_s: Option<u64>,
}

/// A short name for `id` that people can type: its last path part, lowercased, without a
/// trailing `-NPU2` (`FastFlowLM/Gemma3-270M-NPU2` → `gemma3-270m`). When two ids make the same
/// short name, neither answers to it (a request naming it gets a 404 that lists both ids).
pub fn short_name(id: &str) -> String {
    let last = id.rsplit('/').next().unwrap_or(id).to_lowercase();
    last.strip_suffix("-npu2").unwrap_or(&last).to_string()
}

/// A keep-alive as Ollama writes it: a duration string (`30s`, `5m`, `1h30m`, `250ms`, as
/// `humantime` reads them), a number of seconds, `0` (unload as soon as idle) or a negative
/// number (never unload): `None`.
pub fn parse_keep_alive(v: &serde_json::Value) -> Result<Option<Duration>, String> {
    let secs = |x: f64| {
        if x < 0.0 {
            Ok(None)
        } else if x.is_finite() {
            Ok(Some(Duration::from_secs_f64(x)))
        } else {
            Err(format!("keep-alive {x} is not a duration"))
        }
    };
    match v {
        serde_json::Value::Number(n) => secs(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(t) => {
            let t = t.trim();
            match t.parse::<f64>() {
                Ok(x) => secs(x),
                Err(_) if t.starts_with('-') => Ok(None),
                Err(_) => humantime::parse_duration(t)
                    .map(Some)
                    .map_err(|e| format!("keep-alive '{t}' is not a duration: {e}")),
            }
        }
        other => Err(format!(
            "keep-alive must be a duration string or seconds, got {other}"
        )),
    }
}

/// Bytes of the files in a pack folder (what loading it maps; 0 for an unreadable folder).
pub fn pack_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keep_alives_read_as_ollama_writes_them() {
        let d = |v| parse_keep_alive(&v).expect("a keep-alive");
        assert_eq!(d(json!("5m")), Some(Duration::from_secs(300)));
        assert_eq!(d(json!("1h30m")), Some(Duration::from_secs(5400)));
        assert_eq!(d(json!("5m0s")), Some(Duration::from_secs(300)));
        assert_eq!(d(json!("250ms")), Some(Duration::from_millis(250)));
        assert_eq!(d(json!(30)), Some(Duration::from_secs(30)));
        assert_eq!(d(json!("0")), Some(Duration::ZERO));
        assert_eq!(d(json!(-1)), None);
        assert_eq!(d(json!("-1m")), None);
        assert!(parse_keep_alive(&json!("soon")).is_err());
        assert!(parse_keep_alive(&json!(true)).is_err());
    }

    #[test]
    fn short_names_drop_the_org_the_case_and_npu2() {
        assert_eq!(short_name("FastFlowLM/Gemma3-270M-NPU2"), "gemma3-270m");
        assert_eq!(short_name("local/chat"), "chat");
    }
}
