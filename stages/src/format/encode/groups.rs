//! 32-column quantization groups: the unit every tile kind stores (one scale, an optional
//! zero-point, 32 codes), made either natively from a GGUF block of the same kind (codes copied,
//! fp16 scales rounded to bf16, as FastFlowLM's converter does) or by requantizing f32 values.

use half::{bf16, f16};

use crate::format::gguf::GgmlType;
use crate::format::native::{NativeCopy, native_copy};
use crate::format::tiles::Codes;

/// One quantization group as a tile stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// Scale, bf16 bits.
    pub d: u16,
    /// Zero-point (Q4_1 `m`), bf16 bits; 0 for symmetric kinds.
    pub m: u16,
    /// Codes: 0..15 for unsigned 4-bit, the two's-complement nibble for signed 4-bit, the int8
    /// bits for 8-bit.
    pub q: [u8; 32],
}

impl Group {
    /// The value of element `j` as a reader decodes it (f32 arithmetic, no fused multiply-add).
    pub fn value(&self, codes: Codes, j: usize) -> f32 {
        let d = bf16::from_bits(self.d).to_f32();
        let m = bf16::from_bits(self.m).to_f32();
        match codes {
            Codes::Unsigned4 => d * self.q[j] as f32 + m,
            Codes::Signed4 => d * (((self.q[j] << 4) as i8) >> 4) as f32,
            Codes::Signed8 => d * (self.q[j] as i8) as f32,
            Codes::Fp4 => f32::NAN,
        }
    }
}

/// How a source type reaches a code kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Method {
    /// Codes copied, scales rounded fp16 → bf16 (the reference converter's path).
    Native,
    /// Codes copied and the zero-point derived exactly (Q4_0 into an unsigned kind: m = −8·d).
    Exact,
    /// Dequantized to f32 and quantized again.
    Requantized,
    /// Requantized with GPTQ's error compensation on calibration inputs ([`super::gptq`]).
    Gptq,
}

impl From<NativeCopy> for Method {
    fn from(c: NativeCopy) -> Method {
        match c {
            NativeCopy::Native => Method::Native,
            NativeCopy::Exact => Method::Exact,
        }
    }
}

/// The native method for `ty` into `codes`, if there is one (the codes verification accepts as
/// "same source", [`native_copy`]).
pub fn native_method(ty: GgmlType, codes: Codes) -> Option<Method> {
    native_copy(ty, codes).map(Method::from)
}

fn bf16_of_f16(lo: u8, hi: u8) -> u16 {
    bf16::from_f32(f16::from_le_bytes([lo, hi]).to_f32()).to_bits()
}

/// Groups of one row of a Q4_1 / Q4_0 / Q8_0 source copied natively (see [`native_method`]).
/// `row` is the row's raw GGUF bytes.
pub fn native_row(ty: GgmlType, codes: Codes, row: &[u8], out: &mut Vec<Group>) {
    out.clear();
    match ty {
        GgmlType::Q4_1 => {
            for b in row.chunks_exact(20) {
                let mut q = [0u8; 32];
                for j in 0..16 {
                    q[j] = b[4 + j] & 0x0F;
                    q[j + 16] = b[4 + j] >> 4;
                }
                out.push(Group {
                    d: bf16_of_f16(b[0], b[1]),
                    m: bf16_of_f16(b[2], b[3]),
                    q,
                });
            }
        }
        GgmlType::Q4_0 => {
            for b in row.chunks_exact(18) {
                let mut u = [0u8; 32];
                for j in 0..16 {
                    u[j] = b[2 + j] & 0x0F;
                    u[j + 16] = b[2 + j] >> 4;
                }
                let d = bf16_of_f16(b[0], b[1]);
                let g = if codes == Codes::Unsigned4 {
                    // w = d·(u − 8) = d·u + (−8·d); −8·d is exact in bf16.
                    let m = bf16::from_f32(-8.0 * bf16::from_bits(d).to_f32()).to_bits();
                    Group { d, m, q: u }
                } else {
                    Group {
                        d,
                        m: 0,
                        q: u.map(|c| c.wrapping_sub(8) & 0x0F),
                    }
                };
                out.push(g);
            }
        }
        GgmlType::Q8_0 => {
            for b in row.chunks_exact(34) {
                let mut q = [0u8; 32];
                q.copy_from_slice(&b[2..34]);
                out.push(Group {
                    d: bf16_of_f16(b[0], b[1]),
                    m: 0,
                    q,
                });
            }
        }
        _ => {}
    }
}

