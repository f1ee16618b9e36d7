//! A tower file's tensors where they are: the mapping, its matrices in place (MM blocks or
//! plain rows, products through [`onebit_kernels::gemm`]), norms and biases read out (a few KB).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;

use half::bf16;
use memmap2::Mmap;
use onebit_kernels::gemm::{Bf16Blocked, Bf16Rows, F32Rows, Operands, Precision, Weights, gemm};
use onebit_pack::mm_block::MmBlock;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::pack::Stored;

/// Where a matrix's values are: bf16 in the file (MM-blocked or row-major), or f32 read out of
/// an F32 tensor (none of FastFlowLM's towers has one; the reader takes them all the same).
pub(super) enum Matrix {
    Blocked {
        range: Range<usize>,
        block: MmBlock,
        blocks_k: usize,
    },
    Bf16(Range<usize>),
    F32(Vec<f32>),
}

/// A linear layer `y = W x + b`, `W` `[out][in]`.
pub(super) struct Linear {
    pub(super) w: Matrix,
    pub(super) b: Vec<f32>,
    pub(super) out: usize,
    pub(super) inp: usize,
}

impl Linear {
    /// `y = x · Wᵀ + b` for `x` of `n × inp` rows, `W` read from `map` (the tower file); `y`
    /// is resized to `n × out` (its allocation reused); products at `precision`.
    pub(super) fn apply_into(&self, map: &[u8], x: &[f32], y: &mut Vec<f32>, precision: Precision) {
        let n = x.len() / self.inp;
        let (out, inp) = (self.out, self.inp);
        y.clear();
        if self.b.is_empty() {
            y.resize(n * out, 0.0);
        } else {
            y.reserve(n * out);
            for _ in 0..n {
                y.extend_from_slice(&self.b);
            }
        }
        let ops = Operands {
            x,
            m: n,
            ldx: inp,
            y,
            ldy: out,
        };
        let w: &dyn Weights = match &self.w {
            Matrix::Blocked {
                range,
                block,
                blocks_k,
            } => &Bf16Blocked {
                bytes: &map[range.clone()],
                block: *block,
                blocks_k: *blocks_k,
                n: out,
                k: inp,
            },
            Matrix::Bf16(range) => &Bf16Rows {
                bytes: &map[range.clone()],
                n: out,
                k: inp,
            },
            Matrix::F32(v) => &F32Rows {
                data: v,
                n: out,
                k: inp,
                stride: inp,
            },
        };
        gemm(w, ops, true, precision);
    }

    /// [`Linear::apply_into`] into a new vector.
    pub(super) fn apply(&self, map: &[u8], x: &[f32], precision: Precision) -> Vec<f32> {
        let mut y = Vec::new();
        self.apply_into(map, x, &mut y, precision);
        y
    }
}

/// A LayerNorm's weight and bias.
pub(super) struct Norm {
    pub(super) w: Vec<f32>,
    pub(super) b: Vec<f32>,
}

impl Norm {
    pub(super) fn apply(&self, x: &[f32], eps: f32) -> Vec<f32> {
        let mut y = Vec::new();
        self.apply_into(x, eps, &mut y);
        y
    }

    /// `y = LayerNorm(x)`, `y`'s allocation reused.
    pub(super) fn apply_into(&self, x: &[f32], eps: f32, y: &mut Vec<f32>) {
        let d = self.w.len();
        y.clear();
        y.extend_from_slice(x);
        y.par_chunks_mut(d).for_each(|row| {
            let mean = row.iter().sum::<f32>() / d as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.w).zip(&self.b) {
                *v = (*v - mean) * inv * w + b;
            }
        });
    }
}

/// A plain tensor's values in the file, read when used.
pub(super) struct Vector {
    range: Range<usize>,
    bf16: bool,
}

impl Vector {
    /// `dst[i] += value i`.
    pub(super) fn add_to(&self, map: &[u8], dst: &mut [f32]) {
        let bytes = &map[self.range.clone()];
        if self.bf16 {
            for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                *d += bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        } else {
            for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// The tower file's tensors.
pub(super) struct Tensors {
    pub(super) path: PathBuf,
    pub(super) map: Mmap,
    pub(super) stored: BTreeMap<String, Stored>,
}

impl Tensors {
    pub(super) fn bad(&self, what: String) -> Error {
        Error::Pack {
            pack: self.path.clone(),
            what,
        }
    }

    pub(super) fn stored(&self, name: &str) -> Result<&Stored> {
        let s = self
            .stored
            .get(name)
            .ok_or_else(|| self.bad(format!("no tensor {name}")))?;
        match s.dtype.as_str() {
            "BF16" | "F32" => Ok(s),
            other => Err(self.bad(format!("{name}: dtype {other} in a vision tower"))),
        }
    }

    /// A plain tensor of `len` values, where it is.
    pub(super) fn span(&self, name: &str, len: usize) -> Result<Vector> {
        let s = self.stored(name)?;
        let bf16 = s.dtype == "BF16";
        let have = s.range.len() / if bf16 { 2 } else { 4 };
        if have != len {
            return Err(self.bad(format!("{name}: {have} values, the config needs {len}")));
        }
        Ok(Vector {
            range: s.range.clone(),
            bf16,
        })
    }

    /// A plain tensor of `len` values, read as f32 (norms, biases: a few KB).
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let span = self.span(name, len)?;
        let mut v = vec![0.0f32; len];
        span.add_to(&self.map, &mut v);
        Ok(v)
    }

    /// Where an `n × k` projection is: its MM blocks (a three-dimensional shape that is a known
    /// geometry's for `n × k`), or plain rows (two or four dimensions of `n·k` values, the
    /// patch convolution's included).
    pub(super) fn matrix(&self, name: &str, n: usize, k: usize) -> Result<Matrix> {
        let s = self.stored(name)?;
        let block = MmBlock::KNOWN
            .into_iter()
            .find(|b| s.shape.as_slice() == b.declared_shape(n as u64, k as u64).as_slice());
        let Some(block) = block else {
            let values = s.shape.iter().product::<u64>() as usize;
            // Three dimensions are the blocked layout's; another geometry is not guessed at.
            if values != n * k || s.shape.len() == 3 {
                return Err(self.bad(format!(
                    "{name}: declared {:?} is neither {n}x{k} nor a known MM-block layout of it",
                    s.shape
                )));
            }
            if s.dtype == "F32" {
                return Ok(Matrix::F32(self.vector(name, n * k)?));
            }
            return Ok(Matrix::Bf16(self.span(name, n * k)?.range));
        };
        let values = s.shape.iter().product::<u64>() as usize;
        if s.dtype != "BF16" || s.range.len() != 2 * values {
            return Err(self.bad(format!(
                "{name}: {} {} bytes, the MM blocks of {n}x{k} are {values} bf16 values",
                s.dtype,
                s.range.len(),
            )));
        }
        Ok(Matrix::Blocked {
            range: s.range.clone(),
            block,
            blocks_k: s.shape[1] as usize,
        })
    }

    pub(super) fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            w: self.matrix(&format!("{prefix}.weight"), out, inp)?,
            b: self.vector(&format!("{prefix}.bias"), out)?,
            out,
            inp,
        })
    }

    pub(super) fn norm(&self, prefix: &str, d: usize) -> Result<Norm> {
        Ok(Norm {
            w: self.vector(&format!("{prefix}.weight"), d)?,
            b: self.vector(&format!("{prefix}.bias"), d)?,
        })
    }
}
