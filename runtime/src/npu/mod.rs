//! The NPU backend. [`marshal`] lays tiles, activations and results out in the buffers an NPU
//! kernel reads and writes (pure Rust, tested on every machine against the host kernels);
//! [`backend`] runs a layer's products through a [`backend::KernelRunner`]. The runner that
//! drives a real device through XRT lives in `onebit-xrt` (its bindings need XRT's headers and
//! libclang at build time, so only the binary's `npu` feature links it). Nothing calls XRT unless
//! [`crate::device::find_npus`] found a device node first.

pub mod backend;
pub mod marshal;
