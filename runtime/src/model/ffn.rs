//! The gated FFN of every layer: `down(act(gate·x) ⊙ up·x)`, SiLU or tanh-approximated GELU.

use rayon::prelude::*;

use super::weight::{Binder, Weight};
use super::{Model, PARALLEL_ROWS};
use crate::error::Result;
use onebit_kernels::ops;

/// One layer's FFN matrices.
pub(super) struct Ffn {
    gate: Weight,
    up: Weight,
    down: Weight,
}

/// The FFN's intermediate rows, allocated once per pass and reused by every layer.
pub(super) struct Scratch {
    g: Vec<f32>,
    /// The up product's rows, only where the backend does not gate in one pass (allocated on
    /// first use).
    u: Vec<f32>,
}

impl Scratch {
    /// Room for `rows` rows of an `ffn`-wide FFN.
    pub fn new(rows: usize, ffn: usize) -> Scratch {
        Scratch {
            g: vec![0f32; rows * ffn],
            u: Vec::new(),
        }
    }
}

impl Ffn {
    /// Binds layer `i`'s `mlp.{gate,up,down}_proj` (`ffn × hidden`, `hidden × ffn`).
    pub fn load(b: &Binder<'_>, i: usize, hidden: usize, ffn: usize) -> Result<Ffn> {
        let n = |s: &str| format!("model.layers.{i}.mlp.{s}");
        Ok(Ffn {
            gate: b.weight(&n("gate_proj.weight"), ffn, hidden)?,
            up: b.weight(&n("up_proj.weight"), ffn, hidden)?,
            down: b.weight(&n("down_proj.weight"), hidden, ffn)?,
        })
    }

    /// The matrices, for the kernel self-check.
    pub fn weights(&self) -> [&Weight; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// `out = down(act(gate·x) ⊙ up·x)` for the `n` rows of `x` (layer `layer`'s inputs are
    /// recorded while collecting statistics).
    pub fn forward(
        &self,
        m: &Model,
        layer: usize,
        x: &[f32],
        n: usize,
        sc: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (g, u) = (&mut sc.g, &mut sc.u);
        let lname = |s: &str| format!("model.layers.{layer}.{s}");
        let rec = m.recording();
        if rec {
            m.record(
                &[lname("mlp.gate_proj.weight"), lname("mlp.up_proj.weight")],
                x,
                n,
            );
        }
        let ffn = m.spec.ffn;
        let g = &mut g[..n * ffn];
        if !m.matmul_gated(&self.gate, &self.up, x, n, g)? {
            if u.len() < n * ffn {
                u.resize(n * ffn, 0.0);
            }
            let u = &mut u[..n * ffn];
            m.matmul_many(&[&self.gate, &self.up], x, n, &mut [&mut g[..], &mut u[..]])?;
            let act = m.spec.act;
            let gate = |(g, u): (&mut [f32], &[f32])| ops::gate_rows(act, g, u);
            if n >= PARALLEL_ROWS {
                g.par_chunks_mut(ffn).zip(u.par_chunks(ffn)).for_each(gate);
            } else {
                gate((&mut g[..], &u[..]));
            }
        }
        if rec {
            m.record(&[lname("mlp.down_proj.weight")], g, n);
        }
        m.matmul(&self.down, g, n, out)
    }
}
