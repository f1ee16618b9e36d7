//! `onebit-pipe list`, `rm` and `ps`: the packs in the store, dropping one, and what a running
//! server has loaded (through its API).

use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use super::Global;
use super::packs::{StorePack, store_packs};

/// Arguments of `list`.
#[derive(Args, Debug)]
pub struct ListArgs {}

/// Arguments of `rm`.
#[derive(Args, Debug)]
pub struct RmArgs {
    /// The pack: its store name (`FastFlowLM/Gemma3-270M-NPU2`) or its short name
    /// (`gemma3-270m`, as `serve` answers to it).
    pub name: String,
}

/// Arguments of `ps`.
#[derive(Args, Debug)]
pub struct PsArgs {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Its API key, if it needs one.
    #[arg(long, env = "ONEBIT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// Sizes as people read them (indicatif's binary units).
fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

/// Milliseconds since the epoch as "N units ago".
fn ago(unix_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let since = std::time::Duration::from_millis(now.saturating_sub(unix_ms));
    format!("{} ago", indicatif::HumanDuration(since))
}

/// A verdict cut to its first clause for the table (`--json` has it whole).
fn short_verdict(v: &str) -> String {
    let first = v.split(": ").take(2).collect::<Vec<_>>().join(": ");
    if first.chars().count() > 72 {
        format!("{}…", first.chars().take(71).collect::<String>())
    } else {
        first
    }
}

fn json_of(p: &StorePack) -> Value {
    json!({
        "name": p.name,
        "short_name": onebit_serve::models::short_name(&p.name),
        "family": p.family(),
        "bytes": p.bytes,
        "context": p.context(),
        "verified": p.verified(),
        "verdict": p.verdict(),
        "local": p.local,
        "updated_unix_ms": p.updated_ms,
        "digest": p.key.to_hex(),
    })
}

/// `list`: every pack in the store with its family, size, verdict and last import.
pub fn list(g: &Global, _a: ListArgs) -> anyhow::Result<ExitCode> {
    let store = g.store()?;
    let packs = store_packs(&store)?;
    if g.json {
        for p in &packs {
            println!("{}", json_of(p));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if packs.is_empty() {
        println!("no packs in the store at {}", store.root().display());
        return Ok(ExitCode::SUCCESS);
    }
    let width = packs.iter().map(|p| p.name.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:<10}  {:>11}  {:<10}  {:<16}  VERDICT",
        "NAME", "FAMILY", "SIZE", "STATUS", "IMPORTED"
    );
    for p in &packs {
        let status = if p.verified() {
            "verified"
        } else if p.manifest.is_none() && !p.local {
            "shared"
        } else {
            "refused"
        };
        println!(
            "{:<width$}  {:<10}  {:>11}  {:<10}  {:<16}  {}",
            p.name,
            p.family(),
            human(p.bytes),
            status,
            ago(p.updated_ms),
            short_verdict(&p.verdict())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `rm NAME`: drops the pack's ref; `gc` frees its bytes. A name that matches nothing or
/// several packs is refused, naming what there is.
pub fn rm(g: &Global, a: RmArgs) -> anyhow::Result<ExitCode> {
    let store = g.store()?;
    let packs = store_packs(&store)?;
    let want = a.name.to_lowercase();
    let exact: Vec<&StorePack> = packs.iter().filter(|p| p.name == a.name).collect();
    let matches: Vec<&StorePack> = if exact.is_empty() {
        packs
            .iter()
            .filter(|p| onebit_serve::models::short_name(&p.name) == want)
            .collect()
    } else {
        exact
    };
    let names = |v: &[&StorePack]| {
        v.iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let p = match matches[..] {
        [one] => one,
        [] => {
            return Err(anyhow::Error::new(super::Refused(format!(
                "no pack '{}' in the store (it has: {})",
                a.name,
                if packs.is_empty() {
                    "nothing".to_string()
                } else {
                    names(&packs.iter().collect::<Vec<_>>())
                }
            ))));
        }
        _ => {
            return Err(anyhow::Error::new(super::Refused(format!(
                "'{}' matches several packs ({}): name one by its full name",
                a.name,
                names(&matches)
            ))));
        }
    };
    let _lock = store.lock_root(onebit_pipeline::lock::LockMode::Exclusive)?;
    onebit_pipeline::refs::delete_ref(&store, &p.name)?;
    if g.json {
        println!("{}", json!({"removed": p.name, "bytes": p.bytes}));
    } else {
        println!(
            "removed {} ({}); `onebit-pipe gc` frees the entries nothing else uses",
            p.name,
            human(p.bytes)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ps`: the models a running server has loaded, from its `/v1/models`.
pub fn ps(g: &Global, a: PsArgs) -> anyhow::Result<ExitCode> {
    let url = format!("{}/v1/models", a.url.trim_end_matches('/'));
    let mut req = ureq::get(&url).timeout(std::time::Duration::from_secs(10));
    if let Some(k) = &a.api_key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    let body: Value = match req.call() {
        Ok(r) => serde_json::from_str(&r.into_string()?)?,
        Err(ureq::Error::Status(code, r)) => {
            let text = r.into_string().unwrap_or_default();
            anyhow::bail!("{url} answered {code}: {text}");
        }
        Err(e) => anyhow::bail!("cannot reach the server at {url}: {e}"),
    };
    let models = body["data"].as_array().cloned().unwrap_or_default();
    let loaded: Vec<&Value> = models
        .iter()
        .filter(|m| m["loaded"].as_bool().unwrap_or(false) || m["status"]["value"] == "loading")
        .collect();
    if g.json {
        for m in &loaded {
            println!("{m}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if loaded.is_empty() {
        println!("no models loaded ({} listed at {})", models.len(), a.url);
        return Ok(ExitCode::SUCCESS);
    }
    let width = loaded
        .iter()
        .filter_map(|m| m["id"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<width$}  {:<8}  {:>11}  {:>7}  UNLOADS",
        "NAME", "STATUS", "SIZE", "CONTEXT"
    );
    for m in loaded {
        let expires = match m["status"]["expires_in_s"].as_u64() {
            Some(s) => format!("in {s} s if idle"),
            None => "when another needs the room".into(),
        };
        println!(
            "{:<width$}  {:<8}  {:>11}  {:>7}  {expires}",
            m["id"].as_str().unwrap_or("?"),
            m["status"]["value"].as_str().unwrap_or("?"),
            human(m["size"].as_u64().unwrap_or(0)),
            m["n_ctx"].as_u64().unwrap_or(0),
        );
    }
    Ok(ExitCode::SUCCESS)
}
