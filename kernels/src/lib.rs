//! # onebit-kernels
//!
//! The host kernels a verified pack runs on, below everything that knows what a model is: the
//! products straight on the NPU tiles ([`matmul`], with the instruction-set path chosen at run
//! time, [`KernelPath`]), attention over the KV cache ([`attend`], [`kv`]), the element-wise
//! steps of a layer ([`ops`]) and the exact re-scoring of a tiled head's best candidates
//! ([`head`]). Of the other onebit crates it depends on `onebit-pack` only (the tile layouts and
//! the model description's enums). Nearly all of the workspace's `unsafe` lives here, each block
//! behind a run-time CPU check; this crate alone is compiled at `opt-level = 3` in dev builds.

pub mod attend;
pub mod gemm;
pub mod head;
pub mod kv;
pub mod matmul;
pub mod ops;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use matmul::{KernelPath, PATH_VAR};
