//! The stages' integration tests: the golden q4nx fixtures, the tiles from the spec, refusals, semantics of every sample config, verification, the towers, the module graph.
//!
//! One binary (one link) for every integration test of the crate, each file a module, as
//! ripgrep's `tests/tests.rs` does; helpers shared by several modules sit beside them.

mod common;

mod gguf_reference;
mod golden_q4nx;
mod module_graph;
mod refusals;
mod semantics_configs;
mod tiles_from_spec;
mod towers;
mod verify_fixtures;
