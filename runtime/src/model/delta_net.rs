//! Qwen3.5's gated DeltaNet ([`onebit_pack::spec::Mixer::GatedDeltaNet`]): q, k, v through a causal
//! convolution and SiLU, L2-normalised q and k, the delta rule on a per-sequence state per value
//! head (decay from α, step from β), a gated RMSNorm with the output gate z, and the output
//! projection.

use rayon::prelude::*;

use super::mixer::{Mixing, Pass};
use super::weight::{Binder, Weight};
use super::{Model, PARALLEL_ROWS};
use crate::error::Result;
use onebit_kernels::ops;
use onebit_pack::spec::ValueHeadOrder;

/// The gated DeltaNet of one layer.
pub(super) struct DeltaNet {
    /// `(2·KD + VD) × H`: q, k, v.
    qkv: Weight,
    /// `VD × H`: the output gate z.
    z: Weight,
    /// `nV × H` each: the decay input α and the step input β.
    alpha: Weight,
    beta: Weight,
    /// `H × VD`.
    out: Weight,
    /// `[kernel][2·KD + VD]` (the pack stores them so), tap `kernel − 1` on the current position.
    taps: Vec<f32>,
    /// `−exp(A_log)` per value head.
    ssm_a: Vec<f32>,
    /// Per value head, added to α before the softplus.
    dt_bias: Vec<f32>,
    /// `value_dim` gains of the gated output norm.
    norm: Vec<f32>,
    dims: DeltaDims,
}

/// A gated-DeltaNet layer's geometry.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeltaDims {
    pub nk: usize,
    pub dk: usize,
    pub nv: usize,
    pub dv: usize,
    pub kernel: usize,
    pub order: ValueHeadOrder,
}

impl DeltaDims {
    /// Convolution channels: q, k and v.
    fn channels(&self) -> usize {
        2 * self.nk * self.dk + self.nv * self.dv
    }
    /// Floats of one sequence's delta-rule state.
    fn state(&self) -> usize {
        self.nv * self.dk * self.dv
    }
}

impl DeltaNet {
    /// Binds layer `i`'s `linear_attn.*` tensors and its output gate for the geometry `dims` over
    /// `h` channels.
    pub fn load(b: &Binder<'_>, i: usize, h: usize, dims: DeltaDims) -> Result<DeltaNet> {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        let DeltaDims {
            nk: key_heads,
            nv: value_heads,
            dv: value_dim,
            kernel,
            ..
        } = dims;
        if key_heads == 0 || value_heads % key_heads != 0 || kernel == 0 {
            return Err(b.bad(format!(
                "layer {i}: {value_heads} value heads over {key_heads} key heads, {kernel} taps"
            )));
        }
        let (c, vd) = (dims.channels(), value_heads * value_dim);
        // α and β: the exact bf16 copy where the pack has one (FastFlowLM writes both), else the
        // tiles.
        let small = |proj: &str| -> Result<Weight> {
            let copy = n(&format!("linear_attn.{proj}.bf16.weight"));
            if b.has(&copy) {
                b.weight(&copy, value_heads, h)
            } else {
                b.weight(&n(&format!("linear_attn.{proj}.weight")), value_heads, h)
            }
        };
        Ok(DeltaNet {
            qkv: b.weight(&n("linear_attn.qkv_proj.weight"), c, h)?,
            z: b.weight(&n("self_attn.gate_proj.weight"), vd, h)?,
            alpha: small("ssm_alpha_proj")?,
            beta: small("ssm_beta_proj")?,
            out: b.weight(&n("linear_attn.ssm_out_proj.weight"), h, vd)?,
            taps: b.sized(&n("linear_attn.ssm_conv1d.weight"), kernel * c)?,
            ssm_a: b.sized(&n("linear_attn.ssm_a"), value_heads)?,
            dt_bias: b.sized(&n("linear_attn.ssm_dt.bias"), value_heads)?,
            norm: b.sized(&n("linear_attn.ssm_norm.weight"), value_dim)?,
            dims,
        })
    }
}

