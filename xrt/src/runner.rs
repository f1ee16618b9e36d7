//! The [`KernelRunner`] on a real NPU: the runtime's NPU backend marshals each tiled product
//! into a kernel's buffers, and this runner moves them through XRT and runs the kernel the
//! kernel-set stage named for the shape.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;
use std::sync::Mutex;

use crate::device::{Buffer, Device};
use onebit_kernels::matmul::QMatrix;
use onebit_runtime::error::{Error, Result};
use onebit_runtime::npu::backend::{KernelRunner, Shape, kernel_name};

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
