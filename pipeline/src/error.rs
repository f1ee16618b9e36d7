//! Errors of the pipeline engine. Each variant says whose fault it is: the graph (a cycle, a
//! dangling input), a stage (its body failed or panicked), or the environment (I/O on a path).

use std::path::PathBuf;

/// The error a stage body returns: any error of the domain crate that implements the stage.
pub type StageError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed; the message names the operation and the path (fs-err's
    /// wording, the one I/O error of every crate of the workspace).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The graph is not a DAG: the stages named form a cycle.
    #[error("the graph has a cycle: {}", cycle.join(" -> "))]
    Cycle {
        /// The stages of the cycle, the first repeated at the end.
        cycle: Vec<String>,
    },
    /// A stage reads an artifact that no stage of the graph writes.
    #[error(
        "stage {stage}: input {input} reads {from_stage}.{output}, which no stage of the graph writes"
    )]
    DanglingInput {
        /// The reading stage.
        stage: String,
        /// Its input name.
        input: String,
        /// The stage it names.
        from_stage: String,
        /// The output it names.
        output: String,
    },
    /// Two stages of one graph have the same name.
    #[error("the graph has two stages named {0}")]
    DuplicateStage(String),
    /// A stage body failed; the cause is its own error.
    #[error("stage {stage} (key {key}) failed: {source}")]
    StageFailed {
        /// The stage name.
        stage: String,
        /// Its cache key (hex).
        key: String,
        /// What the stage reported.
        #[source]
        source: StageError,
    },
    /// A stage body panicked; nothing it wrote was kept.
    #[error("stage {stage} (key {key}) panicked: {message}; nothing it wrote was kept")]
    StagePanicked {
        /// The stage name.
        stage: String,
        /// Its cache key (hex).
        key: String,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// A stage finished without writing an output it declares.
    #[error("stage {stage} finished without writing its declared output {output}")]
    MissingOutput {
        /// The stage name.
        stage: String,
        /// The output it did not write.
        output: String,
    },
    /// A stage was not run because a stage it depends on failed.
    #[error("stage {stage} was not run: {upstream} failed")]
    UpstreamFailed {
        /// The stage that was skipped.
        stage: String,
        /// The failed ancestor.
        upstream: String,
    },
    /// A store file (manifest, ref) could not be parsed.
    #[error("{}: not a valid store file: {reason}", path.display())]
    BadStoreFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Writing or reading the run records failed.
    #[error("run records {}: {reason}", path.display())]
    Records {
        /// The Parquet file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A request to the shared store failed; the object and the server's answer say why.
    #[error("shared store {url}: {op} {location}: {reason}")]
    Shared {
        /// The store's URL.
        url: String,
        /// What was being done ("get", "put (create if absent)", ...).
        op: &'static str,
        /// The object.
        location: String,
        /// The client's or server's explanation.
        reason: String,
    },
    /// The shared store's URL or settings are unusable.
    #[error("shared store {url}: {reason}")]
    SharedConfig {
        /// The URL as given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A published entry does not match its manifest; nothing of it was kept locally.
    #[error("shared store {url}: entry {key}: {file}: {why}; not used")]
    SharedCorrupt {
        /// The store's URL.
        url: String,
        /// The entry's key (hex).
        key: String,
        /// The file (relative to the entry's `out/`) or artifact.
        file: String,
        /// How it disagrees.
        why: String,
    },
    /// Another process holds the shared store for work that excludes this one.
    #[error(
        "shared store {url}: {holder} is running {purpose} (lease until {expires_unix_ms} ms since the epoch, renewed while it lives); try again when it has finished"
    )]
    SharedBusy {
        /// The store's URL.
        url: String,
        /// `host:pid` of the holder.
        holder: String,
        /// What it is doing.
        purpose: String,
        /// When its lease lapses unless renewed.
        expires_unix_ms: u64,
    },
    /// A bug in the engine itself; please report it.
    #[error("internal error in the pipeline engine (a bug, please report it): {0}")]
    Internal(String),
}

/// Result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is the input's fault. The engine's own errors never are: a stage that refused
    /// its input says so through its source ([`Error::StageFailed`]), which the command line
    /// reads by walking the error chain.
    pub fn is_refusal(&self) -> bool {
        false
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
