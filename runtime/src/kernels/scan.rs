//! The 2-bit scan head: a host-only copy of a tied head that is only read to find each token's
//! best candidates, which are then re-scored exactly (see `crate::head`).
//!
//! Why 2 bits: on Gemma 3 270M (511 teacher-forced positions of the essay, numpy on the GGUF's
//! weights) the exact head's choice ranks at most 105th under a min/max 2-bit, 64-column-group
//! copy of the embedding, 5th under 4-bit tiles; 2.5 bits per weight read 52 MB per token instead
//! of the 4-bit tiles' 105 MB, and re-scoring 128 candidates recovers the exact choice.
//!
//! Format: rows in blocks of 16 (the last padded with zero rows), K padded to 64. Per block and
//! 64-column group `g`: 8 chunks of 32 code bytes, then the 16 rows' bf16 scales `d`, then their
//! bf16 minimums `m` (`w = m + d·q`, `q ∈ 0..=3`): 320 bytes. In chunk `c` (columns `8c..8c+8` of
//! the group) byte `2r + j` holds, in bits `2s..2s+2`, the code of row `r`, column `8c + 2s + j`:
//! one shift and mask gives a register of 16 rows × 2 neighbouring columns, which `maddubs`
//! multiplies by the two columns' int8 activations broadcast, leaving one row per i16 lane — no
//! horizontal sums. Padded columns have code 0 and meet zero activations.
//!
//! Product, per token and 32-column activation group (int8 codes `xq`, scale `dx`):
//! `y += d·dx·Σ q·xq + m·dx·Σ xq` — exactly the weights times the dequantized activations, as the
//! 4-bit tile kernels.

use rayon::prelude::*;

use super::{Activations, CheckResult, Path};

/// Columns sharing one scale and minimum.
pub const GROUP: usize = 64;
/// Rows per block.
pub const ROWS: usize = 16;
/// Bytes per block and group: 8 chunks of codes, 16 scales, 16 minimums.
const GROUP_BYTES: usize = 8 * 32 + 2 * ROWS * 2;

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

/// K padded to whole groups.
pub fn k_padded(k: usize) -> usize {
    k.div_ceil(GROUP) * GROUP
}

/// Bytes of one block of 16 rows.
pub fn block_bytes(k: usize) -> usize {
    k_padded(k) / GROUP * GROUP_BYTES
}

/// Bytes of a `rows × k` scan matrix.
pub fn matrix_bytes(rows: usize, k: usize) -> usize {
    rows.div_ceil(ROWS) * block_bytes(k)
}

fn bf16(b: &[u8], at: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[at], b[at + 1]])) << 16)
}

/// Where the code of (row `r` of its block, column `c`) sits: byte offset in the block and shift.
fn code_at(r: usize, c: usize) -> (usize, u32) {
    let (g, w) = (c / GROUP, c % GROUP);
    let (chunk, w8) = (w / 8, w % 8);
    (
        g * GROUP_BYTES + chunk * 32 + 2 * r + w8 % 2,
        2 * (w8 / 2) as u32,
    )
}

/// Encodes one block: `rows` (≤ 16) rows of `k` values each (`values[r·k + c]`) into `out`
/// (`block_bytes(k)`): per row and group min/max, `d = (max − min)/3` and `m = min` rounded to
/// bf16, codes from the rounded values.
pub fn encode_block(values: &[f32], rows: usize, k: usize, out: &mut [u8]) {
    out.fill(0);
    for r in 0..rows {
        let row = &values[r * k..(r + 1) * k];
        for g in 0..k.div_ceil(GROUP) {
            let cols = g * GROUP..((g + 1) * GROUP).min(k);
            let vals = &row[cols.clone()];
            let (lo, hi) = vals
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let m = half::bf16::from_f32(lo);
            let d = half::bf16::from_f32((hi - lo) / 3.0);
            let at = g * GROUP_BYTES + 256 + 2 * r;
            out[at..at + 2].copy_from_slice(&d.to_le_bytes());
            out[at + 32..at + 34].copy_from_slice(&m.to_le_bytes());
            let (d, m) = (d.to_f32(), m.to_f32());
            for (c, &v) in cols.zip(vals) {
                let q = if d > 0.0 {
                    ((v - m) / d).round().clamp(0.0, 3.0) as u8
                } else {
                    0
                };
                let (b, sh) = code_at(r, c);
                out[b] |= q << sh;
            }
        }
    }
}

/// Encodes `rows` bf16 rows (`rows × k`, little-endian) times `scale` as a scan matrix, in
/// parallel over blocks.
pub fn encode_bf16(src: &[u8], rows: usize, k: usize, scale: f32) -> Vec<u8> {
    let bb = block_bytes(k);
    let mut out = vec![0u8; matrix_bytes(rows, k)];
    out.par_chunks_mut(bb).enumerate().for_each(|(b, o)| {
        let r0 = b * ROWS;
        let n = (rows - r0).min(ROWS);
        let v: Vec<f32> = src[r0 * k * 2..(r0 + n) * k * 2]
            .chunks_exact(2)
            .map(|c| bf16(c, 0) * scale)
            .collect();
        encode_block(&v, n, k, o);
    });
    out
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
    pub fn matmul(&self, path: Path, x: &[f32], n: usize, y: &mut [f32]) {
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
fn block_dot(path: Path, block: &[u8], t: &Token, out: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx512Vnni | Path::Amx => {
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
pub fn self_check(m: &ScanMatrix<'_>, path: Path) -> CheckResult {
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
                for path in Path::available() {
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
