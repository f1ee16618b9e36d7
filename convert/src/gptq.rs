//! GPTQ (Frantar et al., 2022, "Accurate Post-Training Quantization for Generative Pre-trained
//! Transformers") for unsigned 4-bit groups: a row's columns are quantized in order and each
//! column's rounding error is pushed onto the columns not yet quantized, weighted by the inverse
//! of the inputs' second-moment matrix `H = E[x xᵀ]`, so what is minimized is the error of the
//! layer's *output* on the calibration activations, not of the weights. Each 32-column group's
//! scale and zero-point are chosen (with the clipping search of [`super::groups`]) from the
//! already-compensated values when the row reaches the group, as GPTQ does with groups.
//!
//! The linear algebra is a damped Cholesky factorization and a triangular inverse of one `K × K`
//! matrix per weight (K ≤ a few thousand, once per matrix at conversion): about thirty lines here,
//! rather than a dense linear-algebra dependency for two routines.

use half::bf16;
use rayon::prelude::*;

use super::groups::{Group, quantize_q41};

/// Σ a·b with four partial sums (vectorizes; the order is fixed).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f64>() + tail
}

/// The upper-triangular `U` with `H⁻¹ = Uᵀ U` for one matrix's inputs, row-major `k × k`.
#[derive(Clone, Debug)]
pub struct InverseFactor {
    k: usize,
    u: Vec<f32>,
}

/// Relative damping added to the diagonal of `H` (GPTQ's `percdamp`).
pub const DAMP: f64 = 0.01;

impl InverseFactor {
    /// From the mean second moments `h` (`k × k`, row-major, symmetric: `E[x_i x_j]`), damped by
    /// `DAMP ×` the mean diagonal. Columns never seen (zero diagonal) get the damping alone.
    /// `None` when `h` is not positive definite even after damping.
    pub fn new(h: &[f64], k: usize) -> Option<InverseFactor> {
        if h.len() != k * k || k == 0 {
            return None;
        }
        let mean_diag = (0..k).map(|i| h[i * k + i]).sum::<f64>() / k as f64;
        let damp = (DAMP * mean_diag).max(1e-12);
        // Reversed order: A = J H J, so that A = L Lᵀ gives H⁻¹ = Uᵀ U with U = J L⁻¹ J upper.
        let mut a = vec![0f64; k * k];
        for i in 0..k {
            for j in 0..k {
                a[i * k + j] = h[(k - 1 - i) * k + (k - 1 - j)];
            }
            a[i * k + i] += damp;
        }
        // Cholesky, lower, in place, left-looking by column: L[j][j] from row j, then every
        // L[i][j] (i > j) in parallel, each a dot product of two row prefixes.
        for j in 0..k {
            let (head, tail) = a.split_at_mut((j + 1) * k);
            let row_j = &mut head[j * k..];
            let v = row_j[j] - dot(&row_j[..j], &row_j[..j]);
            if v <= 0.0 || !v.is_finite() {
                return None;
            }
            let d = v.sqrt();
            row_j[j] = d;
            let row_j = &head[j * k..j * k + j];
            tail.par_chunks_mut(k).for_each(|row_i| {
                row_i[j] = (row_i[j] - dot(&row_i[..j], row_j)) / d;
            });
        }
        // L⁻¹ by columns (each a forward substitution, independent): column c is stored as row
        // c of `inv_t`, so both operands of the inner product are contiguous.
        let mut inv_t = vec![0f64; k * k];
        inv_t.par_chunks_mut(k).enumerate().for_each(|(c, col)| {
            col[c] = 1.0 / a[c * k + c];
            for i in c + 1..k {
                col[i] = -dot(&a[i * k + c..i * k + i], &col[c..i]) / a[i * k + i];
            }
        });
        // U = J L⁻¹ J: U[i][j] = L⁻¹[k−1−i][k−1−j], upper because L⁻¹ is lower.
        let mut u = vec![0f32; k * k];
        for i in 0..k {
            for j in i..k {
                u[i * k + j] = inv_t[(k - 1 - j) * k + (k - 1 - i)] as f32;
            }
        }
        Some(InverseFactor { k, u })
    }

    /// K.
    pub fn k(&self) -> usize {
        self.k
    }
}