impl Mixing for DeltaNet {
    fn forward(
        &self,
        m: &Model,
        li: usize,
        hbuf: &[f32],
        pass: &mut Pass<'_, '_>,
        out: &mut [f32],
    ) -> Result<()> {
        let dd = self.dims;
        let n = pass.rows();
        let lname = |s: &str| format!("model.layers.{li}.{s}");
        let rec = m.recording();
        if rec {
            m.record(
                &[
                    lname("linear_attn.qkv_proj.weight"),
                    lname("self_attn.gate_proj.weight"),
                    lname("linear_attn.ssm_alpha_proj.weight"),
                    lname("linear_attn.ssm_beta_proj.weight"),
                ],
                hbuf,
                n,
            );
        }
        let vd = dd.nv * dd.dv;
        let mut qkv = vec![0f32; n * dd.channels()];
        let mut z = vec![0f32; n * vd];
        let mut alpha = vec![0f32; n * dd.nv];
        let mut beta = vec![0f32; n * dd.nv];
        m.matmul_many(
            &[&self.qkv, &self.z],
            hbuf,
            n,
            &mut [&mut qkv[..], &mut z[..]],
        )?;
        m.matmul_many(
            &[&self.alpha, &self.beta],
            hbuf,
            n,
            &mut [&mut alpha[..], &mut beta[..]],
        )?;
        let mut conv = pass.conv_states(li);
        let mut ssm = pass.ssm_states(li);
        let mut y = vec![0f32; n * vd];
        let inputs = DeltaInputs {
            qkv: &qkv,
            z: &z,
            alpha: &alpha,
            beta: &beta,
        };
        delta_net(
            self,
            inputs,
            &pass.seq_pos,
            &mut conv,
            &mut ssm,
            &mut y,
            m.spec.eps,
        );
        pass.defer_conv(li, conv);
        pass.defer_ssm(li, ssm);
        if rec {
            m.record(&[lname("linear_attn.ssm_out_proj.weight")], &y, n);
        }
        m.matmul(&self.out, &y, n, out)
    }

    fn weights(&self) -> Vec<&Weight> {
        vec![&self.qkv, &self.z, &self.alpha, &self.beta, &self.out]
    }

    fn conv_state(&self) -> usize {
        (self.dims.kernel - 1) * self.dims.channels()
    }

    fn ssm_state(&self) -> usize {
        self.dims.state()
    }
}

#[derive(Clone, Copy)]
struct DeltaInputs<'a> {
    /// `[rows][2·KD + VD]`: q, k, v before the convolution.
    qkv: &'a [f32],
    /// `[rows][VD]`: the output gate.
    z: &'a [f32],
    /// `[rows][nV]` each.
    alpha: &'a [f32],
    beta: &'a [f32],
}

