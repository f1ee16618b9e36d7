//! The 2-bit scan head: a host-only copy of a tied head that is only read to find each token's
//! best candidates, which are then re-scored exactly (see `crate::head`).
//!
//! Why 2 bits: on Gemma 3 270M (511 teacher-forced positions of the essay, numpy on the GGUF's
//! weights) the exact head's choice ranks at most 105th under a min/max 2-bit, 64-column-group
//! copy of the embedding, 5th under 4-bit tiles; 2.5 bits per weight read 52 MB per token instead
//! of the 4-bit tiles' 105 MB, and re-scoring 128 candidates recovers the exact choice.
//!
//! Row format (`kp` = K padded to 128 columns): `kp/4` code bytes, then per 64-column group a bf16
//! scale `d` and a bf16 minimum `m` (little-endian): `w = m + d·q`, `q ∈ 0..=3`. Codes come in
//! 32-byte chunks of 128 columns: bits `2s..2s+2` of byte `j` hold column `32s + j` of the
//! chunk, so one shift and mask gives the codes of a whole 32-column activation group in order.
//! Padded columns have code 0 and meet zero activations.
//!
//! Product, per token and 32-column activation group `a` (int8 codes `xq`, scale `dx`):
//! `y += d·dx·Σ q·xq + m·dx·Σ xq` — exactly the weights times the dequantized activations, as the
//! 4-bit tile kernels.

use rayon::prelude::*;

use super::{Activations, CheckResult, Path};

/// Columns sharing one scale and minimum.
pub const GROUP: usize = 64;
/// Columns per 32-byte code chunk.
pub const CHUNK: usize = 128;

/// A 2-bit scan matrix borrowed from the mapped pack.
#[derive(Clone, Copy, Debug)]
pub struct ScanMatrix<'a> {
    /// Rows.
    pub rows: usize,
    /// Logical K.
    pub k: usize,
    data: &'a [u8],
}

/// K padded to whole code chunks.
pub fn k_padded(k: usize) -> usize {
    k.div_ceil(CHUNK) * CHUNK
}

/// Bytes of one row: codes, then a (d, m) bf16 pair per group.
pub fn row_bytes(k: usize) -> usize {
    let kp = k_padded(k);
    kp / 4 + kp / GROUP * 4
}

fn bf16(b: &[u8], at: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[at], b[at + 1]])) << 16)
}

/// Encodes one row of values (`k` of them) into `out` (`row_bytes(k)`): per group min/max,
/// `d = (max − min)/3` and `m = min` rounded to bf16, codes from the rounded values.
pub fn encode_row(values: &[f32], out: &mut [u8]) {
    let k = values.len();
    let kp = k_padded(k);
    out.fill(0);
    let (codes, dm) = out.split_at_mut(kp / 4);
    for g in 0..kp / GROUP {
        let cols = g * GROUP..((g + 1) * GROUP).min(k);
        let vals = values.get(cols.clone()).unwrap_or(&[]);
        let (lo, hi) = vals
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        if vals.is_empty() {
            continue;
        }
        let m = half::bf16::from_f32(lo);
        let d = half::bf16::from_f32((hi - lo) / 3.0);
        dm[4 * g..4 * g + 2].copy_from_slice(&d.to_le_bytes());
        dm[4 * g + 2..4 * g + 4].copy_from_slice(&m.to_le_bytes());
        let (d, m) = (d.to_f32(), m.to_f32());
        for (i, &v) in vals.iter().enumerate() {
            let c = cols.start + i;
            let q = if d > 0.0 {
                ((v - m) / d).round().clamp(0.0, 3.0) as u8
            } else {
                0
            };
            let (chunk, within) = (c / CHUNK, c % CHUNK);
            codes[chunk * 32 + within % 32] |= q << (2 * (within / 32));
        }
    }
}

/// Encodes `rows` bf16 rows (`rows × k`, little-endian) times `scale` as a scan matrix, in
/// parallel.
pub fn encode_bf16(src: &[u8], rows: usize, k: usize, scale: f32) -> Vec<u8> {
    let rb = row_bytes(k);
    let mut out = vec![0u8; rows * rb];
    out.par_chunks_mut(rb)
        .zip(src.par_chunks(2 * k))
        .for_each(|(o, s)| {
            let v: Vec<f32> = s.chunks_exact(2).map(|b| bf16(b, 0) * scale).collect();
            encode_row(&v, o);
        });
    out
}

impl<'a> ScanMatrix<'a> {
    /// Wraps `data`; `None` when its length is not `rows × row_bytes(k)`.
    pub fn new(rows: usize, k: usize, data: &'a [u8]) -> Option<Self> {
        (data.len() == rows * row_bytes(k)).then_some(ScanMatrix { rows, k, data })
    }

    fn row(&self, r: usize) -> &'a [u8] {
        let rb = row_bytes(self.k);
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Row `r` decoded to f32 (`k` values): the reference the kernels are tested against.
    pub fn row_reference(&self, r: usize, out: &mut [f32]) {
        let row = self.row(r);
        let kp = k_padded(self.k);
        for (c, o) in out.iter_mut().enumerate().take(self.k) {
            let g = c / GROUP;
            let (chunk, within) = (c / CHUNK, c % CHUNK);
            let q = (row[chunk * 32 + within % 32] >> (2 * (within / 32))) & 3;
            *o = bf16(row, kp / 4 + 4 * g + 2) + bf16(row, kp / 4 + 4 * g) * q as f32;
        }
    }

