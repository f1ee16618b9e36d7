//! The pack's weight matrices as the forward pass holds them ([`Weight`]: tiles, or plain bf16
//! rows), binding a pack's tensors to them by name ([`Binder`]), and the products
//! (`Model::matmul`, `Model::matmul_many`): tiles through the model's backend (host kernels or
//! the NPU), bf16 rows on the host.

use std::ops::Range;

use rayon::prelude::*;

use super::Model;
use crate::error::{Error, Result};
use crate::pack::Pack;
use onebit_kernels::matmul::{QMatrix, TileLayout};
use onebit_kernels::ops;

/// A weight matrix of the pack: tiles, or plain bf16 rows (embedding, a bf16 head).
#[derive(Clone, Debug)]
pub(super) enum Weight {
    /// Tiles of `layout`, `rows × k`, at `range` of the pack's mapped tiles.
    Tiled {
        layout: TileLayout,
        rows: usize,
        k: usize,
        range: Range<usize>,
    },
    /// Row-major bf16 `rows × k` at `range`, times `scale`.
    Bf16 {
        rows: usize,
        k: usize,
        range: Range<usize>,
        scale: f32,
    },
}

/// Reads a pack's tensors by name into vectors and [`Weight`]s, checking dtypes and sizes; every
/// error names the pack and the tensor.
pub(super) struct Binder<'p> {
    /// The pack being bound.
    pub pack: &'p Pack,
}

impl Binder<'_> {
    fn missing(&self, name: &str) -> Error {
        Error::Pack {
            pack: self.pack.dir.clone(),
            what: format!("tensor {name} is missing"),
        }
    }

    /// An error about the pack's tensors.
    pub fn bad(&self, what: String) -> Error {
        Error::Pack {
            pack: self.pack.dir.clone(),
            what,
        }
    }

    /// Whether the pack stores `name`.
    pub fn has(&self, name: &str) -> bool {
        self.pack.stored(name).is_some()
    }

    /// A bf16 or f32 vector as f32 (plus one when `add_one`: norms stored as `w − 1`).
    pub fn vector(&self, name: &str, add_one: bool) -> Result<Vec<f32>> {
        let s = self.pack.stored(name).ok_or_else(|| self.missing(name))?;
        let b = self.pack.slice(s.range.clone());
        let v: Vec<f32> = match s.dtype.as_str() {
            "BF16" => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            "F32" => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => return Err(self.bad(format!("{name}: vector of dtype {other}"))),
        };
        Ok(if add_one {
            v.into_iter().map(|x| x + 1.0).collect()
        } else {
            v
        })
    }

    /// [`Binder::vector`] where the pack has the tensor, else `None`.
    pub fn opt_vector(&self, name: &str, add_one: bool) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.vector(name, add_one).map(Some)
        } else {
            Ok(None)
        }
    }

    /// [`Binder::vector`] of exactly `len` values.
    pub fn sized(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.vector(name, false)?;
        if v.len() != len {
            return Err(self.bad(format!("{name}: {} values, expected {len}", v.len())));
        }
        Ok(v)
    }

    /// The `rows × k` matrix `name`: bf16 rows or tiles of a kind the host kernels run.
    pub fn weight(&self, name: &str, rows: usize, k: usize) -> Result<Weight> {
        let dir = &self.pack.dir;
        let s = self.pack.stored(name).ok_or_else(|| self.missing(name))?;
        let e = self.pack.manifest.tensors.get(name);
        let kind = e.map(|e| e.kind.as_str()).unwrap_or(s.dtype.as_str());
        if kind == "BF16" {
            if s.range.len() != rows * k * 2 {
                return Err(self.bad(format!(
                    "{name}: {} bytes, expected {rows}×{k} bf16",
                    s.range.len()
                )));
            }
            return Ok(Weight::Bf16 {
                rows,
                k,
                range: s.range.clone(),
                scale: 1.0,
            });
        }
        let layout = TileLayout::by_name(kind).ok_or_else(|| Error::Refused {
            pack: dir.clone(),
            reason: format!("{name}: no host kernel for tile kind {kind}"),
        })?;
        QMatrix::new(layout, rows, k, self.pack.slice(s.range.clone())).ok_or_else(|| {
            self.bad(format!(
                "{name}: {} bytes do not hold {rows}×{k} in {kind} tiles",
                s.range.len()
            ))
        })?;
        Ok(Weight::Tiled {
            layout,
            rows,
            k,
            range: s.range.clone(),
        })
    }
}

impl Model {
    /// `y = w·x` for `n` rows of `x` (`n × k` → `n × rows`); zero rows return at once.
    pub(super) fn matmul(&self, w: &Weight, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        match w {
            Weight::Tiled {
                layout,
                rows,
                k,
                range,
            } => {
                let data = self.pack.slice(range.clone());
                let m = QMatrix::new(*layout, *rows, *k, data)
                    .ok_or_else(|| Error::Internal("matrix size changed".into()))?;
                self.backend.matmul_many(&[m], x, n, &mut [y])
            }
            Weight::Bf16 {
                rows,
                k,
                range,
                scale,
            } => {
                let data = self.pack.slice(range.clone());
                let (rows, k, scale) = (*rows, *k, *scale);
                // Rows in parallel, each converted once into a per-thread scratch row and
                // multiplied with every token; results land row-major, then transpose.
                let mut by_row = vec![0f32; rows * n];
                by_row
                    .par_chunks_mut(n)
                    .enumerate()
                    .with_min_len(256)
                    .for_each_init(
                        || vec![0f32; k],
                        |row, (r, out)| {
                            for (v, c) in row
                                .iter_mut()
                                .zip(data[r * k * 2..(r + 1) * k * 2].chunks_exact(2))
                            {
                                *v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                            }
                            for (t, o) in out.iter_mut().enumerate() {
                                *o = ops::dot(row, &x[t * k..(t + 1) * k]) * scale;
                            }
                        },
                    );
                for (r, vals) in by_row.chunks_exact(n).enumerate() {
                    for (t, &v) in vals.iter().enumerate() {
                        y[t * rows + r] = v;
                    }
                }
                Ok(())
            }
        }
    }

    /// `h = act(gate·x) ⊙ up·x` in one backend pass when both are tiled and the backend fuses
    /// them; `false` when the caller must run the products and the gate itself.
    pub(super) fn matmul_gated(
        &self,
        gate: &Weight,
        up: &Weight,
        x: &[f32],
        n: usize,
        h: &mut [f32],
    ) -> Result<bool> {
        match (self.qmatrix(gate), self.qmatrix(up)) {
            (Some(g), Some(u)) => self.backend.matmul_gated(&g, &u, x, n, self.spec.act, h),
            _ => Ok(false),
        }
    }

    /// A tiled weight as a matrix over the mapped pack; `None` for bf16 rows.
    fn qmatrix(&self, w: &Weight) -> Option<QMatrix<'_>> {
        match w {
            Weight::Tiled {
                layout,
                rows,
                k,
                range,
            } => QMatrix::new(*layout, *rows, *k, self.pack.slice(range.clone())),
            Weight::Bf16 { .. } => None,
        }
    }

    /// `ys[i] = ws[i]·x` for weights sharing K: one backend call when all are tiled.
    pub(super) fn matmul_many(
        &self,
        ws: &[&Weight],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<()> {
        let mats: Vec<QMatrix<'_>> = ws.iter().filter_map(|w| self.qmatrix(w)).collect();
        if mats.len() == ws.len() {
            return self.backend.matmul_many(&mats, x, n, ys);
        }
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            self.matmul(w, x, n, y)?;
        }
        Ok(())
    }
}