/// `ln(1 + eˣ)`, linear above 20 as torch's softplus.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The gated DeltaNet over the rows at `seq_pos` (rows of one sequence in order): the causal
/// convolution + SiLU over q, k, v (advancing `conv[i]`), L2-normalised q and k, the delta rule
/// per value head on `ssm[i]` (one task per sequence and head, each over its sequence's rows in
/// order), and the gated RMSNorm into `y` (`[rows][VD]`). Prefill and token-by-token steps run
/// the same arithmetic per row, so they leave the same state.
fn delta_net(
    d: &DeltaNet,
    x: DeltaInputs<'_>,
    seq_pos: &[(usize, usize)],
    conv: &mut [Vec<f32>],
    ssm: &mut [Vec<f32>],
    y: &mut [f32],
    eps: f32,
) {
    let dd = d.dims;
    let (c, kern) = (dd.channels(), dd.kernel);
    let (nk, dk, nv, dv) = (dd.nk, dd.dk, dd.nv, dd.dv);
    let n = seq_pos.len();
    let mut xc = vec![0f32; n * c];
    for (t, &(i, _)) in seq_pos.iter().enumerate() {
        let input = &x.qkv[t * c..(t + 1) * c];
        let st = &mut conv[i];
        let out = &mut xc[t * c..(t + 1) * c];
        let last = &d.taps[(kern - 1) * c..kern * c];
        for ((o, &w), &v) in out.iter_mut().zip(last).zip(input) {
            *o = w * v;
        }
        for j in 0..kern - 1 {
            let (w, past) = (&d.taps[j * c..(j + 1) * c], &st[j * c..(j + 1) * c]);
            for ((o, &w), &v) in out.iter_mut().zip(w).zip(past) {
                *o += w * v;
            }
        }
        for o in out.iter_mut() {
            *o = ops::silu(*o);
        }
        if kern > 1 {
            st.copy_within(c.., 0);
            st[(kern - 2) * c..].copy_from_slice(input);
        }
    }
    // q and k heads to unit length (eps 1e-6 inside the root, as transformers' l2norm); q also
    // × 1/√dk.
    let q_scale = 1.0 / (dk as f32).sqrt();
    let unit = |row: &mut [f32]| {
        for (hd, head) in row[..2 * nk * dk].chunks_exact_mut(dk).enumerate() {
            let inv = 1.0 / (ops::dot(head, head) + 1e-6).sqrt();
            let s = if hd < nk { inv * q_scale } else { inv };
            for v in head.iter_mut() {
                *v *= s;
            }
        }
    };
    if n >= PARALLEL_ROWS {
        xc.par_chunks_exact_mut(c).for_each(unit);
    } else {
        xc.chunks_exact_mut(c).for_each(unit);
    }
    let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); conv.len()];
    for (t, &(i, _)) in seq_pos.iter().enumerate() {
        rows_of[i].push(t);
    }
    let tasks: Vec<(usize, usize, &mut [f32])> = ssm
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| !rows_of[*i].is_empty())
        .flat_map(|(i, st)| {
            st.chunks_exact_mut(dk * dv)
                .enumerate()
                .map(move |(h, s)| (i, h, s))
        })
        .collect();
    let xc = &xc;
    let outs: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(i, h, s)| {
            let kh = dd.order.key_head(h, nk, nv);
            let rows = &rows_of[i];
            let mut out = vec![0f32; rows.len() * dv];
            let mut kv = vec![0f32; dv];
            for (r, &t) in rows.iter().enumerate() {
                let row = &xc[t * c..(t + 1) * c];
                let q = &row[kh * dk..(kh + 1) * dk];
                let k = &row[nk * dk + kh * dk..nk * dk + (kh + 1) * dk];
                let v = &row[2 * nk * dk + h * dv..2 * nk * dk + (h + 1) * dv];
                let decay = (d.ssm_a[h] * softplus(x.alpha[t * nv + h] + d.dt_bias[h])).exp();
                let beta = ops::sigmoid(x.beta[t * nv + h]);
                // S ← decay·S; kv = Sᵀk; δ = β(v − kv); S += k δᵀ; o = Sᵀq.
                kv.fill(0.0);
                for (srow, &kk) in s.chunks_exact_mut(dv).zip(k) {
                    for e in srow.iter_mut() {
                        *e *= decay;
                    }
                    ops::axpy(&mut kv, kk, srow);
                }
                for (e, &vv) in kv.iter_mut().zip(v) {
                    *e = (vv - *e) * beta;
                }
                let o = &mut out[r * dv..(r + 1) * dv];
                for ((srow, &kk), &qq) in s.chunks_exact_mut(dv).zip(k).zip(q) {
                    ops::axpy(srow, kk, &kv);
                    ops::axpy(o, qq, srow);
                }
            }
            (i, h, out)
        })
        .collect();
    let vd = nv * dv;
    for (i, h, out) in outs {
        for (&t, o) in rows_of[i].iter().zip(out.chunks_exact(dv)) {
            y[t * vd + h * dv..t * vd + (h + 1) * dv].copy_from_slice(o);
        }
    }
    // RMSNorm per head (no mean), × ssm_norm × SiLU(z).
    for (yt, zt) in y.chunks_exact_mut(vd).zip(x.z.chunks_exact(vd)) {
        for (head, zh) in yt.chunks_exact_mut(dv).zip(zt.chunks_exact(dv)) {
            let inv = 1.0 / (ops::dot(head, head) / dv as f32 + eps).sqrt();
            for ((e, &w), &g) in head.iter_mut().zip(&d.norm).zip(zh) {
                *e = *e * inv * w * ops::silu(g);
            }
        }
    }
}
