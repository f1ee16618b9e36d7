//! The record a ref keeps: its name, how to rebuild it, and the stage keys of its last successful
//! run; and the file name it is stored under, locally and in a shared store. Apart from
//! [`crate::refs`] (which reads and writes them through the tiered store) so that the shared
//! store can carry them without knowing the tiered one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::Digest;

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
pub(crate) fn ref_file_name(name: &str) -> String {
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
