//! Where a model's tiled matrix products run. The forward pass is written once against
//! [`Backend`]: [`Host`] runs the CPU kernels straight on the mapped tiles; the NPU backend
//! ([`crate::npu::backend`]) marshals the same tiles and activations into a kernel's buffers.
//! Everything else in a layer (norms, RoPE, attention, gates) stays on the host either way.

use crate::error::Result;
use onebit_kernels::KernelPath;
use onebit_kernels::matmul::{self, QMatrix};
use onebit_kernels::ops;
use onebit_pack::spec::Act;

/// Runs products of tiled matrices with a batch of activations.
pub trait Backend: Send + Sync {
    /// Name for logs and reports (`host avx2+fma`, `npu emulated`, `npu xrt`).
    fn name(&self) -> String;

    /// `ys[i] = mats[i]·x` for `n` tokens: `x` is `n × k`, `ys[i]` is `n × mats[i].rows`; every
    /// matrix has the same K.
    fn matmul_many(
        &self,
        mats: &[QMatrix<'_>],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<()>;

    /// `h = act(gate·x) ⊙ up·x` in one pass, where the backend can (the host kernels gate
    /// each task's rows while they are in cache); `false` when it did nothing and the caller
    /// runs both products and the gate itself.
    fn matmul_gated(
        &self,
        _gate: &QMatrix<'_>,
        _up: &QMatrix<'_>,
        _x: &[f32],
        _n: usize,
        _act: Act,
        _h: &mut [f32],
    ) -> Result<bool> {
        Ok(false)
    }
}

/// The CPU kernels ([`crate::kernels`]).
#[derive(Clone, Copy, Debug)]
pub struct Host {
    /// The kernel path.
    pub path: KernelPath,
}

impl Backend for Host {
    fn name(&self) -> String {
        format!("host {}", self.path.name())
    }

    /// Fused into one parallel dispatch when the matrices share the tile width and the
    /// activation form (the arithmetic is the same either way).
    fn matmul_many(
        &self,
        mats: &[QMatrix<'_>],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<()> {
        let Some(first) = mats.first() else {
            return Ok(());
        };
        let fusable = mats
            .iter()
            .all(|m| m.k == first.k && m.layout.cols == first.layout.cols);
        if fusable {
            matmul::matmul_many(self.path, mats, x, n, ys);
        } else {
            for (m, y) in mats.iter().zip(ys.iter_mut()) {
                m.matmul(self.path, x, n, y);
            }
        }
        Ok(())
    }

    fn matmul_gated(
        &self,
        gate: &QMatrix<'_>,
        up: &QMatrix<'_>,
        x: &[f32],
        n: usize,
        act: Act,
        h: &mut [f32],
    ) -> Result<bool> {
        let f = |g: &mut [f32], u: &[f32]| ops::gate_rows(act, g, u);
        Ok(matmul::matmul_gated(self.path, gate, up, x, n, h, &f).is_some())
    }
}
