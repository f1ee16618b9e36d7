//! # onebit-stages
//!
//! The import pipeline of a FastFlowLM NPU2 repository and the knowledge it runs on. Read it in
//! this order:
//!
//! - [`graph`]: the import DAG — which stage reads what ([`import_graph`], [`stage_versions`]);
//! - [`stage`]: one file per stage (`fetch`, `semantics`, `detect`, `dequant`, `verify`, `repair`
//!   with `--repair`, `repack`, `kernels`, and `tower` for each tower file's `detect:FILE`,
//!   `dequant:FILE`, `verify:FILE`), each only its `Stage` impl and the tables it writes.
//!
//! The domain code below never depends on a stage, and is tested without a store:
//!
//! - [`format`]: bytes on disk — the q4nx container, tile codecs, GGUF, xclbin headers;
//! - [`semantics`]: what a config means, one file per model family;
//! - [`layout`]: geometry, tile-kind detection with evidence, the on-demand row reader;
//! - [`stats`]: value statistics and correlation;
//! - [`verify`]: the rules that judge a reading against independent references;
//! - [`tower`]: the vision and audio files beside `model.q4nx`, their MM-block layout read with
//!   evidence and verified against llama.cpp's mmproj GGUF;
//! - [`repair`]: rebuilding what a converter broke, from sources verification can prove;
//! - [`model_spec`]: the runtime's model description from the semantics;
//! - [`kernel_set`]: the matrix products a pack needs and what serves each;
//! - [`hub`]: the Hugging Face hub client and cache the fetch stage uses.
//!
//! The GGUF → NPU2 converter is its own crate (`onebit-convert`), built on [`format`] and
//! [`semantics`]; nothing here imports it.

pub mod error;
pub mod format;
pub mod graph;
pub mod hub;
pub mod kernel_set;
pub mod layout;
pub mod model_spec;
pub mod repair;
pub mod semantics;
pub mod stage;
pub mod stats;
pub mod tower;
pub mod verify;

pub use error::{Error, Result};
pub use graph::{ImportSource, import_graph, stage_versions};
