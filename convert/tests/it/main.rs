//! The converter's integration tests: byte identity with FastFlowLM's converter on the fixtures,
//! the real Gemma 3 270M, chat templates and every llama.cpp pre-tokenizer.
//!
//! One binary (one link) for every integration test of the crate, each file a module, as
//! ripgrep's `tests/tests.rs` does. The fixture helpers are the stages' own.

// The stages' fixture helpers, of which these tests use the fixture paths only.
#[allow(dead_code)]
#[path = "../../../stages/tests/it/common/mod.rs"]
mod common;

mod chat_templates;
mod convert_fixtures;
mod convert_gemma;
mod pretokenizers;
