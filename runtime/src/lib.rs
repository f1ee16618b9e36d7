//! # onebit-runtime
//!
//! Runs verified packs. It opens a pack ([`pack`]; its format and the model description the
//! forward pass is driven by are `onebit-pack`'s), binds its tensors to a backend (the host
//! kernels of `onebit-kernels`, or the NPU backend, whose device runner is `onebit-xrt`'s: [`backend`], [`npu`], [`device`]) and runs
//! the forward pass with its KV cache ([`model`]). Around it: text in and out ([`text`]),
//! sampling ([`sample`]), grammar-constrained decoding ([`grammar`]), the generation loop
//! ([`generate`]), log-probabilities ([`logprobs`]), embeddings ([`embed`]), the comparison
//! with a reference's logits ([`kld`]), and Gemma 3's image path: an image file to pixel values
//! ([`image`]), the encoder from a pack's vision tower ([`vision`]) and images placed in a prompt
//! ([`image_input`]). Of the other onebit crates it depends on `onebit-pack`
//! and `onebit-kernels` only: everything the forward pass needs travels inside the pack. It
//! knows nothing of HTTP (`onebit-serve` is built on its public face). [`HostKernels`] answers
//! the import's kernels stage.

pub mod backend;
pub mod device;
pub mod embed;
pub mod error;
pub mod generate;
pub mod grammar;
mod host_check;
pub mod image;
pub mod image_input;
pub mod kld;
pub mod logprobs;
pub mod model;
pub mod npu;
pub mod pack;
pub mod sample;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod vision;

pub use error::{ContextExceeded, Error, Result};
pub use host_check::HostKernels;
pub use image_input::ImageEmbeds;
pub use model::{Model, Session};
pub use pack::Pack;

#[cfg(test)]
mod model_tests;
