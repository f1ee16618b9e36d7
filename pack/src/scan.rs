//! The encoding of the 2-bit scan head: a host-only copy of a tied head that is only read to find
//! each token's best candidates, which the runtime then re-scores exactly.
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

use crate::tiles::bf16_at;

/// Columns sharing one scale and minimum.
pub const GROUP: usize = 64;
/// Rows per block.
pub const ROWS: usize = 16;
/// Bytes per block and group: 8 chunks of codes, 16 scales, 16 minimums.
pub const GROUP_BYTES: usize = 8 * 32 + 2 * ROWS * 2;

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

/// Where the code of (row `r` of its block, column `c`) sits: byte offset in the block and shift.
pub fn code_at(r: usize, c: usize) -> (usize, u32) {
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
            .map(|c| bf16_at(c, 0) * scale)
            .collect();
        encode_block(&v, n, k, o);
    });
    out
}
