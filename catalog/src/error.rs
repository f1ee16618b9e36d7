//! Errors of the catalog: the query's fault (`Sql`, with the position when the parser gives one),
//! the store's (`Store`), or the environment's (`Io`).

use std::path::PathBuf;

/// Everything the catalog can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The query is wrong (planning or parsing); `pointer` shows the position when known.
    #[error("{message}{pointer}")]
    Sql {
        /// DataFusion's message.
        message: String,
        /// The query line with a caret under the position, or empty.
        pointer: String,
    },
    /// Executing the query failed.
    #[error("query failed: {0}")]
    Execution(String),
    /// A store table could not be read.
    #[error("table {table}: {}: {reason}", path.display())]
    Table {
        /// The table.
        table: String,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The pack asked for is not in the store.
    #[error(
        "no pack named '{pack}' in the store (packs: {known}); import it first with `onebit-pipe run`"
    )]
    UnknownPack {
        /// The name asked for.
        pack: String,
        /// The packs the store holds, comma-separated.
        known: String,
    },
    /// A tensor asked for by name is not in the pack.
    #[error(
        "pack '{pack}' has no tensor named '{tensor}' (see `SELECT name FROM tensors WHERE pack = '{pack}'`)"
    )]
    UnknownTensor {
        /// The pack.
        pack: String,
        /// The name asked for.
        tensor: String,
    },
    /// Drawing a chart of the report failed.
    #[error("report chart {chart}: {reason}")]
    Chart {
        /// The chart.
        chart: String,
        /// The drawing backend's message.
        reason: String,
    },
    /// The pipeline store.
    #[error(transparent)]
    Store(#[from] onebit_pipeline::Error),
    /// I/O (fs-err's message: the operation and the path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Result with the catalog's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is the query's or the caller's fault (bad SQL, a pack or tensor the store
    /// does not hold): the command line exits 1 for it, 2 for the rest.
    pub fn is_refusal(&self) -> bool {
        match self {
            Error::Sql { .. } | Error::UnknownPack { .. } | Error::UnknownTensor { .. } => true,
            Error::Store(e) => e.is_refusal(),
            _ => false,
        }
    }
}

/// Turns a DataFusion error into ours, pointing at the SQL position when the message has one
/// ("at Line: L, Column: C").
pub fn from_datafusion(e: datafusion::error::DataFusionError, sql: &str) -> Error {
    let message = e.to_string();
    let is_plan = matches!(
        e.find_root(),
        datafusion::error::DataFusionError::Plan(_)
            | datafusion::error::DataFusionError::SQL(..)
            | datafusion::error::DataFusionError::SchemaError(..)
            | datafusion::error::DataFusionError::NotImplemented(_)
    );
    if !is_plan {
        return Error::Execution(message);
    }
    // The parser gives "Line: L, Column: C" for most errors; an error at the end of input has none,
    // so point just past the last character.
    let at = position(&message).or_else(|| {
        message.contains("found: EOF").then(|| {
            let lines: Vec<&str> = sql.lines().collect();
            (
                lines.len().max(1),
                lines.last().map_or(0, |l| l.chars().count()) + 1,
            )
        })
    });
    let pointer = at
        .and_then(|(l, c)| {
            let line = sql.lines().nth(l.saturating_sub(1))?;
            Some(format!(
                "\n  {line}\n  {}^",
                " ".repeat(c.saturating_sub(1))
            ))
        })
        .unwrap_or_default();
    Error::Sql { message, pointer }
}

fn position(msg: &str) -> Option<(usize, usize)> {
    let at = msg.find("Line: ")?;
    let rest = &msg[at + 6..];
    let line: usize = rest
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let col_at = rest.find("Column: ")?;
    let col: usize = rest[col_at + 8..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((line, col))
}
