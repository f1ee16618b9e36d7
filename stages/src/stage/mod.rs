//! The import stages, one file each, named as [`crate::stage_versions`] names them. Each holds
//! only its `Stage` impl (inputs, params, its `ID`: name and version with its bump log) and the tables it writes; the
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
pub mod tower;
pub mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};

use onebit_pipeline::{Input, StageContext, StageError};

use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::layout::geometry::Geometry;

/// The repository files the detect, verify and repair stages read: `model.q4nx`, config.json and
/// the GGUF reference when there are, and the inputs every stage of the graph shares.
#[derive(Clone)]
pub struct RepoInputs {
    /// Inputs every stage of the graph shares (the fetch record).
    pub extra: Vec<Input>,
    /// `model.q4nx`.
    pub model: PathBuf,
    /// config.json, when the repository has one.
    pub config: Option<PathBuf>,
    /// The GGUF reference, when the import has one.
    pub reference: Option<PathBuf>,
}

impl RepoInputs {
    /// The stage's inputs: `model`, then `artifacts`, then config, reference and the shared ones,
    /// in that order (the order is part of the stage's key).
    pub(crate) fn inputs(&self, artifacts: &[Input]) -> Vec<Input> {
        let mut v = vec![Input::external("model", &self.model)];
        v.extend(artifacts.iter().cloned());
        if let Some(c) = &self.config {
            v.push(Input::external("config", c));
        }
        if let Some(r) = &self.reference {
            v.push(Input::external("reference", r));
        }
        v.extend(self.extra.iter().cloned());
        v
    }

    /// The config's path as the running stage sees it, when there is one.
    pub(crate) fn config(&self, ctx: &StageContext<'_>) -> Result<Option<PathBuf>, StageError> {
        Ok(match &self.config {
            Some(_) => Some(ctx.input("config")?.to_path_buf()),
            None => None,
        })
    }

    /// The model geometry config.json gives, when there is one.
    pub(crate) fn geometry(&self, ctx: &StageContext<'_>) -> Result<Option<Geometry>, StageError> {
        Ok(match &self.config {
            Some(_) => Some(Geometry::from_file(ctx.input("config")?)?),
            None => None,
        })
    }

    /// The GGUF reference, opened, when there is one.
    pub(crate) fn gguf(&self, ctx: &StageContext<'_>) -> Result<Option<GgufFile>, StageError> {
        Ok(match &self.reference {
            Some(_) => Some(GgufFile::open(ctx.input("reference")?)?),
            None => None,
        })
    }
}

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

/// Writes each `(name, batch)` as `dir/name.parquet`, creating `dir`: the `tables` folder a stage
/// hands the catalog, one file per table.
pub fn write_tables(dir: &Path, tables: &[(&'static str, RecordBatch)]) -> Result<()> {
    fs_err::create_dir_all(dir)?;
    for (name, batch) in tables {
        write_parquet(&dir.join(format!("{name}.parquet")), name, batch)?;
    }
    Ok(())
}

/// Writes a batch as a Parquet file.
pub fn write_parquet(path: &Path, table: &'static str, batch: &RecordBatch) -> Result<()> {
    let err = |e: parquet::errors::ParquetError| Error::Table {
        table,
        reason: e.to_string(),
    };
    let file = fs_err::File::create(path)?;
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).map_err(err)?;
    w.write(batch).map_err(err)?;
    w.close().map_err(err)?;
    Ok(())
}
