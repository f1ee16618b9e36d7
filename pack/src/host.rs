//! The host runtime as the import sees it. The kernels stage (`onebit-stages`) records which
//! kernel path the host runs a pack on and the self-check of that path on the pack's own weights;
//! the runtime answers through [`HostRuntime`], which the binary hands to the import graph. So the
//! import never links the runtime (its tokenizer, template and grammar engines), and the runtime
//! never links the import.

use std::path::Path;

/// The NPU kernel that provides an `m × k_padded → n_padded` product: `gemv_1xKxN` (m = 1) or
/// `gemm_MxKxN`. The kernels stage names shapes with it and the NPU backend looks kernels up by
/// it.
pub fn kernel_name(m: u64, k_padded: u64, n_padded: u64) -> String {
    let kind = if m == 1 { "gemv" } else { "gemm" };
    format!("{kind}_{m}x{k_padded}x{n_padded}")
}

/// What the host said about a pack it can run.
#[derive(Clone, Debug, PartialEq)]
pub struct HostCheck {
    /// The kernel path (`amx-int8`, `avx512-vnni`, `avx2+fma`, `scalar`).
    pub path: String,
    /// Largest relative error of the self-check on the pack's weights.
    pub max_rel: f32,
    /// Matrices the self-check covered.
    pub matrices: u64,
}

/// Why the host gave no [`HostCheck`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostVerdict {
    /// The host cannot run the pack (an unverified pack, a kind it has no kernel for, a model it
    /// refuses): the kernel set records the reason and goes on.
    CannotRun(String),
    /// The host's kernels compute wrong numbers on this pack: the kernels stage fails.
    SelfCheckFailed(String),
}

/// The host runtime's answer for one pack folder: load it and check its kernels.
pub trait HostRuntime: Send + Sync {
    /// Opens the pack in `pack_dir` (whatever its verdict) and self-checks the host kernels on
    /// its weights.
    fn check(&self, pack_dir: &Path) -> Result<HostCheck, HostVerdict>;
}
