//! The runtime's errors: each names the pack, tensor or request it is about.

use std::path::PathBuf;

/// A runtime error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed; the message names the operation and the path (fs-err's).
    #[error(transparent)]
    Io(#[from] std::io::Error),
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
    /// A prompt longer than the context it must fit (a server answers it with OpenAI's
    /// `context_length_exceeded`).
    #[error("prompt: {0}")]
    ContextExceeded(ContextExceeded),
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
    /// A file of llama.cpp's saved log-probabilities (`--kl-divergence-base`) that cannot be
    /// compared with this pack, and why.
    #[error("llama.cpp logits file {}: {reason}", path.display())]
    BaseLogits {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A bug in the runtime; please report it.
    #[error("internal error (a bug, please report it): {0}")]
    Internal(String),
    /// The NPU is absent, or XRT refused an operation (its message).
    #[error("{0}")]
    Npu(String),
}

/// A prompt of `tokens` tokens against a context of `capacity`: it must leave room for one more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{tokens} prompt tokens do not fit the {capacity}-token context")]
pub struct ContextExceeded {
    /// The prompt's tokens.
    pub tokens: usize,
    /// The context, tokens.
    pub capacity: usize,
}

impl From<onebit_kernels::kv::OverBudget> for Error {
    fn from(e: onebit_kernels::kv::OverBudget) -> Error {
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
        matches!(self, Error::Refused { .. } | Error::BaseLogits { .. })
    }
}

/// An I/O error of an operation fs-err does not wrap (a memory map, a temporary file's rename),
/// worded as fs-err words its own: "failed to OP `PATH`: CAUSE".
pub(crate) fn io_at(e: std::io::Error, op: &str, path: &std::path::Path) -> std::io::Error {
    std::io::Error::new(
        e.kind(),
        format!("failed to {op} `{}`: {e}", path.display()),
    )
}
