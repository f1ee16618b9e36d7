//! f32 matrix products for the vision encoder (SigLIP's projections and attention), on
//! `matrixmultiply`'s sgemm (packed and cache-blocked, its AVX/FMA kernels chosen at run time),
//! rows spread over rayon's pool in blocks. Strides let a product read one head's columns of a
//! wider row and write into them, so attention needs no copies.
//!
//! The language model's products are the kernels crate's, on the pack's tiles; these are for the
//! tower's bf16 weights widened to f32 once.

use rayon::prelude::*;

/// A row-major operand: `rows × cols` values of `data`, row `r` starting at `r * stride`.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Rows.
    pub rows: usize,
    /// Values a row.
    pub cols: usize,
    /// Distance between the starts of two rows (at least `cols`).
    pub stride: usize,
}

impl Rows<'_> {
    /// Whether every value the view names lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.stride >= self.cols
                && (self.rows - 1) * self.stride + self.cols <= self.data.len())
    }
}

/// Rows of one block of a product: large enough for sgemm's packing to pay, small enough that
/// every thread gets several.
fn block_rows(m: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    m.div_ceil(threads * 4).clamp(16, 256)
}

/// `c[i][j] = Σ_t a[i][t] · b[j][t]` (`a · bᵀ`: `b` holds the output's rows of weights, as a
/// linear layer stores them): `a` is `m × k`, `b` is `n × k`, `c` is `m × n` with row stride
/// `ldc` (its other columns untouched).
pub fn matmul_t(a: Rows<'_>, b: Rows<'_>, c: &mut [f32], ldc: usize) {
    product(a, b, true, c, ldc)
}

/// `c[i][j] = Σ_t a[i][t] · b[t][j]`: `a` is `m × k`, `b` is `k × n`, `c` is `m × n` with row
/// stride `ldc`.
pub fn matmul(a: Rows<'_>, b: Rows<'_>, c: &mut [f32], ldc: usize) {
    product(a, b, false, c, ldc)
}

fn product(a: Rows<'_>, b: Rows<'_>, transposed: bool, c: &mut [f32], ldc: usize) {
    let (m, k) = (a.rows, a.cols);
    let n = if transposed { b.rows } else { b.cols };
    let bk = if transposed { b.cols } else { b.rows };
    assert!(
        a.fits() && b.fits() && bk == k && ldc >= n && (m == 0 || (m - 1) * ldc + n <= c.len()),
        "sgemm operands: a {m}x{k}, b {}x{} ({transposed}), c {} values at stride {ldc}",
        b.rows,
        b.cols,
        c.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    let rows = block_rows(m);
    // Each block writes its own rows of `c`: disjoint slices (the last one may end early).
    c.par_chunks_mut(rows * ldc)
        .enumerate()
        .for_each(|(blk, cb)| {
            let r0 = blk * rows;
            if r0 >= m {
                return;
            }
            let mr = rows.min(m - r0);
            let (rsb, csb) = if transposed {
                (1, b.stride as isize)
            } else {
                (b.stride as isize, 1)
            };
            // SAFETY: `a` holds rows r0..r0+mr of k values at stride a.stride, `b` its k × n
            // values at the strides above, and `cb` rows 0..mr of n values at stride ldc: the
            // assertion above and the block bounds keep every index inside the slices, and `cb`
            // is this block's own part of `c`.
            unsafe {
                matrixmultiply::sgemm(
                    mr,
                    k,
                    n,
                    1.0,
                    a.data.as_ptr().add(r0 * a.stride),
                    a.stride as isize,
                    1,
                    b.data.as_ptr(),
                    rsb,
                    csb,
                    0.0,
                    cb.as_mut_ptr(),
                    ldc as isize,
                    1,
                );
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|t| a[i * k + t] * b[j * k + t]).sum();
            }
        }
        c
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn products_with_strides_match_the_plain_sums() {
        let (m, k, n) = (37, 19, 23);
        let (a, b) = (values(m * k, 1), values(n * k, 2));
        let want = naive(&a, &b, m, k, n);
        let mut c = vec![0.0; m * n];
        let av = Rows {
            data: &a,
            rows: m,
            cols: k,
            stride: k,
        };
        matmul_t(
            av,
            Rows {
                data: &b,
                rows: n,
                cols: k,
                stride: k,
            },
            &mut c,
            n,
        );
        let close = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| (p - q).abs() < 1e-4);
        assert!(close(&c, &want));
        // bᵀ laid out k × n gives the same through `matmul`.
        let bt: Vec<f32> = (0..k)
            .flat_map(|t| (0..n).map(move |j| (t, j)))
            .map(|(t, j)| b[j * k + t])
            .collect();
        let mut c2 = vec![0.0; m * n];
        matmul(
            av,
            Rows {
                data: &bt,
                rows: k,
                cols: n,
                stride: n,
            },
            &mut c2,
            n,
        );
        assert!(close(&c2, &want));
        // Written into columns 5.. of rows 40 wide, the other columns untouched.
        let mut wide = vec![7.0; m * 40];
        matmul_t(
            av,
            Rows {
                data: &b,
                rows: n,
                cols: k,
                stride: k,
            },
            &mut wide[5..],
            40,
        );
        for i in 0..m {
            assert!(close(
                &wide[i * 40 + 5..i * 40 + 5 + n],
                &want[i * n..(i + 1) * n]
            ));
            assert!(wide[i * 40..i * 40 + 5].iter().all(|&v| v == 7.0));
        }
    }
}
