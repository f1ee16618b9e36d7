//! # onebit-catalog
//!
//! Every table the stages write, across all packs in the store, in one DataFusion
//! `SessionContext` ([`Catalog`]), plus the `tensor_values` table function. DataFusion is named in
//! this crate only. Current imports are the default tables; earlier imports stay queryable in
//! `*_history` tables (see `docs/catalog.md`).

pub mod context;
pub mod error;
pub mod format;
pub mod listing;
pub mod report;
pub mod tables;
pub mod tensor_values;

pub use context::Catalog;
pub use error::{Error, Result};
pub use format::Format;
