//! Refs: a named instance of a graph (e.g. one pack) and the stage keys of its last successful
//! run. `status` compares them with the current code; `gc` keeps every entry a ref names.

use fs_err as fs;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::ref_record::ref_file_name;
pub use crate::ref_record::{RefRecord, RefStage};
use crate::store::write_atomic;
use crate::tiered::Store;

fn ref_path(store: &Store, name: &str) -> PathBuf {
    store.refs_dir().join(ref_file_name(name))
}

/// Reads the ref `name`, if it exists (from the shared store, if there is one).
pub fn read_ref(store: &Store, name: &str) -> Result<Option<RefRecord>> {
    if let Some(shared) = store.shared() {
        return shared.read_ref(&ref_file_name(name));
    }
    let path = ref_path(store, name);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::BadStoreFile {
                path,
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes a ref atomically (locally, and to the shared store if there is one).
pub fn write_ref(store: &Store, record: &RefRecord) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|e| Error::Internal(format!("ref serialization: {e}")))?;
    write_atomic(&ref_path(store, &record.name), &bytes)?;
    if let Some(shared) = store.shared() {
        shared.write_ref(&ref_file_name(&record.name), bytes)?;
    }
    Ok(())
}

/// Deletes the ref `name` (locally, and from the shared store if there is one): its entries stay
/// until `gc` finds nothing else names them. Deleting a ref that is not there does nothing.
pub fn delete_ref(store: &Store, name: &str) -> Result<()> {
    match fs::remove_file(ref_path(store, name)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    if let Some(shared) = store.shared() {
        shared.delete_ref(&ref_file_name(name))?;
    }
    Ok(())
}

/// Every ref in the store (the shared one's, if there is one), sorted by name.
pub fn list_refs(store: &Store) -> Result<Vec<RefRecord>> {
    if let Some(shared) = store.shared() {
        return shared.list_refs();
    }
    list_local_refs(store)
}

/// Every ref in the local store only (also those of imports made without the shared store).
pub fn list_local_refs(store: &Store) -> Result<Vec<RefRecord>> {
    let dir = store.refs_dir();
    let mut out = Vec::new();
    for e in fs::read_dir(&dir)? {
        let path = e?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let bytes = fs::read(&path)?;
        let record: RefRecord =
            serde_json::from_slice(&bytes).map_err(|e| Error::BadStoreFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        out.push(record);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
