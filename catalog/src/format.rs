//! Writing query results: an ASCII table, CSV, JSON (an array of objects) or Parquet.

use std::io::Write;

use datafusion::arrow::array::RecordBatch;

use crate::error::{Error, Result};

/// An output format of `onebit-pipe sql`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned text table.
    Table,
    /// CSV with a header.
    Csv,
    /// A JSON array of row objects.
    Json,
    /// Parquet (binary; write to a file).
    Parquet,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "table" => Format::Table,
            "csv" => Format::Csv,
            "json" => Format::Json,
            "parquet" => Format::Parquet,
            other => {
                return Err(format!(
                    "unknown format {other:?} (table, csv, json, parquet)"
                ));
            }
        })
    }
}

fn err(e: impl std::fmt::Display) -> Error {
    Error::Execution(e.to_string())
}

/// Writes `batches` to `w` in `format`.
pub fn write(batches: &[RecordBatch], format: Format, w: &mut dyn Write) -> Result<()> {
    match format {
        Format::Table => {
            let text =
                datafusion::arrow::util::pretty::pretty_format_batches(batches).map_err(err)?;
            writeln!(w, "{text}").map_err(err)?;
        }
        Format::Csv => {
            let mut cw = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(w);
            for b in batches {
                cw.write(b).map_err(err)?;
            }
        }
        Format::Json => {
            let mut jw = datafusion::arrow::json::ArrayWriter::new(w);
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            jw.write_batches(&refs).map_err(err)?;
            jw.finish().map_err(err)?;
        }
        Format::Parquet => {
            let Some(first) = batches.first() else {
                return Ok(());
            };
            let mut buf = Vec::new();
            let mut pw =
                datafusion::parquet::arrow::ArrowWriter::try_new(&mut buf, first.schema(), None)
                    .map_err(err)?;
            for b in batches {
                pw.write(b).map_err(err)?;
            }
            pw.close().map_err(err)?;
            w.write_all(&buf).map_err(err)?;
        }
    }
    Ok(())
}
