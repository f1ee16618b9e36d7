//! Every table the stages write, found in the store and read into Arrow, with the pack it belongs
//! to. Current imports come from the refs; earlier ones from the run records (`*_history`).
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
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use onebit_pipeline::Store;
use onebit_pipeline::maintenance::{StageState, status};
use onebit_pipeline::refs::list_refs;

use crate::error::{Error, Result};

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

/// A table ready to register: schema and batches.
pub struct Table {
    /// The schema.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

fn read_parquet(table: &str, path: &Path) -> Result<Vec<RecordBatch>> {
    let bad = |reason: String| Error::Table {
        table: table.into(),
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let reader =
        datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| bad(e.to_string()))?;
    reader.map(|b| b.map_err(|e| bad(e.to_string()))).collect()
}

/// Prepends string columns (e.g. `pack`) to a batch.
fn with_columns(batch: &RecordBatch, front: &[(&str, DataType, ArrayRef)]) -> Result<RecordBatch> {
    let mut fields: Vec<Field> = front
        .iter()
        .map(|(n, t, _)| Field::new(*n, t.clone(), false))
        .collect();
    fields.extend(batch.schema().fields().iter().map(|f| f.as_ref().clone()));
    let mut cols: Vec<ArrayRef> = front.iter().map(|(_, _, a)| a.clone()).collect();
    cols.extend(batch.columns().iter().cloned());
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
        .map_err(|e| Error::Execution(e.to_string()))
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

fn str_col(v: &str, n: usize) -> ArrayRef {
    Arc::new(StringArray::from(vec![v; n]))
}

/// The entry output path of (stage, key).
fn entry_file(store: &Store, key: &onebit_pipeline::Digest, file: &str) -> PathBuf {
    store.entry_dir(key).join("out").join(file)
}

/// Reads every stage table for the current import of each pack, and the history of every import
/// the run records name.
pub fn stage_tables(store: &Store) -> Result<BTreeMap<String, Table>> {
    let refs = list_refs(store)?;
    let runs = run_batches(store)?;
    let mut out = BTreeMap::new();
    // (pack, stage) → keys seen in runs, with their first and last run ids.
    let mut seen: BTreeMap<(String, String), BTreeMap<String, (String, String)>> = BTreeMap::new();
    for b in &runs {
        let col = |n: &str| {
            b.column_by_name(n)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
        };
        let (Some(pack), Some(stage), Some(key), Some(status), Some(run)) = (
            col("ref_name"),
            col("stage"),
            col("key"),
            col("status"),
            col("run_id"),
        ) else {
            continue;
        };
        for i in 0..b.num_rows() {
            if pack.is_null(i) || !matches!(status.value(i), "hit" | "miss") {
                continue;
            }
            let e = seen
                .entry((pack.value(i).to_string(), stage.value(i).to_string()))
                .or_default()
                .entry(key.value(i).to_string())
                .or_insert_with(|| (run.value(i).to_string(), run.value(i).to_string()));
            if run.value(i) < e.0.as_str() {
                e.0 = run.value(i).to_string();
            }
            if run.value(i) > e.1.as_str() {
                e.1 = run.value(i).to_string();
            }
        }
    }
    for (table, stage, file) in STAGE_TABLES {
        let mut current = Vec::new();
        let mut history = Vec::new();
        for r in &refs {
            let Some(s) = r.stage(stage) else { continue };
            let path = entry_file(store, &s.key, file);
            if path.is_file() {
                for b in read_parquet(table, &path)? {
                    current.push(with_columns(
                        &b,
                        &[("pack", DataType::Utf8, str_col(&r.name, b.num_rows()))],
                    )?);
                }
            }
            let Some(keys) = seen.get(&(r.name.clone(), stage.to_string())) else {
                continue;
            };
            for (key, (first, last)) in keys {
                let Some(d) = onebit_pipeline::Digest::from_hex(key) else {
                    continue;
                };
                let path = entry_file(store, &d, file);
                if !path.is_file() {
                    continue;
                }
                let is_current = *key == s.key.to_hex();
                for b in read_parquet(table, &path)? {
                    let n = b.num_rows();
                    history.push(with_columns(
                        &b,
                        &[
                            ("pack", DataType::Utf8, str_col(&r.name, n)),
                            ("import_key", DataType::Utf8, str_col(key, n)),
                            ("first_run", DataType::Utf8, str_col(first, n)),
                            ("last_run", DataType::Utf8, str_col(last, n)),
                            (
                                "current",
                                DataType::Boolean,
                                Arc::new(BooleanArray::from(vec![is_current; n])),
                            ),
                        ],
                    )?);
                }
            }
        }
        if let Some(first) = current.first() {
            out.insert(
                table.to_string(),
                Table {
                    schema: first.schema(),
                    batches: current,
                },
            );
        }
        if let Some(first) = history.first() {
            out.insert(
                format!("{table}_history"),
                Table {
                    schema: first.schema(),
                    batches: history,
                },
            );
        }
    }
    Ok(out)
}

/// Every run record batch.
pub fn run_batches(store: &Store) -> Result<Vec<RecordBatch>> {
    let dir = store.runs_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|source| Error::Io {
            op: "list",
            path: dir.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        out.extend(read_parquet("runs", &p)?);
    }
    Ok(out)
}

/// The `runs` table.
pub fn runs_table(store: &Store) -> Result<Table> {
    Ok(Table {
        schema: onebit_pipeline::record::run_schema(),
        batches: run_batches(store)?,
    })
}

/// The `cache` table: one row per store entry, whether a pack references it.
pub fn cache_table(store: &Store) -> Result<Table> {
    let by_key = packs_by_key(&list_refs(store)?);
    let rows = store
        .entries()?
        .into_iter()
        .map(|e| CacheRow {
            key: e.key.to_hex(),
            stage: e.manifest.as_ref().map(|m| m.stage.clone()),
            version: e.manifest.as_ref().map(|m| m.version),
            created_unix_ms: e.manifest.as_ref().map(|m| m.created_unix_ms),
            bytes: e.bytes,
            files: e.files,
        })
        .collect();
    cache_rows(rows, &by_key)
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
