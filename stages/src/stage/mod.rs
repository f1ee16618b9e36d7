//! The import stages, one file each, named as [`crate::stage_versions`] names them. Each holds
//! only its `Stage` impl (inputs, params, version with its bump log) and the tables it writes; the
//! work is the domain code's ([`crate::format`], [`crate::semantics`], [`crate::layout`],
//! [`crate::stats`], [`crate::verify`], [`crate::model_spec`], [`crate::kernel_set`]), which never
//! depends on a stage. [`crate::graph`] wires them.

pub mod dequant;
pub mod detect;
pub mod fetch;
pub mod kernels;
pub mod repack;
pub mod repair;
pub mod semantics;
pub mod verify;

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};

use crate::error::{Error, Result};

/// A table from its fields and columns, a mismatch named by the table.
pub(crate) fn batch(
    table: &'static str,
    fields: Vec<Field>,
    columns: Vec<ArrayRef>,
) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| Error::Table {
        table,
        reason: e.to_string(),
    })
}

/// Writes a batch as a Parquet file.
pub fn write_parquet(path: &Path, table: &'static str, batch: &RecordBatch) -> Result<()> {
    let err = |e: parquet::errors::ParquetError| Error::Table {
        table,
        reason: e.to_string(),
    };
    let file = std::fs::File::create(path).map_err(|source| Error::Io {
        op: "create",
        path: path.to_path_buf(),
        source,
    })?;
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).map_err(err)?;
    w.write(batch).map_err(err)?;
    w.close().map_err(err)?;
    Ok(())
}
