//! `status` (which refs are fresh, stale or damaged) and `gc` (remove what no ref references).

use fs_err as fs;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::digest::Digest;
use crate::error::Result;
use crate::lock::LockMode;
use crate::refs::list_refs;
use crate::store::{Freshness, du};
use crate::tiered::Store;

/// The state of one stage of a ref.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum StageState {
    /// The entry is present and intact; a run would hit it.
    Fresh,
    /// The code's version of the stage differs from the ref's: a run re-runs it.
    Stale {
        /// The version recorded in the ref.
        recorded: u32,
        /// The version of the current code.
        current: u32,
    },
    /// An ancestor is stale, so this stage re-runs too.
    StaleAncestor {
        /// The nearest stale ancestor.
        ancestor: String,
    },
    /// The current code has no stage of that name.
    Unknown,
    /// The entry was removed (e.g. by `gc`).
    Missing,
    /// The entry's files no longer match its manifest.
    Tampered {
        /// The file.
        file: String,
        /// How.
        why: String,
    },
}

/// One stage of a ref, as `status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct StageStatus {
    /// The stage name.
    pub stage: String,
    /// The recorded version.
    pub version: u32,
    /// The recorded key.
    pub key: Digest,
    /// Its state.
    pub state: StageState,
}

/// One ref, as `status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RefStatus {
    /// The ref name.
    pub name: String,
    /// How to rebuild it.
    pub source: Value,
    /// Its last run.
    pub run_id: String,
    /// When.
    pub updated_unix_ms: u64,
    /// Every stage.
    pub stages: Vec<StageStatus>,
}

impl RefStatus {
    /// Whether a run would execute any stage body.
    pub fn needs_run(&self) -> bool {
        self.stages.iter().any(|s| s.state != StageState::Fresh)
    }
}

/// The status of every ref. `current` maps stage names to the versions of the code running now;
/// `deep` re-hashes every file.
pub fn status(
    store: &Store,
    current: &BTreeMap<String, u32>,
    deep: bool,
) -> Result<Vec<RefStatus>> {
    let mut out = Vec::new();
    for r in list_refs(store)? {
        let mut stale_outputs: BTreeMap<Digest, String> = BTreeMap::new();
        let mut stages = Vec::new();
        for s in &r.stages {
            let ancestor = s
                .inputs
                .values()
                .find_map(|d| stale_outputs.get(d).cloned());
            let state = match current.get(&s.stage) {
                None => StageState::Unknown,
                Some(&v) if v != s.version => StageState::Stale {
                    recorded: s.version,
                    current: v,
                },
                Some(_) => match ancestor {
                    Some(a) => StageState::StaleAncestor { ancestor: a },
                    None => match store.check(&s.key, deep)? {
                        Freshness::Fresh(_) => StageState::Fresh,
                        // Not cached here but published: a run fetches it, as a hit.
                        Freshness::Missing
                            if store
                                .shared()
                                .map(|sh| sh.has(&s.key))
                                .transpose()?
                                .unwrap_or(false) =>
                        {
                            StageState::Fresh
                        }
                        Freshness::Missing => StageState::Missing,
                        Freshness::Tampered { file, why } => StageState::Tampered { file, why },
                    },
                },
            };
            if matches!(
                state,
                StageState::Stale { .. } | StageState::StaleAncestor { .. }
            ) {
                for d in s.outputs.values() {
                    stale_outputs.insert(*d, s.stage.clone());
                }
            }
            stages.push(StageStatus {
                stage: s.stage.clone(),
                version: s.version,
                key: s.key,
                state,
            });
        }
        out.push(RefStatus {
            name: r.name,
            source: r.source,
            run_id: r.run_id,
            updated_unix_ms: r.updated_unix_ms,
            stages,
        });
    }
    Ok(out)
}

/// What `gc` removed.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct GcReport {
    /// Entries no ref references, removed.
    pub entries_removed: u64,
    /// Entries kept.
    pub entries_kept: u64,
    /// Files removed (entries and staging leftovers).
    pub files_removed: u64,
    /// Bytes freed.
    pub bytes_freed: u64,
    /// What was removed from the shared store, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<crate::shared::gc::SharedGcReport>,
}

/// Removes every entry no ref references, and every staging leftover of crashed runs. Waits for
/// running pipelines to finish (it takes the store lock exclusively). `dry_run` only counts.
///
/// With a shared store, its gc runs first ([`crate::shared::gc::gc`]: refused while an import
/// runs anywhere), then the local cache keeps what the shared refs reference.
pub fn gc(store: &Store, dry_run: bool) -> Result<GcReport> {
    let shared = match store.shared() {
        Some(sh) => Some(crate::shared::gc::gc(sh, dry_run)?),
        None => None,
    };
    let _root = store.lock_root(LockMode::Exclusive)?;
    // The local cache keeps what the shared refs name and what its own (local-only) refs name.
    let mut refs = list_refs(store)?;
    if store.shared().is_some() {
        refs.extend(crate::refs::list_local_refs(store)?);
    }
    let referenced: BTreeSet<Digest> = refs
        .iter()
        .flat_map(|r| r.stages.iter().map(|s| s.key))
        .collect();
    let mut report = GcReport {
        shared,
        ..GcReport::default()
    };
    for e in store.entries()? {
        if referenced.contains(&e.key) {
            report.entries_kept += 1;
            continue;
        }
        report.entries_removed += 1;
        report.files_removed += e.files;
        report.bytes_freed += e.bytes;
        if !dry_run {
            store.evict(&e.key)?;
        }
    }
    if dry_run {
        let (bytes, files) = du(&store.root().join("tmp"))?;
        report.bytes_freed += bytes;
        report.files_removed += files;
    } else {
        let (bytes, files) = store.clear_tmp()?;
        report.bytes_freed += bytes;
        report.files_removed += files;
        let locks = store.root().join("locks");
        for e in fs::read_dir(&locks)? {
            let p = e?.path();
            if p.file_name().and_then(|n| n.to_str()) != Some("root.lock") {
                let _ = fs::remove_file(&p);
            }
        }
    }
    Ok(report)
}
