//! Host-side marshalling for the NPU backend: what goes into and comes out of a kernel's buffer
//! objects.
//!
//! - Weights: the pack's tiles byte for byte (FastFlowLM's layout is what the NPU kernels read);
//!   one buffer per matrix, `row blocks × column tiles × tile bytes`.
//! - Activations: bf16 little-endian, row-major `[m][k_padded]`, zero in the padding columns
//!   (padding contributes nothing whatever the tile's padded codes are).
//! - Results: bf16 little-endian `[m][n_padded]`; the padding rows are dropped on unpacking.
//!
//! [`emulate`] computes what a kernel computes from those bytes alone (reference tile decode,
//! f32 accumulation, bf16 result), so the tests check the whole round trip against the host
//! kernels' numbers on the same weights.

use half::bf16;

use onebit_kernels::matmul::QMatrix;

/// The weight buffer of `m`: its tiles, unchanged.
pub fn weight_buffer<'a>(m: &QMatrix<'a>) -> &'a [u8] {
    m.data
}

/// Packs `m` rows of `k` activations into `[m][k_padded]` bf16 LE, zero-padded.
pub fn pack_activations(x: &[f32], m: usize, k: usize, k_padded: usize) -> Vec<u8> {
    let mut out = vec![0u8; m * k_padded * 2];
    for r in 0..m {
        for (c, v) in x[r * k..(r + 1) * k].iter().enumerate() {
            let at = (r * k_padded + c) * 2;
            out[at..at + 2].copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
        }
    }
    out
}

/// Unpacks `[m][n_padded]` bf16 LE results into `[m][n]` f32.
pub fn unpack_results(bytes: &[u8], m: usize, n: usize, n_padded: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(m * n);
    for r in 0..m {
        for c in 0..n {
            let at = (r * n_padded + c) * 2;
            out.push(bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32());
        }
    }
    out
}

/// What a GEMM kernel writes for `weights` (a tile buffer of `layout`, `n`×`k`) and `acts`
/// (`pack_activations` output): `[m][n_padded]` bf16, from the buffer bytes alone.
pub fn emulate(
    m: &QMatrix<'_>,
    weights: &[u8],
    acts: &[u8],
    rows: usize,
    k_padded: usize,
    n_padded: usize,
) -> Vec<u8> {
    let w = QMatrix::new(m.layout, m.rows, m.k, weights);
    let mut out = vec![0u8; rows * n_padded * 2];
    let Some(w) = w else { return out };
    let mut row = vec![0f32; w.k];
    for n in 0..w.rows {
        w.row_reference(n, &mut row);
        for r in 0..rows {
            let mut acc = 0f32;
            for (c, &wv) in row.iter().enumerate() {
                let at = (r * k_padded + c) * 2;
                acc += wv * bf16::from_le_bytes([acts[at], acts[at + 1]]).to_f32();
            }
            let at = (r * n_padded + n) * 2;
            out[at..at + 2].copy_from_slice(&bf16::from_f32(acc).to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use onebit_kernels::matmul::layout::TileLayout;

    /// A deterministic tile buffer for `rows`×`k` of `layout` (valid scales, varied codes).
    fn tiles(layout: TileLayout, rows: usize, k: usize) -> Vec<u8> {
        let n = rows.div_ceil(layout.rows) * k.div_ceil(layout.cols) * layout.bytes;
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut b: Vec<u8> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect();
        // Scales and zero points as small finite bf16 values: rewrite the plane before the codes.
        for t in 0..n / layout.bytes {
            for i in (0..layout.base).step_by(2) {
                let v = bf16::from_f32(0.01 + ((t * 7 + i) % 13) as f32 * 0.002);
                let at = t * layout.bytes + i;
                b[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn marshalled_buffers_give_the_host_kernels_numbers() {
        for name in ["Q41_5120", "Q41_1280"] {
            let layout = TileLayout::by_name(name).expect("layout");
            // K off the tile grid and N off the row grid: padding on both sides.
            let (n, k, rows) = (layout.rows * 3 + 5, layout.cols * 2 + 40, 3);
            let data = tiles(layout, n, k);
            let q = QMatrix::new(layout, n, k, &data).expect("matrix");
            let (kp, np) = (
                k.div_ceil(layout.cols) * layout.cols,
                n.div_ceil(layout.rows) * layout.rows,
            );
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
                .collect();
            // Activations: bf16 of x, zero padding.
            let acts = pack_activations(&x, rows, k, kp);
            assert_eq!(acts.len(), rows * kp * 2);
            assert!(
                acts[(kp - 1) * 2..kp * 2].iter().all(|&b| b == 0),
                "padding is zero"
            );
            // Weights: the tiles themselves.
            assert_eq!(weight_buffer(&q).as_ptr(), data.as_ptr());
            // The host's reference decode on the bf16-rounded activations (what the NPU sees;
            // the host kernels themselves read int8 activations for 4-bit tiles).
            let xr: Vec<f32> = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
            let mut host = vec![0f32; rows * n];
            let mut w = vec![0f32; k];
            for r in 0..n {
                q.row_reference(r, &mut w);
                for t in 0..rows {
                    host[t * n + r] = w
                        .iter()
                        .zip(&xr[t * k..(t + 1) * k])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>() as f32;
                }
            }
            let out = emulate(&q, weight_buffer(&q), &acts, rows, kp, np);
            assert_eq!(out.len(), rows * np * 2);
            let got = unpack_results(&out, rows, n, np);
            let scale = host.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (i, (g, h)) in got.iter().zip(&host).enumerate() {
                // bf16 output: 8 bits of mantissa.
                assert!(
                    (g - h).abs() <= h.abs() / 128.0 + scale * 1e-5,
                    "{name} [{i}]: {g} vs {h}"
                );
            }
        }
    }
}
