//! The runtime's errors: each names the pack, tensor or request it is about.

use std::path::PathBuf;

/// A runtime error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The pack is malformed or does not match its manifest.
    #[error("pack {}: {what}", pack.display())]
    Pack {
        /// The pack folder.
        pack: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The pack is readable but we refuse to run it, with the reason.
    #[error("refuse pack {}: {reason}", pack.display())]
    Refused {
        /// The pack folder.
        pack: PathBuf,
        /// Why.
        reason: String,
    },
    /// Tokenizer or chat-template failure.
    #[error("{0}")]
    Text(String),
    /// A request the runtime cannot serve (too long, bad parameter), naming the field.
    #[error("{field}: {reason}")]
    Request {
        /// The offending field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The KV cache could not grow: its budget (or the machine) has no room for another block.
    #[error(
        "the KV cache has no room: a block of {need} bytes does not fit ({used} of {} bytes in use; \
         the budget is serve's --cache-budget, else 90 % of the memory available at start)",
        if *limit == usize::MAX { "the machine's".to_string() } else { limit.to_string() }
    )]
    CacheMemory {
        /// Bytes the block needed.
        need: usize,
        /// Bytes the caches held.
        used: usize,
        /// The budget (`usize::MAX`: none but the allocator's).
        limit: usize,
    },
    /// A bug in the runtime; please report it.
    #[error("internal error (a bug, please report it): {0}")]
    Internal(String),
    /// The NPU is absent, or XRT refused an operation (its message).
    #[error("{0}")]
    Npu(String),
}

impl From<crate::kv::OverBudget> for Error {
    fn from(e: crate::kv::OverBudget) -> Error {
        Error::CacheMemory {
            need: e.need,
            used: e.used,
            limit: e.limit,
        }
    }
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is a refusal of the input (a pack we will not run, with the reason): the
    /// command line exits 1 for it, 2 for the rest.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Error::Refused { .. })
    }
}

pub(crate) trait IoContext<T> {
    fn at(self, op: &'static str, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, op: &'static str, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}
