//! # onebit-catalog
//!
//! Will register every table the stages write, across all packs in the store, in a DataFusion
//! `SessionContext`. DataFusion is named in this crate only. Not built yet: `onebit-pipe sql`
//! refuses with a message until it is.