    /// `y[t·rows + r] = Σ_c W[r][c]·x[t][c]` for the `n` tokens of `x` (`n × k`), on int8
    /// activations.
    pub fn matmul(&self, path: Path, x: &[f32], n: usize, y: &mut [f32]) {
        assert_eq!(x.len(), n * self.k, "activation size");
        assert_eq!(y.len(), n * self.rows, "output size");
        let kp = k_padded(self.k);
        let acts = Activations::new(x, n, self.k, kp, true);
        // Per token and group: the zero-point factor Σ_{sub} dx·Σ xq.
        let groups = kp / GROUP;
        let mut zp = vec![0f32; n * groups];
        for t in 0..n {
            for g in 0..groups {
                zp[t * groups + g] = (0..2)
                    .map(|h| {
                        let a = t * (kp / 32) + 2 * g + h;
                        acts.qd[a] * acts.qsum[a] as f32
                    })
                    .sum();
            }
        }
        const TASK: usize = 1024;
        // Rows `r0..r0+rows` into `out[t·stride + (r − r0)]`, four tokens per pass over a row.
        let run = |r0: usize, rows: usize, out: &mut [f32], stride: usize| {
            for t0 in (0..n).step_by(4) {
                let nt = (n - t0).min(4);
                for r in 0..rows {
                    let mut acc = [0f32; 4];
                    self.row_dot(path, r0 + r, &acts, &zp, t0, nt, &mut acc);
                    for (j, &v) in acc.iter().enumerate().take(nt) {
                        out[(t0 + j) * stride + r] = v;
                    }
                }
            }
        };
        if n == 1 {
            y.par_chunks_mut(TASK).enumerate().for_each(|(i, out)| {
                let rows = out.len();
                run(i * TASK, rows, out, rows)
            });
            return;
        }
        let parts: Vec<(usize, Vec<f32>)> = (0..self.rows.div_ceil(TASK))
            .into_par_iter()
            .map(|i| {
                let r0 = i * TASK;
                let rows = (self.rows - r0).min(TASK);
                let mut out = vec![0f32; n * rows];
                run(r0, rows, &mut out, rows);
                (r0, out)
            })
            .collect();
        for (r0, out) in parts {
            let rows = out.len() / n;
            for t in 0..n {
                y[t * self.rows + r0..t * self.rows + r0 + rows]
                    .copy_from_slice(&out[t * rows..(t + 1) * rows]);
            }
        }
    }

    /// The products of row `r` with tokens `t0..t0+nt` (at most 4) into `acc`.
    #[allow(clippy::too_many_arguments)]
    fn row_dot(
        &self,
        path: Path,
        r: usize,
        acts: &Activations,
        zp: &[f32],
        t0: usize,
        nt: usize,
        acc: &mut [f32; 4],
    ) {
        let row = self.row(r);
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => {
                // SAFETY: `Path::Avx2` is only chosen when the CPU reports AVX2 and FMA.
                unsafe { avx2::row_dot(row, acts, zp, t0, nt, acc) }
            }
            _ => scalar_row_dot(row, acts, zp, t0, nt, acc),
        }
    }
}

/// [`super::self_check`] for a scan matrix: the kernel's first and last 16 rows against the
/// reference decode, on the activations as the kernel reads them.
pub fn self_check(m: &ScanMatrix<'_>, path: Path) -> CheckResult {
    let x = super::check_input(m.k);
    let mut y = vec![0f32; m.rows];
    m.matmul(path, &x, 1, &mut y);
    let eff = Activations::new(&x, 1, m.k, k_padded(m.k), true).effective();
    super::compare_rows(&y, 16, &eff[..m.k], |r, w| m.row_reference(r, w))
}

