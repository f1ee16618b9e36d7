//! The portable kernel: the same per-group formula as the SIMD path, one row at a time.

use super::QMatrix;

/// One row block into `out[t·stride + local + r]` (see `QMatrix::block`).
#[allow(clippy::too_many_arguments)]
pub(super) fn block(
    m: &QMatrix<'_>,
    rb: usize,
    xp: &[f32],
    sx: &[f32],
    n: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let l = &m.layout;
    let (kp, groups, per_tile) = (m.k_padded(), m.k_padded() / 32, l.groups());
    for cb in 0..m.ct {
        let tile = m.tile(rb, cb);
        for g in 0..per_tile {
            let gg = cb * per_tile + g;
            for r in 0..l.rows {
                let (d, z) = (l.d(tile, r, g), l.m(tile, r, g));
                for t in 0..n {
                    let x = &xp[t * kp + cb * l.cols + g * 32..];
                    let mut acc = 0f32;
                    for (c, &xv) in x[..32].iter().enumerate() {
                        acc += l.q(tile, r, g * 32 + c) * xv;
                    }
                    out[t * stride + local + r] += d * acc + z * sx[t * groups + gg];
                }
            }
        }
    }
}
