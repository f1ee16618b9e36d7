//! `gc` on a shared store, and the handshake that keeps it away from running imports.
//!
//! An import holds the lease `run-<run-id>` for its whole run and, once holding it, waits while
//! the lease `gc` is live. `gc` takes `gc`, then refuses to start while any `run-*` lease is live.
//! Each side writes its own lease before it reads the other's, and the store is strongly
//! consistent (S3 is, for every request since 2020), so at least one of them sees the other: gc
//! never removes an entry an import is about to publish or has just hit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use super::SharedStore;
use super::lease::{self, Lease};
use crate::digest::Digest;
use crate::error::{Error, Result};

/// What `gc` removed from a shared store.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SharedGcReport {
    /// Entries no ref references, removed whole.
    pub entries_removed: u64,
    /// Entries kept.
    pub entries_kept: u64,
    /// Uploads no manifest names (a killed or losing importer's), removed.
    pub uploads_removed: u64,
    /// Lapsed leases removed.
    pub leases_removed: u64,
    /// Objects removed in all.
    pub objects_removed: u64,
    /// Bytes freed.
    pub bytes_freed: u64,
}

/// The lease name an import holds while it runs.
pub fn run_lease_name(run_id: &str) -> String {
    format!("run-{run_id}")
}

/// Takes the lease of run `run_id`, then waits while a `gc` is live (`on_wait` once).
pub fn begin_run(
    shared: &Arc<SharedStore>,
    run_id: &str,
    purpose: &str,
    on_wait: impl FnOnce(&lease::LeaseBody),
) -> Result<Lease> {
    let held = match lease::try_acquire(shared, &run_lease_name(run_id), purpose)? {
        Ok(l) => l,
        Err(b) => {
            return Err(Error::Internal(format!(
                "run id {run_id} is already leased by {}",
                b.holder
            )));
        }
    };
    let mut on_wait = Some(on_wait);
    loop {
        match lease::read(shared, "gc")? {
            Some((b, _)) if !b.expired() => {
                if let Some(f) = on_wait.take() {
                    f(&b);
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            _ => return Ok(held),
        }
    }
}

/// Removes from the shared store every entry no ref references, every upload no manifest names
/// and every lapsed lease. Refuses while an import runs anywhere. `dry_run` only counts.
pub fn gc(shared: &Arc<SharedStore>, dry_run: bool) -> Result<SharedGcReport> {
    let _gc = match lease::try_acquire(shared, "gc", "gc")? {
        Ok(l) => l,
        Err(b) => {
            return Err(Error::SharedBusy {
                url: shared.url.clone(),
                holder: b.holder,
                purpose: b.purpose,
                expires_unix_ms: b.expires_unix_ms,
            });
        }
    };
    let leases = shared.list("leases")?;
    let mut live: BTreeSet<String> = BTreeSet::new();
    let mut lapsed = Vec::new();
    for o in &leases {
        let Some(name) = o.location.filename().and_then(|f| f.strip_suffix(".json")) else {
            continue;
        };
        if name == "gc" {
            continue;
        }
        match lease::read(shared, name)? {
            Some((b, _)) if !b.expired() => {
                if name.starts_with("run-") {
                    return Err(Error::SharedBusy {
                        url: shared.url.clone(),
                        holder: b.holder,
                        purpose: b.purpose,
                        expires_unix_ms: b.expires_unix_ms,
                    });
                }
                live.insert(name.to_string());
            }
            Some(_) => lapsed.push(o.location.clone()),
            None => {}
        }
    }
    let referenced: BTreeSet<Digest> = shared
        .list_refs()?
        .iter()
        .flat_map(|r| r.stages.iter().map(|s| s.key))
        .collect();
    // Every object under entries/, by key.
    let mut by_key: BTreeMap<Digest, Vec<object_store::ObjectMeta>> = BTreeMap::new();
    for o in shared.list("entries")? {
        let parts: Vec<String> = o.location.parts().map(|p| p.as_ref().to_string()).collect();
        let Some(i) = parts.iter().position(|p| p == "entries") else {
            continue;
        };
        let Some(key) = parts.get(i + 1).and_then(|k| Digest::from_hex(k)) else {
            continue;
        };
        by_key.entry(key).or_default().push(o);
    }
    let mut report = SharedGcReport::default();
    let remove = |o: &object_store::ObjectMeta, report: &mut SharedGcReport| -> Result<()> {
        report.objects_removed += 1;
        report.bytes_freed += o.size;
        if !dry_run {
            shared.delete(&o.location)?;
        }
        Ok(())
    };
    for (key, objects) in &by_key {
        if live.contains(&key.to_hex()) {
            report.entries_kept += 1;
            continue;
        }
        if !referenced.contains(key) {
            report.entries_removed += 1;
            // The manifest first: the entry stops existing before its files go.
            let mut ordered: Vec<&object_store::ObjectMeta> = objects.iter().collect();
            ordered.sort_by_key(|o| o.location.filename() != Some("manifest.json"));
            for o in ordered {
                remove(o, &mut report)?;
            }
            continue;
        }
        report.entries_kept += 1;
        let upload = shared.manifest(key)?.map(|m| m.upload);
        let mut orphans: BTreeSet<String> = BTreeSet::new();
        for o in objects {
            let parts: Vec<String> = o.location.parts().map(|p| p.as_ref().to_string()).collect();
            let Some(i) = parts.iter().position(|p| *p == key.to_hex()) else {
                continue;
            };
            let Some(first) = parts.get(i + 1) else {
                continue;
            };
            if first == "manifest.json" || Some(first) == upload.as_ref() {
                continue;
            }
            orphans.insert(first.clone());
            remove(o, &mut report)?;
        }
        report.uploads_removed += orphans.len() as u64;
    }
    for loc in &lapsed {
        report.leases_removed += 1;
        if !dry_run {
            shared.delete(loc)?;
        }
    }
    Ok(report)
}
