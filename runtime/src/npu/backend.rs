//! The NPU backend: every tiled product of a layer goes through the buffers an NPU kernel reads
//! and writes ([`super::marshal`]): the matrix's tiles byte for byte, activations as bf16
//! `[m][k_padded]`, results as bf16 `[m][n_padded]`. A [`KernelRunner`] runs one kernel on those
//! bytes: the device through XRT (feature `npu`, [`XrtRunner`]) or [`Emulator`], which computes
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

#[cfg(feature = "npu")]
pub use device::XrtRunner;

#[cfg(feature = "npu")]
mod device {
    use std::collections::HashMap;
    use std::collections::hash_map::Entry;
    use std::path::Path;
    use std::sync::Mutex;

    use super::{KernelRunner, Shape, kernel_name};
    use crate::error::{Error, Result};
    use crate::npu::xrt::{Buffer, Device};
    use onebit_kernels::matmul::QMatrix;

    /// Kernel arguments, in order: weights (the tiles), activations, results.
    const ARG_WEIGHTS: u32 = 0;
    const ARG_ACTS: u32 = 1;
    const ARG_OUT: u32 = 2;
    const TIMEOUT_MS: u32 = 10_000;

    struct State {
        dev: Device,
        /// Weight buffers by the tiles' address in the mapped pack: uploaded once.
        weights: HashMap<usize, Buffer>,
        /// Activation and result buffers by kernel.
        io: HashMap<String, (Buffer, Buffer)>,
    }

    /// The device: one opened NPU with the kernel set's xclbin loaded once (one hardware
    /// context per model where XRT has them), weight buffers uploaded on first use and kept,
    /// one activation and one result buffer per kernel.
    pub struct XrtRunner {
        state: Mutex<State>,
    }

    impl XrtRunner {
        /// Opens the NPU (refusing by name when there is none) and loads `xclbin`.
        pub fn open(xclbin: &Path) -> Result<XrtRunner> {
            let mut dev = Device::open()?;
            dev.load_xclbin(xclbin)?;
            Ok(XrtRunner {
                state: Mutex::new(State {
                    dev,
                    weights: HashMap::new(),
                    io: HashMap::new(),
                }),
            })
        }
    }

    impl KernelRunner for XrtRunner {
        fn name(&self) -> &'static str {
            "xrt"
        }

        fn gemm(&self, w: &QMatrix<'_>, shape: Shape, acts: &[u8]) -> Result<Vec<u8>> {
            let name = kernel_name(shape.m as u64, shape.k_padded as u64, shape.n_padded as u64);
            let mut st = self
                .state
                .lock()
                .map_err(|_| Error::Npu("the NPU engine's lock is poisoned".into()))?;
            let State { dev, weights, io } = &mut *st;
            let key = w.data.as_ptr() as usize;
            if let Entry::Vacant(e) = weights.entry(key) {
                let mut b = dev.buffer(&name, ARG_WEIGHTS, w.data.len())?;
                b.write(w.data)?;
                e.insert(b);
            }
            if let Entry::Vacant(e) = io.entry(name.clone()) {
                let a = dev.buffer(&name, ARG_ACTS, acts.len())?;
                let o = dev.buffer(&name, ARG_OUT, shape.m * shape.n_padded * 2)?;
                e.insert((a, o));
            }
            let (Some(wb), Some((ab, ob))) = (weights.get(&key), io.get_mut(&name)) else {
                return Err(Error::Internal("NPU buffers vanished".into()));
            };
            ab.write(acts)?;
            dev.run(&name, &[wb, &*ab, &*ob], TIMEOUT_MS)?;
            let mut out = vec![0u8; shape.m * shape.n_padded * 2];
            ob.read(&mut out)?;
            Ok(out)
        }
    }
}
