//! # onebit-pipeline
//!
//! A generic engine for content-addressed DAGs of stages. It owns the [`Stage`] trait, the
//! [`Graph`], cache keys ([`key`]), the [`LocalStore`] with atomic publication and locks, the [`Store`] that puts a
//! shared store on object storage behind it, run records
//! ([`record`]), refs and their [`status`](maintenance::status), [`gc`](maintenance::gc), and
//! progress events ([`progress`]).
//!
//! It knows nothing about models, tensors or DataFusion: the stages crate plugs domain stages
//! in, the catalog reads the records, and the binary draws the progress.
//!
//! ```text
//! Graph ──run_graph──▶ for each stage in topological order (independent ones in parallel):
//!   key = blake3(name, version, canonical params, input digests)
//!   store.check(key) ── fresh ──▶ hit (no body, no hashing of cached bytes)
//!        └─ missing/tampered ─▶ lock(key) ─▶ run body in tmp/ ─▶ manifest ─▶ rename into entries/
//! ```

pub mod dag;
pub mod demo;
pub mod digest;
pub mod engine;
pub mod error;
pub mod hashcache;
pub mod key;
pub mod lock;
pub mod maintenance;
pub mod progress;
pub mod record;
pub mod ref_record;
pub mod refs;
pub mod shared;
pub mod stage;
pub mod store;
pub mod tiered;

pub use dag::Graph;
pub use digest::Digest;
pub use engine::{Reason, RunOptions, RunReport, run_graph};
pub use error::{Error, Result, StageError};
pub use progress::{Event, NullReporter, Reporter};
pub use record::{StageEvent, Status};
pub use stage::{Input, InputSource, Stage, StageContext, StageId};
pub use store::LocalStore;
pub use tiered::Store;
