//! BOS / EOS / PAD and the chat template source (semantics.md §5.2). `config.json` first, then
//! `tokenizer_config.json`, then the token string looked up in `tokenizer.json`. When both files
//! state a value and disagree, config.json wins (the seed's precedence) and the decision is FLAGged.

use serde_json::Value;

use super::{Cfg, Log, SideFiles};

/// Token keys of config.json read here (never reported as unknown).
pub(super) const TOKEN_KEYS: &[&str] = &[
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "add_bos_token",
];

pub(super) struct Tokens {
    pub bos_id: Option<u64>,
    pub add_bos: bool,
    pub eos_ids: Vec<u64>,
    pub pad_id: Option<u64>,
    pub chat_template: String,
}

fn ids(v: &Value) -> Option<Vec<u64>> {
    match v {
        Value::Array(a) => {
            let ids: Vec<u64> = a.iter().filter_map(Value::as_u64).collect();
            (!ids.is_empty() && ids.len() == a.len()).then_some(ids)
        }
        other => other.as_u64().map(|i| vec![i]),
    }
}

/// The id of token string `tok` in tokenizer.json (added tokens first, then the model vocab).
fn lookup(tokenizer: Option<&Value>, tok: &str) -> Option<u64> {
    let t = tokenizer?;
    if let Some(added) = t.get("added_tokens").and_then(Value::as_array) {
        for a in added {
            if a.get("content").and_then(Value::as_str) == Some(tok) {
                return a.get("id").and_then(Value::as_u64);
            }
        }
    }
    t.get("model")?.get("vocab")?.get(tok)?.as_u64()
}

fn token_string(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

pub(super) fn derive(cfg: &Cfg<'_>, side: &SideFiles<'_>, log: &mut Log) -> Tokens {
    let tc = side.tokenizer_config;
    let tc_get = |k: &str| tc.and_then(|t| t.get(k)).filter(|v| !v.is_null());

    // One id-list quantity through the precedence chain, FLAGging disagreement.
    let mut chain = |name: &str, key: &str, tok_key: &str| -> Option<Vec<u64>> {
        let from_config = cfg.get(key).and_then(|(v, s)| ids(v).map(|i| (i, s)));
        let from_tc = tc_get(key)
            .and_then(ids)
            .map(|i| (i, format!("tokenizer_config:{key}")));
        let from_tok = tc_get(tok_key).and_then(token_string).and_then(|s| {
            lookup(side.tokenizer, s).map(|id| {
                (
                    vec![id],
                    format!("tokenizer_config:{tok_key} {s:?} -> tokenizer:{id}"),
                )
            })
        });
        let chosen = from_config.clone().or(from_tc.clone()).or(from_tok.clone());
        if let Some((v, s)) = &chosen {
            let shown = v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let silent = if from_config.is_none() {
                " (config.json silent)"
            } else {
                ""
            };
            log.add(name, shown, format!("{s}{silent}"), Some("seed #2248"));
            let others: Vec<String> = [&from_config, &from_tc, &from_tok]
                .into_iter()
                .flatten()
                .filter(|(o, _)| o != v)
                .map(|(o, s)| {
                    format!(
                        "{s} says {}",
                        o.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
                    )
                })
                .collect();
            if !others.is_empty() {
                log.flag(format!(
                    "{}; config.json wins (semantics.md §5.2, open 1)",
                    others.join("; ")
                ));
            }
        }
        chosen.map(|c| c.0)
    };
    let bos_id = chain("bos_id", "bos_token_id", "bos_token").and_then(|v| v.first().copied());
    let eos_ids = chain("eos_ids", "eos_token_id", "eos_token").unwrap_or_default();
    let pad_id = chain("pad_id", "pad_token_id", "pad_token").and_then(|v| v.first().copied());

    let add_bos = match cfg
        .get("add_bos_token")
        .and_then(|(v, s)| v.as_bool().map(|b| (b, s)))
    {
        Some((b, s)) => {
            log.add("add_bos", b as u8, s, Some("seed #2248"));
            b
        }
        None => match tc_get("add_bos_token").and_then(Value::as_bool) {
            Some(b) => {
                log.add(
                    "add_bos",
                    b as u8,
                    "tokenizer_config:add_bos_token (config.json silent)",
                    Some("seed #2248"),
                );
                b
            }
            None => {
                log.add(
                    "add_bos",
                    0,
                    "default: neither file states add_bos_token",
                    Some("inferred"),
                );
                false
            }
        },
    };
    let chat_template = if side.chat_template_file {
        "file:chat_template.jinja".to_string()
    } else if tc_get("chat_template").is_some() {
        "tokenizer_config:chat_template".to_string()
    } else {
        "none".to_string()
    };
    log.add("chat_template", &chat_template, "repository files", None);
    if add_bos
        && tc_get("chat_template")
            .and_then(Value::as_str)
            .is_some_and(|t| t.contains("bos_token"))
    {
        log.flag("add_bos is on and the chat template emits bos_token itself: double-BOS risk");
    }
    if let Some(bos) = side
        .generation_config
        .and_then(|g| g.get("bos_token_id"))
        .and_then(Value::as_u64)
        && bos_id.is_some_and(|b| b != bos)
    {
        log.add(
            "generation_config.bos_token_id",
            bos,
            "generation_config:bos_token_id",
            None,
        );
        log.flag(format!(
            "differs from bos_id {}; config.json wins (semantics.md §5.2, open 1)",
            bos_id.unwrap_or_default()
        ));
    }
    if let Some(eos) = side
        .generation_config
        .and_then(|g| g.get("eos_token_id"))
        .and_then(ids)
        && !eos_ids.is_empty()
        && eos != eos_ids
    {
        log.add(
            "generation_config.eos_token_id",
            eos.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            "generation_config:eos_token_id",
            None,
        );
        log.flag("differs from eos_ids; generation stops on either");
    }
    Tokens {
        bos_id,
        add_bos,
        eos_ids,
        pad_id,
        chat_template,
    }
}
