//! Run records: one row per stage per run, written as `runs/<run-id>.parquet` when a run ends
//! (also when it fails), for the catalog's `runs` table.
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `run_id` | utf8 | the run (time-ordered hex, then the pid) |
//! | `ref_name` | utf8, null | the ref the run updated, e.g. a pack name |
//! | `stage` | utf8 | stage name |
//! | `version` | uint32 | stage version |
//! | `key` | utf8 | cache key (hex) |
//! | `status` | utf8 | `hit`, `miss` (the body ran), `failed`, `skipped` (an ancestor failed) |
//! | `reason` | utf8 | why it ran or not, as a sentence |
//! | `started_unix_ms` | int64 | when the stage was looked at |
//! | `duration_ms` | float64 | lookup plus body plus publish |
//! | `bytes_in` | uint64 | bytes of its input artifacts |
//! | `bytes_out` | uint64 | bytes of its output artifacts |
//! | `error` | utf8, null | the error chain, for `failed` and `skipped` |

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What happened to a stage in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Served from the store.
    Hit,
    /// The body ran and its outputs were published.
    Miss,
    /// The body failed or panicked.
    Failed,
    /// Not run because an ancestor failed.
    Skipped,
}

impl Status {
    /// The lowercase name used in records and JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Hit => "hit",
            Status::Miss => "miss",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
        }
    }

    fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "hit" => Status::Hit,
            "miss" => Status::Miss,
            "failed" => Status::Failed,
            "skipped" => Status::Skipped,
            _ => return None,
        })
    }
}

/// One row of the run records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StageEvent {
    /// The run id.
    pub run_id: String,
    /// The ref the run updated.
    pub ref_name: Option<String>,
    /// The stage name.
    pub stage: String,
    /// The stage version.
    pub version: u32,
    /// The cache key (hex); empty when a skipped stage's key could not be computed.
    pub key: String,
    /// Hit, miss, failed or skipped.
    pub status: Status,
    /// Why, as a sentence.
    pub reason: String,
    /// When the stage was looked at.
    pub started_unix_ms: i64,
    /// How long it took.
    pub duration_ms: f64,
    /// Bytes of the input artifacts.
    pub bytes_in: u64,
    /// Bytes of the output artifacts.
    pub bytes_out: u64,
    /// The error, for failed and skipped stages.
    pub error: Option<String>,
}

/// The Arrow schema of the run records.
pub fn run_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("ref_name", DataType::Utf8, true),
        Field::new("stage", DataType::Utf8, false),
        Field::new("version", DataType::UInt32, false),
        Field::new("key", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("reason", DataType::Utf8, false),
        Field::new("started_unix_ms", DataType::Int64, false),
        Field::new("duration_ms", DataType::Float64, false),
        Field::new("bytes_in", DataType::UInt64, false),
        Field::new("bytes_out", DataType::UInt64, false),
        Field::new("error", DataType::Utf8, true),
    ]))
}

/// The events as one record batch.
pub fn to_batch(events: &[StageEvent]) -> Result<RecordBatch> {
    let s = |f: fn(&StageEvent) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(events.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        s(|e| &e.run_id),
        Arc::new(StringArray::from_iter(
            events.iter().map(|e| e.ref_name.as_deref()),
        )),
        s(|e| &e.stage),
        Arc::new(UInt32Array::from_iter_values(
            events.iter().map(|e| e.version),
        )),
        s(|e| &e.key),
        s(|e| e.status.as_str()),
        s(|e| &e.reason),
        Arc::new(Int64Array::from_iter_values(
            events.iter().map(|e| e.started_unix_ms),
        )),
        Arc::new(Float64Array::from_iter_values(
            events.iter().map(|e| e.duration_ms),
        )),
        Arc::new(UInt64Array::from_iter_values(
            events.iter().map(|e| e.bytes_in),
        )),
        Arc::new(UInt64Array::from_iter_values(
            events.iter().map(|e| e.bytes_out),
        )),
        Arc::new(StringArray::from_iter(
            events.iter().map(|e| e.error.as_deref()),
        )),
    ];
    RecordBatch::try_new(run_schema(), columns).map_err(|e| Error::Internal(e.to_string()))
}

/// Writes the events of one run to `path` as Parquet, atomically.
pub fn write_records(path: &Path, events: &[StageEvent]) -> Result<()> {
    let batch = to_batch(events)?;
    let mut buf = Vec::new();
    let err = |e: parquet::errors::ParquetError| Error::Records {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, run_schema(), None).map_err(err)?;
    w.write(&batch).map_err(err)?;
    w.close().map_err(err)?;
    crate::store::write_atomic(path, &buf)
}

/// Reads the events back from one Parquet file.
pub fn read_records(path: &Path) -> Result<Vec<StageEvent>> {
    let bad = |reason: String| Error::Records {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(format!("no column {name}")))
        };
        let strs = |name: &str| -> Result<StringArray> {
            col(name)?
                .as_any()
                .downcast_ref::<StringArray>()
                .cloned()
                .ok_or_else(|| bad(format!("column {name} is not utf8")))
        };
        let run_id = strs("run_id")?;
        let ref_name = strs("ref_name")?;
        let stage = strs("stage")?;
        let key = strs("key")?;
        let status = strs("status")?;
        let reason = strs("reason")?;
        let error = strs("error")?;
        let version = col("version")?;
        let version = version
            .as_any()
            .downcast_ref::<UInt32Array>()
            .ok_or_else(|| bad("version is not uint32".into()))?;
        let started = col("started_unix_ms")?;
        let started = started
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| bad("started_unix_ms is not int64".into()))?;
        let dur = col("duration_ms")?;
        let dur = dur
            .as_any()
            .downcast_ref::<Float64Array>()
            .ok_or_else(|| bad("duration_ms is not float64".into()))?;
        let bin = col("bytes_in")?;
        let bin = bin
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| bad("bytes_in is not uint64".into()))?;
        let bout = col("bytes_out")?;
        let bout = bout
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| bad("bytes_out is not uint64".into()))?;
        for i in 0..batch.num_rows() {
            out.push(StageEvent {
                run_id: run_id.value(i).to_string(),
                ref_name: (!ref_name.is_null(i)).then(|| ref_name.value(i).to_string()),
                stage: stage.value(i).to_string(),
                version: version.value(i),
                key: key.value(i).to_string(),
                status: Status::parse(status.value(i))
                    .ok_or_else(|| bad(format!("unknown status {}", status.value(i))))?,
                reason: reason.value(i).to_string(),
                started_unix_ms: started.value(i),
                duration_ms: dur.value(i),
                bytes_in: bin.value(i),
                bytes_out: bout.value(i),
                error: (!error.is_null(i)).then(|| error.value(i).to_string()),
            });
        }
    }
    Ok(out)
}
