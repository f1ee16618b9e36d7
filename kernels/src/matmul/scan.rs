//! The 2-bit scan head's product: a host-only copy of a tied head that is only read to find each
//! token's best candidates, which are then re-scored exactly (see `crate::head`). The format and
//! its encoder are [`onebit_pack::scan`]'s; this module reads it.

use rayon::prelude::*;

pub use onebit_pack::scan::{
    GROUP, GROUP_BYTES, ROWS, block_bytes, code_at, encode_bf16, encode_block, k_padded,
    matrix_bytes,
};
use onebit_pack::tiles::bf16_at as bf16;

use super::{Activations, CheckResult, KernelPath};

/// A 2-bit scan matrix borrowed from the mapped pack.
#[derive(Clone, Copy, Debug)]
pub struct ScanMatrix<'a> {
    /// Rows.
    pub rows: usize,
    /// Logical K.
    pub k: usize,
    data: &'a [u8],
}

impl ScanMatrix<'_> {
    /// Bytes a product reads.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

impl<'a> ScanMatrix<'a> {
    /// Wraps `data`; `None` when its length is not `matrix_bytes(rows, k)`.
    pub fn new(rows: usize, k: usize, data: &'a [u8]) -> Option<Self> {
        (data.len() == matrix_bytes(rows, k)).then_some(ScanMatrix { rows, k, data })
    }

    fn block(&self, b: usize) -> &'a [u8] {
        let bb = block_bytes(self.k);
        &self.data[b * bb..(b + 1) * bb]
    }

    /// Row `r` decoded to f32 (`k` values): the reference the kernels are tested against.
    pub fn row_reference(&self, r: usize, out: &mut [f32]) {
        let (block, rr) = (self.block(r / ROWS), r % ROWS);
        for (c, o) in out.iter_mut().enumerate().take(self.k) {
            let (b, sh) = code_at(rr, c);
            let q = (block[b] >> sh) & 3;
            let at = c / GROUP * GROUP_BYTES + 256 + 2 * rr;
            *o = bf16(block, at + 32) + bf16(block, at) * q as f32;
        }
    }

    /// `y[t·rows + r] = Σ_c W[r][c]·x[t][c]` for the `n` tokens of `x` (`n × k`), on int8
    /// activations.
    pub fn matmul(&self, path: KernelPath, x: &[f32], n: usize, y: &mut [f32]) {
        assert_eq!(x.len(), n * self.k, "activation size");
        assert_eq!(y.len(), n * self.rows, "output size");
        if n == 0 {
            return;
        }
        let kp = k_padded(self.k);
        let acts = Activations::new(x, n, self.k, kp);
        let tok: Vec<Token> = (0..n).map(|t| Token::new(&acts, t)).collect();
        // Blocks per task: 64 (1,024 rows, 205 KB of Gemma's head).
        const TASK: usize = 64;
        let blocks = self.rows.div_ceil(ROWS);
        let parts: Vec<(usize, Vec<f32>)> = (0..blocks.div_ceil(TASK))
            .into_par_iter()
            .map(|i| {
                let b0 = i * TASK;
                let nb = (blocks - b0).min(TASK);
                let mut out = vec![0f32; n * nb * ROWS];
                for b in 0..nb {
                    let block = self.block(b0 + b);
                    for (t, tk) in tok.iter().enumerate() {
                        let dst = &mut out[(t * nb + b) * ROWS..(t * nb + b + 1) * ROWS];
                        block_dot(path, block, tk, dst);
                    }
                }
                (b0 * ROWS, out)
            })
            .collect();
        for (r0, out) in parts {
            let span = out.len() / n;
            let take = span.min(self.rows - r0);
            for t in 0..n {
                y[t * self.rows + r0..t * self.rows + r0 + take]
                    .copy_from_slice(&out[t * span..t * span + take]);
            }
        }
    }
}

/// One token's activations as the scan kernel reads them.
struct Token {
    /// Int8 codes of each pair of columns as one little-endian i16 (`maddubs`' broadcast).
    pairs: Vec<i16>,
    /// Codes (scalar path).
    q: Vec<i8>,
    /// Scale per 32 columns.
    qd: Vec<f32>,
    /// Zero-point factor per group: `Σ_{sub} dx·Σ xq`.
    zp: Vec<f32>,
}

impl Token {
    fn new(a: &Activations, t: usize) -> Token {
        let kp = a.kp;
        let q = a.q[t * kp..(t + 1) * kp].to_vec();
        let qd = a.qd[t * kp / 32..(t + 1) * kp / 32].to_vec();
        let zs = &a.zs[t * kp / 32..(t + 1) * kp / 32];
        let pairs = q
            .chunks_exact(2)
            .map(|p| i16::from_le_bytes([p[0] as u8, p[1] as u8]))
            .collect();
        let zp = (0..kp / GROUP).map(|g| zs[2 * g] + zs[2 * g + 1]).collect();
        Token { pairs, q, qd, zp }
    }
}

/// The 16 rows of one block times one token.
fn block_dot(path: KernelPath, block: &[u8], t: &Token, out: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 | KernelPath::Avx512Vnni | KernelPath::Amx => {
            // SAFETY: these paths are only chosen when the CPU reports AVX2 and FMA.
            unsafe { avx2::block_dot(block, t, out) }
        }
        _ => scalar_block_dot(block, t, out),
    }
}

