//! Fixtures for tests of the kernels and of the crates above them (feature `testing`): random
//! tiles in any layout, deterministic for a seed.

use onebit_pack::TileLayout;

/// A random tiled matrix in `layout` (codes and scales random, padding zero).
pub fn random_matrix(layout: TileLayout, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let ct = k.div_ceil(layout.cols);
    let rb = rows.div_ceil(layout.rows);
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut data = vec![0u8; rb * ct * layout.bytes];
    for t in data.chunks_mut(layout.bytes) {
        for b in t[layout.base..].iter_mut() {
            *b = next() as u8;
        }
        for slot in 0..layout.rows * layout.groups() {
            let d = half::bf16::from_f32(0.01 + (next() % 100) as f32 * 1e-4).to_bits();
            t[2 * slot..2 * slot + 2].copy_from_slice(&d.to_le_bytes());
            if layout.zero {
                let m = half::bf16::from_f32(-0.08 + (next() % 100) as f32 * 1e-4).to_bits();
                let at = layout.zero_base() + 2 * slot;
                t[at..at + 2].copy_from_slice(&m.to_le_bytes());
            }
        }
    }
    data
}
