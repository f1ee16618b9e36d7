//! GGUF: the container ([`file`]), tensor types ([`dtype`]), dequantization ([`dequant`]) and the
//! name map to pack tensors ([`names`]).

pub mod dequant;
pub mod dtype;
pub mod file;
pub mod names;

pub use dtype::GgmlType;
pub use file::{GgufFile, GgufHeader, GgufTensor, MetaValue};
