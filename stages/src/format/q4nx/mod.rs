//! The `model.q4nx` container (q4nx-format §1).

pub mod container;
pub mod writer;

pub use container::{Container, Dtype, Header, TensorInfo};
