//! # onebit-runtime
//!
//! Runs verified packs. It opens packs ([`pack`]; their format and the model description the
//! forward pass is driven by, [`spec`], are `onebit-pack`'s), runs the host kernels on the NPU
//! tiles ([`kernels`]), the forward pass with its KV cache ([`model`]), text in and out
//! ([`text`]), sampling ([`sample`]) and the generation loop ([`generate`]). Of the other onebit
//! crates it depends on `onebit-pack` only: everything the forward pass needs travels inside the
//! pack. [`HostKernels`] answers the import's kernels stage.

pub mod attend;
pub mod backend;
pub mod device;
pub mod embed;
pub mod error;
pub mod generate;
pub mod grammar;
mod head;
mod host_check;
pub mod kernels;
pub mod kld;
pub mod kv;
pub mod logprobs;
pub mod model;
pub mod npu;
pub mod ops;
pub mod pack;
pub mod sample;
#[cfg(feature = "server")]
pub mod server;
pub use onebit_pack::spec;
pub mod text;
pub mod think;
pub mod tools;

pub use error::{Error, Result};
pub use host_check::HostKernels;
pub use model::{Model, Session};
pub use pack::{Manifest, Pack};
pub use spec::ModelSpec;

#[cfg(test)]
mod model_tests;
