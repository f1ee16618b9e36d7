//! The NPU runner over XRT, for the runtime's NPU backend (`onebit_runtime::npu`).
//!
//! With feature `xrt`, build.rs compiles a C++ shim over XRT (`npu-shim/`, every exception
//! caught at the boundary) and generates its bindings with bindgen ([`device`] wraps them in safe
//! handles); [`XrtRunner`] is the backend's `KernelRunner` on the device. Without the feature the
//! crate is empty: the workspace builds and tests where XRT's headers are absent, and the binary,
//! built without its `npu` feature, refuses `serve --device npu` by name.
//!
//! It is its own crate, depended on only by the binary, so that turning XRT on rebuilds this
//! crate and the binary and nothing else.

#[cfg(feature = "xrt")]
pub mod device;
#[cfg(feature = "xrt")]
mod runner;
#[cfg(feature = "xrt")]
mod sys;

#[cfg(feature = "xrt")]
pub use runner::XrtRunner;