/// Quantizes one row of f32 values (length a multiple of 32) into groups of `codes`.
///
/// Unsigned 4-bit: min/max start (as ggml's `quantize_row_q4_1_ref`), then two rounds of a
/// least-squares refit of (d, m) for the chosen codes; every candidate is scored with the bf16
/// scales it will really be stored with, and the best is kept. Signed 4-bit: ggml's Q4_0 rule
/// (d = max/−8, the signed extreme). 8-bit: d = amax/127. Codes are always computed from the
/// bf16-rounded scales, so the stored group is the best for what a reader will see.
///
/// `importance` (one weight per column, e.g. the mean x² of the activations that multiply it)
/// makes the unsigned 4-bit search and refit minimize Σ w·error² instead of Σ error².
pub fn quantize_row(x: &[f32], codes: Codes, importance: Option<&[f32]>, out: &mut Vec<Group>) {
    out.clear();
    for (i, g) in x.chunks_exact(32).enumerate() {
        let w = importance.map(|w| &w[i * 32..i * 32 + 32]);
        out.push(match codes {
            Codes::Unsigned4 => quantize_q41(g, w),
            Codes::Signed4 => quantize_q40(g),
            Codes::Signed8 => quantize_q8(g),
            Codes::Fp4 => Group {
                d: 0,
                m: 0,
                q: [0; 32],
            },
        });
    }
}

fn bf(v: f32) -> (u16, f32) {
    let b = bf16::from_f32(v);
    (b.to_bits(), b.to_f32())
}

fn codes_q41(x: &[f32], d: f32, m: f32, w: Option<&[f32]>) -> ([u8; 32], f32) {
    let mut q = [0u8; 32];
    let mut err = 0f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (j, &v) in x.iter().enumerate() {
        let c = ((v - m) * id).round().clamp(0.0, 15.0);
        q[j] = c as u8;
        let e = d * c + m - v;
        err += e * e * w.map_or(1.0, |w| w[j]);
    }
    (q, err)
}

/// Clipping steps tried at each end of the block's range (in 1/48ths of the range).
const CLIP_STEPS: usize = 4;