/// Quantizes one row (`x.len() == k`, a multiple of 32) into unsigned 4-bit groups with error
/// compensation through `f`; `importance` (mean x² per column) steers each group's clipping
/// search as in the plain path.
pub fn quantize_row(
    x: &[f32],
    f: &InverseFactor,
    importance: Option<&[f32]>,
    out: &mut Vec<Group>,
) {
    let k = f.k;
    debug_assert_eq!(x.len(), k);
    out.clear();
    let mut w: Vec<f32> = x.to_vec();
    for g in 0..k / 32 {
        let c0 = g * 32;
        let imp = importance.map(|v| &v[c0..c0 + 32]);
        let mut group = quantize_q41(&w[c0..c0 + 32], imp);
        let d = bf16::from_bits(group.d).to_f32();
        let m = bf16::from_bits(group.m).to_f32();
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for j in 0..32 {
            let c = c0 + j;
            let code = ((w[c] - m) * id).round().clamp(0.0, 15.0);
            group.q[j] = code as u8;
            let diag = f.u[c * k + c];
            if diag == 0.0 {
                continue;
            }
            let e = (w[c] - (d * code + m)) / diag;
            let row = &f.u[c * k + c + 1..(c + 1) * k];
            for (wi, &ui) in w[c + 1..].iter_mut().zip(row) {
                *wi -= e * ui;
            }
        }
        out.push(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onebit_stages::format::tiles::Codes;

    fn rng(seed: u64) -> impl FnMut() -> f64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    /// `E[x xᵀ]` of `n` samples of `k` values.
    fn second_moments(x: &[f64], n: usize, k: usize) -> Vec<f64> {
        let mut h = vec![0f64; k * k];
        for t in 0..n {
            for i in 0..k {
                for j in 0..k {
                    h[i * k + j] += x[t * k + i] * x[t * k + j] / n as f64;
                }
            }
        }
        h
    }

    #[test]
    fn the_factor_satisfies_its_definition() {
        let k = 40;
        let mut r = rng(3);
        // H = Bᵀ B / n: positive definite for n ≫ k.
        let n = 200;
        let b: Vec<f64> = (0..n * k).map(|_| r()).collect();
        let mut h = second_moments(&b, n, k);
        let f = InverseFactor::new(&h, k).expect("positive definite");
        // (Uᵀ U) · (H + damp I) = I.
        let mean_diag = (0..k).map(|i| h[i * k + i]).sum::<f64>() / k as f64;
        for i in 0..k {
            h[i * k + i] += DAMP * mean_diag;
        }
        for i in 0..k {
            for j in 0..k {
                let v: f64 = (0..k)
                    .map(|p| {
                        let hinv: f64 = (0..k)
                            .map(|q| f.u[q * k + i] as f64 * f.u[q * k + p] as f64)
                            .sum();
                        hinv * h[p * k + j]
                    })
                    .sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-3, "[{i}][{j}] = {v}");
            }
        }
        for i in 0..k {
            for j in 0..i {
                assert_eq!(f.u[i * k + j], 0.0, "U is upper");
            }
        }
    }

    #[test]
    fn compensation_lowers_the_output_error_on_correlated_inputs() {
        // Inputs with strongly correlated columns, as real activations have: GPTQ must beat
        // independent rounding on ‖(W − Ŵ) X‖ while storing the same kind of groups.
        let (k, n, rows) = (64, 400, 24);
        let mut r = rng(9);
        let base: Vec<f64> = (0..n * 4).map(|_| r()).collect();
        let x: Vec<f64> = (0..n * k)
            .map(|i| {
                let (t, c) = (i / k, i % k);
                base[t * 4 + c % 4] * (1.0 + c as f64 / k as f64) + 0.05 * r()
            })
            .collect();
        let h = second_moments(&x, n, k);
        let f = InverseFactor::new(&h, k).expect("factor");
        let out_err = |w: &[f32], gs: &[Group]| -> f64 {
            (0..n)
                .map(|t| {
                    let e: f64 = (0..k)
                        .map(|c| {
                            let q = gs[c / 32].value(Codes::Unsigned4, c % 32) as f64;
                            (w[c] as f64 - q) * x[t * k + c]
                        })
                        .sum();
                    e * e
                })
                .sum()
        };
        let (mut plain, mut gptq) = (0f64, 0f64);
        let mut gs = Vec::new();
        for _ in 0..rows {
            let w: Vec<f32> = (0..k).map(|_| r() as f32).collect();
            super::super::groups::quantize_row(&w, Codes::Unsigned4, None, &mut gs);
            plain += out_err(&w, &gs);
            quantize_row(&w, &f, None, &mut gs);
            assert_eq!(gs.len(), k / 32);
            gptq += out_err(&w, &gs);
        }
        assert!(gptq < 0.7 * plain, "gptq {gptq} vs plain {plain}");
    }
}
