//! The binary's integration tests: the command line, fetch, import, verification, serve and the real-model cases, run through `onebit-pipe` itself.
//!
//! One binary (one link) for every integration test of the crate, each file a module, as
//! ripgrep's `tests/tests.rs` does; helpers shared by several modules sit beside them.

mod hub_server;
mod s3_server;
mod support;

mod catalog_paths;
mod cli;
mod fetch;
mod gemma_e2e;
mod hy_mt2_e2e;
mod objstore;
mod oracles;
mod real_size;
mod repair;
mod report_browser;
mod serve;
mod serve_gemma;
mod towers;
