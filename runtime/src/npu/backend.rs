//! The NPU backend: every tiled product of a layer goes through the buffers an NPU kernel reads
//! and writes ([`super::marshal`]): the matrix's tiles byte for byte, activations as bf16
//! `[m][k_padded]`, results as bf16 `[m][n_padded]`. A [`KernelRunner`] runs one kernel on those
//! bytes: the device through XRT (`onebit_xrt::XrtRunner`, the binary's feature `npu`) or [`Emulator`], which computes
//! what the kernel computes from the bytes alone, so the whole run loop of a layer is exercised on
//! any machine and compared with the host backend.
//!
//! Kernels are picked by shape, named as the kernel-set stage names them ([`kernel_name`]):
//! `gemv_1xKxN` for one token, `gemm_BxKxN` for up to `B` tokens (the batch rows beyond the real
//! ones are zero and their results dropped).

use super::marshal::{pack_activations, unpack_results};
use crate::backend::Backend;
use crate::error::Result;
use onebit_kernels::matmul::QMatrix;

pub use onebit_pack::host::kernel_name;

/// One kernel invocation's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Activation rows the kernel takes (1 or the batch).
    pub m: usize,
    /// K padded to the tile's column grid.
    pub k_padded: usize,
    /// N padded to the tile's row grid.
    pub n_padded: usize,
}

/// Runs one kernel on marshalled bytes.
pub trait KernelRunner: Send + Sync {
    /// Name for logs.
    fn name(&self) -> &'static str;

    /// Runs the kernel for `shape` with `w`'s tiles as weights and `acts` (`shape.m × k_padded`
    /// bf16) as activations; returns `shape.m × n_padded` bf16 results.
    fn gemm(&self, w: &QMatrix<'_>, shape: Shape, acts: &[u8]) -> Result<Vec<u8>>;
}

/// Computes a kernel's output from its buffers on the host ([`super::marshal::emulate`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Emulator;

impl KernelRunner for Emulator {
    fn name(&self) -> &'static str {
        "emulated"
    }

    fn gemm(&self, w: &QMatrix<'_>, shape: Shape, acts: &[u8]) -> Result<Vec<u8>> {
        Ok(super::marshal::emulate(
            w,
            super::marshal::weight_buffer(w),
            acts,
            shape.m,
            shape.k_padded,
            shape.n_padded,
        ))
    }
}

/// The NPU backend over a [`KernelRunner`].
pub struct NpuBackend<E> {
    engine: E,
    batch: usize,
}

impl<E: KernelRunner> NpuBackend<E> {
    /// A backend whose GEMM kernels take `batch` rows (the kernel set's batch).
    pub fn new(engine: E, batch: usize) -> Self {
        NpuBackend {
            engine,
            batch: batch.max(1),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &E {
        &self.engine
    }
}

impl<E: KernelRunner> Backend for NpuBackend<E> {
    fn name(&self) -> String {
        format!("npu {}", self.engine.name())
    }

    /// One kernel run per matrix and chunk of at most `batch` tokens; a single token takes the
    /// GEMV kernel, more take the GEMM kernel with the rows beyond the chunk zero.
    fn matmul_many(
        &self,
        mats: &[QMatrix<'_>],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<()> {
        for (w, y) in mats.iter().zip(ys.iter_mut()) {
            let (k, kp, rows) = (w.k, w.k_padded(), w.rows);
            let np = rows.div_ceil(w.layout.rows) * w.layout.rows;
            let mut t0 = 0;
            while t0 < n {
                let chunk = (n - t0).min(self.batch);
                let m = if chunk == 1 { 1 } else { self.batch };
                let mut acts = pack_activations(&x[t0 * k..(t0 + chunk) * k], chunk, k, kp);
                acts.resize(m * kp * 2, 0);
                let shape = Shape {
                    m,
                    k_padded: kp,
                    n_padded: np,
                };
                let out = self.engine.gemm(w, shape, &acts)?;
                let vals = unpack_results(&out, chunk, rows, np);
                y[t0 * rows..(t0 + chunk) * rows].copy_from_slice(&vals);
                t0 += chunk;
            }
        }
        Ok(())
    }
}
