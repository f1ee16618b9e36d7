//! The portable kernel: the same per-group formulas as the SIMD path, one row at a time.

use super::{Activations, QMatrix};

/// One row block into `out[t·stride + local + r]` (see `QMatrix::block`).
pub(super) fn block(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let l = &m.layout;
    let (kp, groups, per_tile) = (a.kp, a.kp / 32, l.groups());
    for cb in 0..m.ct {
        let tile = m.tile(rb, cb);
        for g in 0..per_tile {
            let gg = cb * per_tile + g;
            let c0 = cb * l.cols + g * 32;
            for r in 0..l.rows {
                let (d, z) = (l.d(tile, r, g), l.m(tile, r, g));
                for t in 0..a.n {
                    let (dx, zs) = (a.qd[t * groups + gg], a.zs[t * groups + gg]);
                    let xq = &a.q[t * kp + c0..t * kp + c0 + 32];
                    let isum: i32 = xq
                        .iter()
                        .enumerate()
                        .map(|(c, &v)| l.q(tile, r, g * 32 + c) as i32 * v as i32)
                        .sum();
                    out[t * stride + local + r] += (d * dx) * isum as f32 + z * zs;
                }
            }
        }
    }
}
