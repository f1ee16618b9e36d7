//! `onebit-pipe status`: each pack's stages, fresh or stale, and why.

use std::process::ExitCode;

use clap::Args;
use onebit_pipeline::maintenance::{StageState, status};

use super::Global;

/// Arguments of `status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Re-hash every cached file instead of comparing sizes and mtimes.
    #[arg(long)]
    pub deep: bool,
}

/// Prints the status of every ref; with `--json`, one JSON object per ref.
pub fn exec(g: &Global, a: StatusArgs) -> anyhow::Result<ExitCode> {
    let store = g.store()?;
    let current = super::versions::current_versions();
    let refs = status(&store, &current, a.deep)?;
    if g.json {
        for r in &refs {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if refs.is_empty() {
        println!("no packs imported yet in {}", store.root().display());
    }
    for r in &refs {
        let verdict = if r.needs_run() {
            "needs a run"
        } else {
            "fresh"
        };
        println!("{} ({verdict}; last run {})", r.name, r.run_id);
        for s in &r.stages {
            let state = match &s.state {
                StageState::Fresh => "fresh".to_string(),
                StageState::Stale { recorded, current } => {
                    format!("stale: version {recorded} -> {current}")
                }
                StageState::StaleAncestor { ancestor } => format!("stale: {ancestor} re-runs"),
                StageState::Unknown => "unknown to this build".to_string(),
                StageState::Missing => "missing from the store".to_string(),
                StageState::Tampered { file, why } => format!("damaged: {file} {why}"),
            };
            println!(
                "  {:<14} v{:<3} {}  {state}",
                s.stage,
                s.version,
                s.key.short()
            );
        }
        // What the repair stage rebuilt, from its record in the store.
        if let Some(s) = r.stages.iter().find(|s| s.stage == "repair") {
            let path = store.artifact_path(&s.key, "repairs.json");
            if let Ok(bytes) = std::fs::read(&path)
                && let Ok(list) =
                    serde_json::from_slice::<Vec<onebit_stages::repair::Repaired>>(&bytes)
                && !list.is_empty()
            {
                println!("  repaired {} tensor(s):", list.len());
                for x in &list {
                    println!("    {} <- {}, rel L2 {:.4}", x.tensor, x.source, x.rel_l2);
                }
            }
        }
        if r.needs_run() {
            println!(
                "  re-run: onebit-pipe run {}",
                super::run::describe_source(&r.source)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
