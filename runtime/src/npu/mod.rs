//! The NPU backend. [`marshal`] lays tiles, activations and results out in the buffers an NPU
//! kernel reads and writes (pure Rust, tested on every machine against the host kernels); with
//! feature `npu`, [`xrt`] drives XRT through a C++ shim whose bindings bindgen generates at build
//! time. Nothing calls XRT unless [`crate::device::find_npus`] found a device node first.

pub mod backend;
pub mod marshal;
#[cfg(feature = "npu")]
mod sys;
#[cfg(feature = "npu")]
pub mod xrt;
