//! # onebit-pack
//!
//! The verified-pack format, shared by the import that writes packs (`onebit-stages`) and the
//! runtime crates that run them (`onebit-kernels`, `onebit-runtime`), so that each fact about a
//! pack is stated once:
//!
//! - [`tiles`]: the one table of tile kinds (q4nx-format §2): geometry, byte sizes, lane bands,
//!   code and scale planes. The import's readers and writers and the host kernels all read it.
//! - [`mm_block`]: the MM-block layout of the towers' projections (q4nx-format §6), which the
//!   import reads and verifies and the host's vision encoder unblocks.
//! - [`manifest`]: `manifest.json`, the pack's description, provenance and verdict.
//! - [`spec`]: what the forward pass needs to know about a model.
//! - [`scan`]: the encoding of the host's 2-bit scan head.
//! - [`host`]: the host runtime as the import sees it (kernel names, the self-check), so the
//!   import does not depend on the runtime.

pub mod host;
pub mod manifest;
pub mod mm_block;
pub mod scan;
pub mod spec;
pub mod tiles;

pub use manifest::{Manifest, TensorEntry};
pub use spec::ModelSpec;
pub use tiles::{Codes, TileKind, TileLayout};
