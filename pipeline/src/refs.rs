//! Refs: a named instance of a graph (e.g. one pack) and the stage keys of its last successful
//! run. `status` compares them with the current code; `gc` keeps every entry a ref names.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::store::{Store, write_atomic};

/// One stage of a ref's last run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RefStage {
    /// The stage name.
    pub stage: String,
    /// Its version at that run.
    pub version: u32,
    /// Its canonical params.
    pub params: Value,
    /// Its key.
    pub key: Digest,
    /// The digest of each input.
    pub inputs: BTreeMap<String, Digest>,
    /// The digest of each output.
    pub outputs: BTreeMap<String, Digest>,
}

/// A ref: its name, how to rebuild it, and its stages.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RefRecord {
    /// The ref name (e.g. `FastFlowLM/Gemma3-270M-NPU2`).
    pub name: String,
    /// Caller-defined description of the graph's source, to re-run it (e.g. the CLI arguments).
    pub source: Value,
    /// The run that wrote this record.
    pub run_id: String,
    /// When.
    pub updated_unix_ms: u64,
    /// The stages in topological order.
    pub stages: Vec<RefStage>,
}

impl RefRecord {
    /// The stage named `name`.
    pub fn stage(&self, name: &str) -> Option<&RefStage> {
        self.stages.iter().find(|s| s.stage == name)
    }
}

/// The file name of ref `name`: readable, and unique by a digest of the exact name.
fn ref_file_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '~'
            }
        })
        .collect();
    let tag = Digest::of_bytes(name.as_bytes()).short();
    format!("{safe}.{tag}.json")
}

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
        Err(e) => Err(e).at("read", &path),
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
    for e in fs::read_dir(&dir).at("list", &dir)? {
        let path = e.at("list", &dir)?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let bytes = fs::read(&path).at("read", &path)?;
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
