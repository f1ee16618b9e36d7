//! Getting `--repo ORG/NAME` onto disk before the import graph runs: from an offline mirror
//! directory, from the local Hugging Face cache (`HF_HUB_OFFLINE`), or from the hub's HTTP API into
//! that cache, with a progress bar per file and in total.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use onebit_stages::ImportSource;
use onebit_stages::hub::client::{HubClient, Retry};
use onebit_stages::hub::fetch::{ensure_snapshot, resolve};
use onebit_stages::hub::hf_cache::{RepoFile, hub_cache_dir};
use onebit_stages::hub::paths::validate_repo_id;
use onebit_stages::stage::fetch::FetchInfo;

use super::{Global, Refused};

fn truthy(var: &str) -> bool {
    std::env::var(var)
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

/// `--endpoint`, else `$HF_ENDPOINT`, else the public hub.
fn endpoint_or_default(endpoint: Option<&str>) -> String {
    endpoint
        .map(str::to_string)
        .or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()))
        .unwrap_or_else(|| "https://huggingface.co".to_string())
}

/// The retry policy; `ONEBIT_HUB_RETRY_MS` and `ONEBIT_HUB_ATTEMPTS` tune it (tests shorten it).
fn retry_from_env() -> Retry {
    let env_u64 = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    Retry {
        base: env_u64("ONEBIT_HUB_RETRY_MS")
            .map(Duration::from_millis)
            .unwrap_or(Retry::default().base),
        attempts: env_u64("ONEBIT_HUB_ATTEMPTS")
            .map(|n| n.clamp(1, 100) as u32)
            .unwrap_or(Retry::default().attempts),
    }
}

/// A client, unless `HF_HUB_OFFLINE` is set.
fn client_for(endpoint: &str) -> Option<HubClient> {
    (!truthy("HF_HUB_OFFLINE"))
        .then(|| HubClient::new(endpoint, std::env::var("HF_TOKEN").ok(), retry_from_env()))
}

/// Fetches one file of a hub repository (a GGUF reference) into the Hugging Face cache and returns
/// its path; from the cache alone when `HF_HUB_OFFLINE` is set.
pub fn fetch_file(g: &Global, rf: &RepoFile, endpoint: Option<&str>) -> anyhow::Result<PathBuf> {
    let cache = hub_cache_dir();
    if let Some(p) = rf.in_cache(&cache) {
        return Ok(p);
    }
    let client = client_for(&endpoint_or_default(endpoint));
    let mut resolved = resolve(client.as_ref(), &cache, &rf.repo, &rf.revision)?;
    resolved.files.retain(|f| f.path == rf.file);
    if resolved.files.is_empty() {
        return Err(anyhow::Error::new(Refused(format!(
            "{} at revision {} has no file {}",
            rf.repo, rf.revision, rf.file
        ))));
    }
    if let Some(client) = &client {
        let report = ensure_snapshot(client, &cache, &resolved, 1, &|_| {})?;
        if !g.quiet && !g.json {
            eprintln!(
                "  fetch        {}:{} ({} bytes)",
                rf.repo, rf.file, report.transferred
            );
        }
    }
    Ok(resolved.snapshot.join(&rf.file))
}

/// Resolves and fetches `repo` at `revision`; returns the import source over its files.
pub fn prepare(
    g: &Global,
    repo: &str,
    revision: &str,
    endpoint: Option<&str>,
    jobs: usize,
    reference: Option<PathBuf>,
) -> anyhow::Result<ImportSource> {
    validate_repo_id(repo).map_err(|e| anyhow::Error::new(Refused(e)))?;
    let endpoint = endpoint_or_default(endpoint);
    let as_dir = PathBuf::from(&endpoint);
    if !endpoint.contains("://") && as_dir.is_dir() {
        // An offline mirror: ORG/NAME/<files> under the directory, never outside it.
        let root = as_dir
            .canonicalize()
            .with_context(|| format!("mirror {endpoint}"))?;
        let dir = root
            .join(repo)
            .canonicalize()
            .with_context(|| format!("{repo} is not in the mirror {}", root.display()))?;
        anyhow::ensure!(
            dir.starts_with(&root),
            "{repo} resolves outside the mirror {}",
            root.display()
        );
        return Ok(ImportSource {
            dir,
            reference,
            mmproj: None,
            fetch: None,
            repair: false,
        });
    }
    let cache = hub_cache_dir();
    let client = client_for(&endpoint);
    let resolved = resolve(client.as_ref(), &cache, repo, revision)?;
    if let Some(client) = &client {
        let draw = !(g.quiet || g.json || !std::io::stderr().is_terminal());
        let multi = MultiProgress::with_draw_target(if draw {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let style = |t: &str| {
            ProgressStyle::with_template(t)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ")
        };
        let total_bar = multi.add(ProgressBar::new(0));
        total_bar.set_style(style(
            "fetch {prefix:<28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ));
        total_bar.set_prefix(repo.to_string());
        let bars: Mutex<HashMap<String, ProgressBar>> = Mutex::new(HashMap::new());
        let report = ensure_snapshot(client, &cache, &resolved, jobs, &|p| {
            total_bar.set_length(p.total);
            total_bar.set_position(p.done);
            let Ok(mut bars) = bars.lock() else { return };
            let bar = bars.entry(p.file.to_string()).or_insert_with(|| {
                let b = multi.insert_before(&total_bar, ProgressBar::new(p.file_size.unwrap_or(0)));
                b.set_style(style(
                    "  {prefix:<30} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                ));
                b.set_prefix(p.file.to_string());
                b
            });
            bar.set_position(p.file_done);
            if p.file_size.is_some_and(|s| p.file_done >= s) {
                bar.finish_and_clear();
            }
        })?;
        total_bar.finish_and_clear();
        let line = serde_json::json!({
            "event": "fetched",
            "repo": repo,
            "revision": revision,
            "commit": resolved.commit,
            "downloaded": report.downloaded,
            "reused": report.reused.len(),
            "bytes_transferred": report.transferred,
        });
        if g.json {
            println!("{line}");
        } else if !g.quiet {
            eprintln!(
                "  fetch        {repo}@{revision} = {}: {} downloaded ({} bytes), {} already cached",
                &resolved.commit[..resolved.commit.len().min(12)],
                report.downloaded.len(),
                report.transferred,
                report.reused.len()
            );
        }
    }
    let files = resolved
        .files
        .iter()
        .map(|f| (f.path.clone(), f.size, f.sha256.clone()))
        .collect();
    Ok(ImportSource {
        dir: resolved.snapshot.clone(),
        reference,
        mmproj: None,
        fetch: Some(FetchInfo {
            repo: repo.to_string(),
            revision: revision.to_string(),
            commit: resolved.commit,
            files,
        }),
        repair: false,
    })
}
