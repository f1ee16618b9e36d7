//! The runtime's answer to the import's kernels stage ([`onebit_pack::host::HostRuntime`]): load
//! the pack whatever its verdict (through its file mapping: nothing is copied), then self-check the kernel path on the pack's own weights.

use std::path::Path;

use onebit_pack::host::{HostCheck, HostRuntime, HostVerdict};

use crate::{Model, Pack};

/// The host kernels of this build, as the kernels stage asks for them.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostKernels;

impl HostRuntime for HostKernels {
    fn check(&self, pack_dir: &Path) -> Result<HostCheck, HostVerdict> {
        let model = Pack::open(pack_dir, true)
            .and_then(Model::load_mapped)
            .map_err(|e| HostVerdict::CannotRun(e.to_string()))?;
        let check = model
            .self_check()
            .map_err(|e| HostVerdict::SelfCheckFailed(e.to_string()))?;
        Ok(HostCheck {
            path: check.path.to_string(),
            max_rel: check.max_rel,
            matrices: check.matrices as u64,
        })
    }
}