fn scalar_row_dot(
    row: &[u8],
    acts: &Activations,
    zp: &[f32],
    t0: usize,
    nt: usize,
    acc: &mut [f32; 4],
) {
    let kp = acts.kp;
    let (groups, subs) = (kp / GROUP, kp / 32);
    for (j, a) in acc.iter_mut().enumerate().take(nt) {
        let t = t0 + j;
        let xq = &acts.q[t * kp..(t + 1) * kp];
        let mut s = 0f32;
        for sub in 0..subs {
            let g = sub / 2;
            let (chunk, sh) = (sub / 4, 2 * (sub % 4));
            let codes = &row[chunk * 32..chunk * 32 + 32];
            let dot: i32 = (0..32)
                .map(|i| i32::from((codes[i] >> sh) & 3) * i32::from(xq[sub * 32 + i]))
                .sum();
            s += bf16(row, kp / 4 + 4 * g) * acts.qd[t * subs + sub] * dot as f32;
        }
        for g in 0..groups {
            s += bf16(row, kp / 4 + 4 * g + 2) * zp[t * groups + g];
        }
        *a = s;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Activations, GROUP, bf16};

    /// AVX2 form of `scalar_row_dot`: per 32-byte chunk one load, per 32-column group one
    /// shift + mask, then per token `maddubs` (u8 codes × i8 activations), `madd` to i32 and one
    /// FMA with `d·dx`; the zero-point terms are scalar per group.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_dot(
        row: &[u8],
        acts: &Activations,
        zp: &[f32],
        t0: usize,
        nt: usize,
        acc: &mut [f32; 4],
    ) {
        let kp = acts.kp;
        let (groups, subs) = (kp / GROUP, kp / 32);
        let mask = _mm256_set1_epi8(3);
        let ones = _mm256_set1_epi16(1);
        let mut v = [_mm256_setzero_ps(); 4];
        let d_at = kp / 4;
        for chunk in 0..kp / 128 {
            // SAFETY: the row holds `kp/4` code bytes; `chunk*32 + 32 ≤ kp/4`.
            let packed = unsafe { _mm256_loadu_si256(row.as_ptr().add(chunk * 32).cast()) };
            for s in 0..4 {
                let sub = chunk * 4 + s;
                let codes = match s {
                    0 => _mm256_and_si256(packed, mask),
                    1 => _mm256_and_si256(_mm256_srli_epi16(packed, 2), mask),
                    2 => _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask),
                    _ => _mm256_and_si256(_mm256_srli_epi16(packed, 6), mask),
                };
                let d = bf16(row, d_at + 4 * (sub / 2));
                for (j, acc_v) in v.iter_mut().enumerate().take(nt) {
                    let t = t0 + j;
                    // SAFETY: token `t < n`, so `t*kp + sub*32 + 32 ≤ n*kp = q.len()`.
                    let xq = unsafe {
                        _mm256_loadu_si256(acts.q.as_ptr().add(t * kp + sub * 32).cast())
                    };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq), ones);
                    let f = _mm256_set1_ps(d * acts.qd[t * subs + sub]);
                    *acc_v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, *acc_v);
                }
            }
        }
        for (j, a) in acc.iter_mut().enumerate().take(nt) {
            let t = t0 + j;
            let hi = _mm256_extractf128_ps(v[j], 1);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(v[j]), hi);
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            let mut s = _mm_cvtss_f32(s1);
            for g in 0..groups {
                s += bf16(row, d_at + 4 * g + 2) * zp[t * groups + g];
            }
            *a = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(rows: usize, k: usize) -> Vec<f32> {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        (0..rows * k)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    #[test]
    fn encoding_keeps_each_value_within_half_a_step_of_its_group() {
        let k = 200; // not a multiple of the chunk: padding included
        let v = values(3, k);
        let mut data = vec![0u8; 3 * row_bytes(k)];
        for (r, o) in data.chunks_mut(row_bytes(k)).enumerate() {
            encode_row(&v[r * k..(r + 1) * k], o);
        }
        let m = ScanMatrix::new(3, k, &data).expect("size");
        let mut back = vec![0f32; k];
        for r in 0..3 {
            m.row_reference(r, &mut back);
            for g in 0..k.div_ceil(GROUP) {
                let cols = g * GROUP..((g + 1) * GROUP).min(k);
                let src = &v[r * k + cols.start..r * k + cols.end];
                let (lo, hi) = src
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                let step = (hi - lo) / 3.0;
                for (c, &x) in cols.clone().zip(src) {
                    assert!(
                        (back[c] - x).abs() <= 0.51 * step + 0.01 * (hi - lo),
                        "row {r} col {c}: {} vs {x}",
                        back[c]
                    );
                }
            }
        }
    }

    #[test]
    fn every_path_is_the_reference_decode_times_the_dequantized_activations() {
        let (rows, k) = (37, 640);
        let v = values(rows, k);
        let src: Vec<u8> = v
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let data = encode_bf16(&src, rows, k, 0.5);
        let m = ScanMatrix::new(rows, k, &data).expect("size");
        for n in [1, 3, 6] {
            let x: Vec<f32> = values(n, k).iter().map(|x| x * 30.0).collect();
            let eff = Activations::new(&x, n, k, k_padded(k), true).effective();
            let mut want = vec![0f64; n * rows];
            let mut w = vec![0f32; k];
            for r in 0..rows {
                m.row_reference(r, &mut w);
                for t in 0..n {
                    want[t * rows + r] = (0..k)
                        .map(|c| w[c] as f64 * eff[t * k_padded(k) + c] as f64)
                        .sum();
                }
            }
            for path in [Path::Scalar, Path::detect()] {
                let mut y = vec![0f32; n * rows];
                m.matmul(path, &x, n, &mut y);
                for (i, (&a, &b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{path:?} n={n} [{i}]: {a} vs {b}"
                    );
                }
                // A batch gives each token its single-token numbers.
                if n > 1 {
                    let mut one = vec![0f32; rows];
                    m.matmul(path, &x[k..2 * k], 1, &mut one);
                    assert_eq!(one, y[rows..2 * rows].to_vec(), "{path:?}");
                }
            }
        }
    }
}
