//! The tables the catalog builds itself (`packs`, `cache`) and the list of tables the stages
//! write, with the pack each belongs to. Current imports come from the refs; earlier ones from the
//! run records (`*_history`); [`crate::listing`] registers them all.
//!
//! | table | from |
//! |---|---|
//! | `packs` | refs + `status` + the verify verdict |
//! | `files` | fetch stage `files.parquet` |
//! | `semantics`, `layers` | semantics stage `tables/` |
//! | `tensors`, `tensor_stats`, `block_stats` | dequant stage `tables/` |
//! | `verification` | verify stage `verification/verification.parquet` |
//! | `kernels` | kernel-set stage `tables/kernels.parquet` |
//! | `runs` | `runs/*.parquet` |
//! | `cache` | store entries |

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use onebit_pipeline::Store;
use onebit_pipeline::maintenance::{StageState, status};
use onebit_pipeline::refs::list_refs;

use crate::error::{Error, Result};

/// The tables every file of a pack has its own of (the language model's and each tower's): their
/// views carry a `file` column after `pack`, the file the rows came from.
pub const PER_FILE_TABLES: [&str; 4] = ["tensors", "tensor_stats", "block_stats", "verification"];

/// The `file` of the language model's rows.
pub const MODEL_FILE: &str = "model.q4nx";

/// A stage-written table: its name, the stage that writes it, and the file in the entry.
pub const STAGE_TABLES: [(&str, &str, &str); 9] = [
    ("files", "fetch", "files.parquet"),
    ("semantics", "semantics", "tables/semantics.parquet"),
    ("layers", "semantics", "tables/layers.parquet"),
    ("tensors", "dequant", "tables/tensors.parquet"),
    ("tensor_stats", "dequant", "tables/tensor_stats.parquet"),
    ("block_stats", "dequant", "tables/block_stats.parquet"),
    ("kernels", "kernels", "tables/kernels.parquet"),
    (
        "verification",
        "verify",
        "verification/verification.parquet",
    ),
    // The repaired bytes verified again (`run --repair`): a tensor failing in `verification` and
    // passing here was repaired.
    (
        "repair_verification",
        "repair",
        "verification/verification.parquet",
    ),
];

/// A table built in memory (`packs`, `cache`): schema and batches.
pub struct Table {
    /// The schema.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

/// The packs whose refs name each key (hex).
pub(crate) fn packs_by_key(
    refs: &[onebit_pipeline::refs::RefRecord],
) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_key: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in refs {
        for s in &r.stages {
            by_key
                .entry(s.key.to_hex())
                .or_default()
                .insert(r.name.clone());
        }
    }
    by_key
}

/// The entry output path of (stage, key).
fn entry_file(store: &Store, key: &onebit_pipeline::Digest, file: &str) -> PathBuf {
    store.entry_dir(key).join("out").join(file)
}

/// One store entry as the `cache` table shows it.
pub(crate) struct CacheRow {
    /// Its key (hex).
    pub key: String,
    /// The stage that wrote it, if its manifest is readable.
    pub stage: Option<String>,
    /// That stage's version.
    pub version: Option<u32>,
    /// When it was published.
    pub created_unix_ms: Option<u64>,
    /// Bytes stored.
    pub bytes: u64,
    /// Files stored.
    pub files: u64,
}

/// The `cache` table from its rows; `by_key` names the packs referencing each key.
pub(crate) fn cache_rows(
    rows: Vec<CacheRow>,
    by_key: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Table> {
    let (mut key, mut stage, mut packs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut version, mut bytes, mut files, mut created) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut referenced = Vec::new();
    for e in rows {
        let users = by_key
            .get(&e.key)
            .map(|s| s.iter().cloned().collect::<Vec<_>>().join(","));
        referenced.push(users.is_some());
        packs.push(users);
        key.push(e.key);
        stage.push(e.stage);
        version.push(e.version);
        created.push(e.created_unix_ms);
        bytes.push(e.bytes);
        files.push(e.files);
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("stage", DataType::Utf8, true),
        Field::new("version", DataType::UInt32, true),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("files", DataType::UInt64, false),
        Field::new("created_unix_ms", DataType::UInt64, true),
        Field::new("referenced", DataType::Boolean, false),
        Field::new("packs", DataType::Utf8, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(key)),
        Arc::new(StringArray::from(stage)),
        Arc::new(UInt32Array::from(version)),
        Arc::new(UInt64Array::from(bytes)),
        Arc::new(UInt64Array::from(files)),
        Arc::new(UInt64Array::from(created)),
        Arc::new(BooleanArray::from(referenced)),
        Arc::new(StringArray::from(packs)),
    ];
    let batch =
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| Error::Execution(e.to_string()))?;
    Ok(Table {
        schema,
        batches: vec![batch],
    })
}

/// The `packs` table: one row per pack, with its freshness and verdict. `current` maps stage names
/// to this build's versions.
pub fn packs_table(store: &Store, current: &BTreeMap<String, u32>) -> Result<Table> {
    let st = status(store, current, false)?;
    let refs = list_refs(store)?;
    let (mut name, mut source, mut dir, mut run, mut updated) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut stages, mut needs, mut stale, mut verified, mut verdict) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in &st {
        name.push(s.name.clone());
        source.push(
            s.source
                .get("args")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        );
        dir.push(
            s.source
                .get("dir")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        );
        run.push(s.run_id.clone());
        updated.push(s.updated_unix_ms);
        stages.push(s.stages.len() as u64);
        needs.push(s.needs_run());
        stale.push(
            s.stages
                .iter()
                .filter(|x| x.state != StageState::Fresh)
                .map(|x| x.stage.clone())
                .collect::<Vec<_>>()
                .join(","),
        );
        let v = refs
            .iter()
            .find(|r| r.name == s.name)
            // A repaired import's verdict is the repair stage's (the repaired bytes verified again).
            .and_then(|r| r.stage("repair").or_else(|| r.stage("verify")))
            .and_then(|v| {
                let file = "verification/verdict.json";
                std::fs::read(entry_file(store, &v.key, file))
                    .ok()
                    .or_else(|| {
                        store
                            .shared()
                            .and_then(|sh| sh.entry_file_bytes(&v.key, file).ok().flatten())
                    })
            })
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        verified.push(v.as_ref().and_then(|v| v["verified"].as_bool()));
        verdict.push(
            v.as_ref()
                .and_then(|v| v["summary"].as_str().map(str::to_string)),
        );
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, true),
        Field::new("dir", DataType::Utf8, true),
        Field::new("last_run", DataType::Utf8, false),
        Field::new("updated_unix_ms", DataType::UInt64, false),
        Field::new("stages", DataType::UInt64, false),
        Field::new("needs_run", DataType::Boolean, false),
        Field::new("stale_stages", DataType::Utf8, false),
        Field::new("verified", DataType::Boolean, true),
        Field::new("verdict", DataType::Utf8, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(name)),
        Arc::new(StringArray::from(source)),
        Arc::new(StringArray::from(dir)),
        Arc::new(StringArray::from(run)),
        Arc::new(UInt64Array::from(updated)),
        Arc::new(UInt64Array::from(stages)),
        Arc::new(BooleanArray::from(needs)),
        Arc::new(StringArray::from(stale)),
        Arc::new(BooleanArray::from(verified)),
        Arc::new(StringArray::from(verdict)),
    ];
    let batch =
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| Error::Execution(e.to_string()))?;
    Ok(Table {
        schema,
        batches: vec![batch],
    })
}