fn scalar_block_dot(block: &[u8], t: &Token, out: &mut [f32]) {
    let groups = t.zp.len();
    for (r, o) in out.iter_mut().enumerate().take(ROWS) {
        let mut s = 0f32;
        for g in 0..groups {
            let at = g * GROUP_BYTES + 256 + 2 * r;
            let (d, m) = (bf16(block, at), bf16(block, at + 32));
            for sub in 0..2 {
                let mut dot = 0i32;
                for c in g * GROUP + sub * 32..g * GROUP + sub * 32 + 32 {
                    let (b, sh) = code_at(r, c);
                    dot += i32::from((block[b] >> sh) & 3) * i32::from(t.q[c]);
                }
                s += d * t.qd[2 * g + sub] * dot as f32;
            }
            s += m * t.zp[g];
        }
        *o = s;
    }
}

/// [`super::self_check`] for a scan matrix: the kernel's first and last 16 rows against the
/// reference decode, on the activations as the kernel reads them.
pub fn self_check(m: &ScanMatrix<'_>, path: KernelPath) -> CheckResult {
    let x = super::check_input(m.k);
    let mut y = vec![0f32; m.rows];
    m.matmul(path, &x, 1, &mut y);
    let eff = Activations::new(&x, 1, m.k, k_padded(m.k)).effective();
    super::compare_rows(&y, ROWS, &eff[..m.k], |r, w| m.row_reference(r, w))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{GROUP_BYTES, Token};

    /// 8 bf16 values at `p` as f32.
    #[target_feature(enable = "avx2")]
    unsafe fn bf16x8(p: *const u8) -> __m256 {
        // SAFETY: the caller's block holds 16 bytes at `p`.
        let v = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
    }

    /// AVX2 form of `scalar_block_dot`: per chunk one load, per pair of columns one shift + mask
    /// and one `maddubs` against the broadcast pair of activation codes (16 rows per register,
    /// i16 sums over 32 columns: |Σ| ≤ 16·2·3·127 < 2¹⁵), then per 32 columns widening and one
    /// FMA per 8 rows with `d·dx`, and per group one FMA with `m·zp`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block_dot(block: &[u8], t: &Token, out: &mut [f32]) {
        let groups = t.zp.len();
        assert!(block.len() >= groups * GROUP_BYTES && out.len() >= 16);
        assert!(t.pairs.len() >= groups * 32 && t.qd.len() >= 2 * groups);
        let mask = _mm256_set1_epi8(3);
        let (mut y0, mut y1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let p = block.as_ptr();
        for g in 0..groups {
            // SAFETY: offsets below stay inside `g*GROUP_BYTES .. (g+1)*GROUP_BYTES`, checked above;
            // pair indices stay below `(g+1)*32 ≤ pairs.len()`.
            unsafe {
                let base = p.add(g * GROUP_BYTES);
                for sub in 0..2 {
                    let mut acc = _mm256_setzero_si256();
                    for c in 4 * sub..4 * sub + 4 {
                        // The blocks are one contiguous run: ask for what comes 4 KiB on (a
                        // prefetch never faults), as the tile kernels do.
                        _mm_prefetch::<_MM_HINT_T0>(base.add(c * 32).wrapping_add(4096).cast());
                        let v = _mm256_loadu_si256(base.add(c * 32).cast());
                        let pr = t.pairs.as_ptr().add(g * 32 + c * 4);
                        let x0 = _mm256_set1_epi16(*pr);
                        let x1 = _mm256_set1_epi16(*pr.add(1));
                        let x2 = _mm256_set1_epi16(*pr.add(2));
                        let x3 = _mm256_set1_epi16(*pr.add(3));
                        let q0 = _mm256_and_si256(v, mask);
                        let q1 = _mm256_and_si256(_mm256_srli_epi16(v, 2), mask);
                        let q2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                        let q3 = _mm256_and_si256(_mm256_srli_epi16(v, 6), mask);
                        let s01 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(q0, x0),
                            _mm256_maddubs_epi16(q1, x1),
                        );
                        let s23 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(q2, x2),
                            _mm256_maddubs_epi16(q3, x3),
                        );
                        acc = _mm256_add_epi16(acc, _mm256_add_epi16(s01, s23));
                    }
                    let f = _mm256_set1_ps(*t.qd.get_unchecked(2 * g + sub));
                    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc)));
                    let hi =
                        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(acc, 1)));
                    let d0 = bf16x8(base.add(256));
                    let d1 = bf16x8(base.add(272));
                    y0 = _mm256_fmadd_ps(lo, _mm256_mul_ps(d0, f), y0);
                    y1 = _mm256_fmadd_ps(hi, _mm256_mul_ps(d1, f), y1);
                }
                let z = _mm256_set1_ps(*t.zp.get_unchecked(g));
                y0 = _mm256_fmadd_ps(bf16x8(base.add(288)), z, y0);
                y1 = _mm256_fmadd_ps(bf16x8(base.add(304)), z, y1);
            }
        }
        // SAFETY: `out` holds at least 16 values, checked above.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), y0);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), y1);
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
        let k = 200; // not a multiple of the group: padding included
        let v = values(3, k);
        let mut data = vec![0u8; matrix_bytes(3, k)];
        encode_block(&v, 3, k, &mut data);
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
        for (rows, k) in [(37, 640), (19, 200)] {
            let v = values(rows, k);
            let src: Vec<u8> = v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect();
            let data = encode_bf16(&src, rows, k, 0.5);
            let m = ScanMatrix::new(rows, k, &data).expect("size");
            for n in [1, 3, 6] {
                let x: Vec<f32> = values(n, k).iter().map(|x| x * 30.0).collect();
                let eff = Activations::new(&x, n, k, k_padded(k)).effective();
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
                for path in KernelPath::available() {
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
}
