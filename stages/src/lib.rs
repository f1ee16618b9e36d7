//! # onebit-stages
//!
//! The stages of the import pipeline and the domain code behind them. The domain modules know
//! nothing of the pipeline and are tested without a store:
//!
//! - [`q4nx`]: the `model.q4nx` container (q4nx-format §1);
//! - [`tiles`]: one codec per tile kind (§2);
//! - [`geometry`]: the logical (rows, K) of each weight from config.json;
//! - [`detect`]: tile-kind detection with evidence (§3);
//! - [`reader`]: on-demand decoding of a tensor, a row block at a time;
//! - [`dequant`], [`stats`]: statistics tables as Parquet;
//! - [`import`]: the stage impls and the graph that wires them.

pub mod convert;
pub mod dequant;
pub mod detect;
pub mod error;
pub mod geometry;
pub mod gguf;
pub mod hub;
pub mod import;
pub mod kernel_set;
pub mod q4nx;
pub mod reader;
pub mod repack;
pub mod semantics;
pub mod semantics_stage;
pub mod stats;
pub mod tiles;
pub mod verify;

pub use error::{Error, Result};
pub use import::stage_versions;
