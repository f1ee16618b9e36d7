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
            let mut v = serde_json::to_value(r)?;
            let towers = tower_verdicts(&store, r);
            if let Some(o) = v.as_object_mut()
                && !towers.is_empty()
            {
                let towers: Vec<serde_json::Value> =
                    towers.iter().map(TowerVerdict::json).collect();
                o.insert("towers".into(), towers.into());
            }
            println!("{}", serde_json::to_string(&v)?);
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
        // Each tower's own verdict: a failing tower leaves the language model usable.
        for t in tower_verdicts(&store, r) {
            let served = if t.verified {
                t.not_served
                    .as_ref()
                    .map(|why| format!(" (not served: {why})"))
                    .unwrap_or_default()
            } else {
                " (the pack serves text only)".to_string()
            };
            println!("  tower {}: {}{served}", t.file, t.summary);
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

/// One tower file's verdict, as `status` shows it.
struct TowerVerdict {
    file: String,
    kind: &'static str,
    verified: bool,
    summary: String,
    not_served: Option<String>,
}

impl TowerVerdict {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "file": self.file,
            "kind": self.kind,
            "verified": self.verified,
            "summary": self.summary,
            "not_served": self.not_served,
        })
    }
}

/// The verdicts of the tower files a ref's last run verified (`verify:FILE`), from the store,
/// with whether the pack serves each (its manifest's word, where the repack stage ran).
fn tower_verdicts(
    store: &onebit_pipeline::Store,
    r: &onebit_pipeline::maintenance::RefStatus,
) -> Vec<TowerVerdict> {
    let packed: Vec<onebit_pack::manifest::Tower> = r
        .stages
        .iter()
        .find(|s| s.stage == "repack")
        .and_then(|s| {
            let path = store.artifact_path(&s.key, "pack").join("manifest.json");
            let m: onebit_pack::Manifest =
                serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
            Some(m.towers)
        })
        .unwrap_or_default();
    r.stages
        .iter()
        .filter_map(|s| {
            let file = s.stage.strip_prefix("verify:")?;
            let kind = onebit_stages::tower::tower_kind(file)?;
            let path = store
                .artifact_path(&s.key, "verification")
                .join("verdict.json");
            let v: onebit_stages::verify::PackVerdict =
                serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
            Some(TowerVerdict {
                file: file.to_string(),
                kind: kind.as_str(),
                verified: v.verified,
                summary: v.summary,
                not_served: match packed.iter().find(|t| t.file == file) {
                    Some(t) => t.not_served.clone(),
                    None => onebit_stages::tower::not_served(kind).map(str::to_string),
                },
            })
        })
        .collect()
}
