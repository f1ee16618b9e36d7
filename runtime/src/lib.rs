//! # onebit-runtime
//!
//! Runs verified packs. It owns the pack format ([`pack`]), the model description the forward
//! pass is driven by ([`spec`]), the host kernels on the NPU tiles ([`kernels`]), the forward pass
//! with its KV cache ([`model`]), text in and out ([`text`]), sampling ([`sample`]) and the
//! generation loop ([`generate`]). It depends on no other onebit crate: everything the forward
//! pass needs travels inside the pack.

pub mod attend;
pub mod backend;
pub mod device;
pub mod error;
pub mod generate;
pub mod grammar;
mod head;
pub mod kernels;
pub mod model;
pub mod npu;
pub mod ops;
pub mod pack;
pub mod sample;
#[cfg(feature = "server")]
pub mod server;
pub mod spec;
pub mod text;
pub mod tools;

pub use error::{Error, Result};
pub use model::{Model, Session};
pub use pack::{Manifest, Pack};
pub use spec::ModelSpec;

#[cfg(test)]
mod model_tests;
