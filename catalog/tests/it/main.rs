//! The catalog's integration tests: queries over a store built from the fixture packs, and the report.
//!
//! One binary (one link) for every integration test of the crate, each file a module, as
//! ripgrep's `tests/tests.rs` does; helpers shared by several modules sit beside them.

mod common;

mod queries;
mod report;
