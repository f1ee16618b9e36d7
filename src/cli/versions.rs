//! The stage versions this build knows: what `run` records, and what `status`, `sql`, `report`
//! and `serve` compare recorded runs against. A module of its own, below every command that needs
//! it, so no two commands import each other.

use std::collections::BTreeMap;

/// The versions of every stage this build knows (the import's stages and the demo graph's).
pub fn current_versions() -> BTreeMap<String, u32> {
    let mut v = onebit_stages::stage_versions();
    for i in 0..onebit_pipeline::demo::DEMO_EDGES.len() {
        v.insert(format!("gen-{i}"), 1);
    }
    v
}
