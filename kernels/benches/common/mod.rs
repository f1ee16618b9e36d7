//! What the benchmarks share: random tiles with plausible scales, and the median.

/// `rows × k` of random codes in `layout`'s tiles, with bf16 scales of 2^-7 (and zero-points of
/// −2^-6) so that products stay finite.
pub fn random_tiles(layout: onebit_kernels::matmul::TileLayout, rows: usize, k: usize) -> Vec<u8> {
    let n = rows.div_ceil(layout.rows) * k.div_ceil(layout.cols) * layout.bytes;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut v = vec![0u8; n];
    for b in v.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = (s >> 32) as u8;
    }
    // Plausible bf16 scales (0x3C00 = 2^-7) and zero-points so values stay finite.
    for t in v.chunks_mut(layout.bytes) {
        for slot in 0..layout.rows * layout.groups() {
            t[2 * slot..2 * slot + 2].copy_from_slice(&0x3C00u16.to_le_bytes());
            if layout.zero {
                let at = layout.zero_base() + 2 * slot;
                t[at..at + 2].copy_from_slice(&0xBC80u16.to_le_bytes());
            }
        }
    }
    v
}

/// The median of `v` (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