/// One 32-value group quantized with a zero-point (Q4_1 rule, min/max with a small clipping
/// search, optionally weighted by `w`); GPTQ calls it per group as it compensates.
pub fn quantize_q41(x: &[f32], w: Option<&[f32]>) -> Group {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in x {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let range = hi - lo;
    let mut best: Option<(f32, Group)> = None;
    // Search clipped ranges (as ggml's make_qkx2_quants does for Q4_K): the extremes of a
    // Gaussian block cost more as coarser steps than they gain when clipped. Each candidate is
    // refit by least squares for its codes and scored with the bf16 values it will be stored as.
    for a in 0..CLIP_STEPS {
        for b in 0..CLIP_STEPS {
            let l = lo + range * a as f32 / 48.0;
            let h = hi - range * b as f32 / 48.0;
            let (db, d) = bf((h - l) / 15.0);
            let (mb, m) = bf(l);
            let (q, err) = codes_q41(x, d, m, w);
            let mut cand = (err, Group { d: db, m: mb, q });
            if let Some(refit) = refit_q41(x, &q, w)
                && refit.0 < cand.0
            {
                cand = refit;
            }
            if best.as_ref().is_none_or(|b| cand.0 < b.0) {
                best = Some(cand);
            }
        }
    }
    best.map(|b| b.1).unwrap_or(Group {
        d: 0,
        m: bf(lo).0,
        q: [0; 32],
    })
}

/// Least squares (d, m) for fixed codes, rounded to bf16, codes recomputed: (error, group).
fn refit_q41(x: &[f32], q: &[u8; 32], w: Option<&[f32]>) -> Option<(f32, Group)> {
    // Weighted least squares for w·(d·q + m − x)².
    let (mut n, mut sq, mut sqq, mut sx, mut sqx) = (0f32, 0f32, 0f32, 0f32, 0f32);
    for (j, &v) in x.iter().enumerate() {
        let c = q[j] as f32;
        let wj = w.map_or(1.0, |w| w[j]);
        n += wj;
        sq += wj * c;
        sqq += wj * c * c;
        sx += wj * v;
        sqx += wj * c * v;
    }
    let det = n * sqq - sq * sq;
    if det <= 0.0 || n <= 0.0 {
        return None;
    }
    let (nd, ndv) = bf((n * sqx - sq * sx) / det);
    let (nm, nmv) = bf((sx - ndv * sq) / n);
    let (nq, nerr) = codes_q41(x, ndv, nmv, w);
    Some((
        nerr,
        Group {
            d: nd,
            m: nm,
            q: nq,
        },
    ))
}

fn quantize_q40(x: &[f32]) -> Group {
    let mut max = 0f32;
    for &v in x {
        if v.abs() > max.abs() {
            max = v;
        }
    }
    let (db, d) = bf(max / -8.0);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (j, &v) in x.iter().enumerate() {
        let c = (v * id).round().clamp(-8.0, 7.0) as i8;
        q[j] = (c as u8) & 0x0F;
    }
    Group { d: db, m: 0, q }
}

fn quantize_q8(x: &[f32]) -> Group {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let (db, d) = bf(amax / 127.0);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (j, &v) in x.iter().enumerate() {
        q[j] = ((v * id).round().clamp(-127.0, 127.0) as i8) as u8;
    }
    Group { d: db, m: 0, q }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..64)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.1
            })
            .collect()
    }

    fn rel_l2(x: &[f32], gs: &[Group], codes: Codes) -> f32 {
        let (mut e, mut n) = (0f32, 0f32);
        for (i, &v) in x.iter().enumerate() {
            let w = gs[i / 32].value(codes, i % 32);
            e += (w - v) * (w - v);
            n += v * v;
        }
        (e / n).sqrt()
    }

    #[test]
    fn requantization_errors_are_what_each_bit_width_allows() {
        let x = sample(7);
        let mut g = Vec::new();
        quantize_row(&x, Codes::Unsigned4, None, &mut g);
        let e41 = rel_l2(&x, &g, Codes::Unsigned4);
        quantize_row(&x, Codes::Signed4, None, &mut g);
        let e40 = rel_l2(&x, &g, Codes::Signed4);
        quantize_row(&x, Codes::Signed8, None, &mut g);
        let e8 = rel_l2(&x, &g, Codes::Signed8);
        // Uniform data: 4-bit step/√12 over the spread ≈ 4 %, 8-bit ≈ 0.3 %.
        assert!(e41 < 0.06 && e40 < 0.09 && e8 < 0.006, "{e41} {e40} {e8}");
        assert!(e8 < e41);
    }

    #[test]
    fn refit_never_loses_to_min_max() {
        for seed in 0..50 {
            let x = sample(seed);
            let mut g = Vec::new();
            quantize_row(&x[..32], Codes::Unsigned4, None, &mut g);
            let (lo, hi) = x[..32]
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                    (a.min(v), b.max(v))
                });
            let (_, d) = bf((hi - lo) / 15.0);
            let (_, m) = bf(lo);
            let (_, base) = codes_q41(&x[..32], d, m, None);
            let ours: f32 = (0..32)
                .map(|j| (g[0].value(Codes::Unsigned4, j) - x[j]).powi(2))
                .sum();
            assert!(ours <= base * 1.0001, "seed {seed}: {ours} > {base}");
        }
    }

    #[test]
    fn importance_moves_error_off_the_heavy_columns() {
        let x = sample(3);
        let mut w = vec![1.0f32; 64];
        for v in w.iter_mut().step_by(4) {
            *v = 100.0;
        }
        let (mut plain, mut weighted) = (Vec::new(), Vec::new());
        quantize_row(&x, Codes::Unsigned4, None, &mut plain);
        quantize_row(&x, Codes::Unsigned4, Some(&w), &mut weighted);
        let err = |g: &[Group]| -> f32 {
            (0..64)
                .step_by(4)
                .map(|i| (g[i / 32].value(Codes::Unsigned4, i % 32) - x[i]).powi(2))
                .sum()
        };
        assert!(
            err(&weighted) <= err(&plain),
            "{} > {}",
            err(&weighted),
            err(&plain)
        );
    }

    #[test]
    fn q4_0_into_an_unsigned_kind_is_exact() {
        // d = 0.5 (f16 0x3800), codes 0..15 → values (u − 8)·0.5.
        let mut row = vec![0x00u8, 0x38];
        row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut a = Vec::new();
        native_row(GgmlType::Q4_0, Codes::Unsigned4, &row, &mut a);
        let mut s = Vec::new();
        native_row(GgmlType::Q4_0, Codes::Signed4, &row, &mut s);
        for j in 0..32 {
            let u = if j < 16 { j as f32 } else { (31 - j) as f32 };
            assert_eq!(a[0].value(Codes::Unsigned4, j), (u - 8.0) * 0.5);
            assert_eq!(s[0].value(Codes::Signed4, j), (u - 8.0) * 0.5);
        }
    }
}
