//! Errors of the stages. Variants say whose fault it is and carry fields: unreadable or
//! inconsistent input (`Corrupt`, `Refused`), the environment (`Io`), or a bug (`Internal`).

use std::path::PathBuf;

/// Everything a stage's domain code can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed; the message names the operation and the path (fs-err's).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A file's bytes contradict its own format (header, offsets, sizes).
    #[error("{}{}: {what}", file.display(), tensor.as_ref().map(|t| format!(": {t}")).unwrap_or_default())]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// The tensor, when the problem is one tensor's.
        tensor: Option<String>,
        /// What is wrong, with the numbers.
        what: String,
    },
    /// Input we will not read or cannot decide, refused by name with both readings.
    #[error("refuse {}: {tensor}: {reason}", file.display())]
    Refused {
        /// The file.
        file: PathBuf,
        /// The tensor (or config key).
        tensor: String,
        /// Why, naming the readings and their evidence.
        reason: String,
    },
    /// A config file cannot be used.
    #[error("{}: {reason}", file.display())]
    Config {
        /// The config file.
        file: PathBuf,
        /// Which key and why.
        reason: String,
    },
    /// Writing a table failed.
    #[error("table {table}: {reason}")]
    Table {
        /// The table name.
        table: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// A bug in onebit-pipe; please report it.
    #[error("internal error (a bug, please report it): {0}")]
    Internal(String),
}

/// Result with the stages' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is the input's fault (a file that contradicts its format, input refused by
    /// name, an unusable config): the command line exits 1 for it, 2 for the rest.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. } | Error::Refused { .. } | Error::Config { .. }
        )
    }
}

/// An I/O error of an operation fs-err does not wrap (a memory map, a temporary file's rename),
/// worded as fs-err words its own: "failed to OP `PATH`: CAUSE".
pub fn io_at(e: std::io::Error, op: &str, path: &std::path::Path) -> std::io::Error {
    std::io::Error::new(
        e.kind(),
        format!("failed to {op} `{}`: {e}", path.display()),
    )
}
