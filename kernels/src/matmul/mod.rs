//! Host kernels: matrix × activations straight on the 4-/8-bit tiles (no f32 copy of the model).
//!
//! For one row band of `P` rows and one 32-column group the product is
//! `y[r] += d[r,g]·Σ_c q[r,c]·x[c] + m[r,g]·Σ_c x[c]`: the inner sum runs on raw codes, the scale
//! and zero-point are applied once per group, and the activation group sums are computed once per
//! call. Rows are split across threads by row block (rayon). Each token's arithmetic is the same
//! sequence of operations whatever the batch size, so a batched prefill produces bit-for-bit the
//! values of token-by-token steps.
//!
//! Every layout takes its activations as int8 ([`Activations`]): per token and 32-column group
//! one f32 scale `amax/127` and 32 codes, as llama.cpp's `Q8_1` does. The inner sum is then an
//! exact integer (4-bit codes: `u8×i8` pair products, `maddubs` on AVX2; 8-bit codes: `i16×i16`
//! pairs, `madd`), `y[r] += d[r,g]·dx[g]·Σ q·xq + m[r,g]·dx[g]·Σ xq`: exactly the product of the
//! weights with the dequantized activations ([`Activations::effective`]), which is what the tests
//! and the self-check compare against.
//!
//! Paths, chosen at run time: AVX-512 VNNI for the 4-bit kinds (`x86_512`: `vpdpbusd` on codes
//! put in row order by `vpermb`), AVX2+FMA (16-row sub-bands, even/odd nibbles in two
//! registers), and a portable scalar path with the same formulas. [`self_check`] compares either with the reference
//! decode on a pack's own weights at load.

/// A `[T; N]` of index values computed at compile time, `$e` of each `$i < N` (the SIMD paths'
/// byte and lane permutations; a `const fn` cannot take the formula as a closure).
#[cfg(target_arch = "x86_64")]
macro_rules! index_table {
    ($t:ty, $n:expr, |$i:ident| $e:expr) => {{
        let mut out = [0 as $t; $n];
        let mut $i = 0;
        while $i < $n {
            out[$i] = ($e) as $t;
            $i += 1;
        }
        out
    }};
}

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
mod batch;
pub mod layout;
pub(crate) mod path;
mod scalar;
pub mod scan;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_512;

pub use activations::{Activations, BlockOrder};
pub use batch::{matmul_gated, matmul_many};
pub use layout::{Codes, TileLayout};
pub use path::{KernelPath, PATH_VAR};

/// A tiled weight matrix `W[rows][k]` borrowed from the mapped pack.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    /// Tile layout.
    pub layout: TileLayout,
    /// Logical rows.
    pub rows: usize,
    /// Logical K (columns).
    pub k: usize,
    /// Tiles per row block (`ceil(k/C)`).
    pub ct: usize,
    /// The tiles, row-block major.
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// A view of `data` as `rows × k` in `layout`; `None` when the sizes disagree.
    pub fn new(layout: TileLayout, rows: usize, k: usize, data: &'a [u8]) -> Option<Self> {
        let ct = k.div_ceil(layout.cols);
        let rb = rows.div_ceil(layout.rows);
        (data.len() == rb * ct * layout.bytes).then_some(QMatrix {
            layout,
            rows,
            k,
            ct,
            data,
        })
    }

    /// K padded to whole tiles.
    pub fn k_padded(&self) -> usize {
        self.ct * self.layout.cols
    }

    fn row_blocks(&self) -> usize {
        self.rows.div_ceil(self.layout.rows)
    }

    /// The tile `(rb, cb)`.
    #[inline]
    pub fn tile(&self, rb: usize, cb: usize) -> &'a [u8] {
        let w = self.layout.bytes;
        let i = rb * self.ct + cb;
        &self.data[i * w..(i + 1) * w]
    }

    /// Reference decode of row `r` into `out[..k]` (slow; tests and self-checks).
    pub fn row_reference(&self, r: usize, out: &mut [f32]) {
        let l = &self.layout;
        let (rb, rr) = (r / l.rows, r % l.rows);
        for (c, o) in out[..self.k].iter_mut().enumerate() {
            *o = l.w(self.tile(rb, c / l.cols), rr, c % l.cols);
        }
    }

    /// `y[t][r] = Σ_c W[r][c]·x[t][c]` for `t < n`, with `x` as `n × k` and `y` as `n × rows`.
    pub fn matmul(&self, path: KernelPath, x: &[f32], n: usize, y: &mut [f32]) {
        matmul_many(path, std::slice::from_ref(self), x, n, &mut [y]);
    }

    /// One row block into `out[t·stride + local + r]`.
    fn block(
        &self,
        path: KernelPath,
        rb: usize,
        a: &Activations,
        out: &mut [f32],
        stride: usize,
        local: usize,
    ) {
        match path {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Amx if x86_512::covers(self.layout.codes) => {
                // SAFETY: `KernelPath::Amx` is only produced after checking the CPU for AMX-INT8 (and
                // the OS for tile state) besides everything `KernelPath::Avx512Vnni` needs; the kernel
                // asks Linux for this thread's permission itself.
                unsafe { amx::block(self, rb, a, out, stride, local) }
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512Vnni | KernelPath::Amx if x86_512::covers(self.layout.codes) => {
                // SAFETY: `KernelPath::Avx512Vnni` is only produced by `KernelPath::detect`/`available`
                // after checking the CPU for AVX-512 F/BW/VNNI/VBMI, AVX2 and FMA.
                unsafe { x86_512::block(self, rb, a, out, stride, local) }
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 | KernelPath::Avx512Vnni | KernelPath::Amx => {
                // SAFETY: all three paths are only produced after checking the CPU for AVX2 and FMA.
                unsafe { x86::block(self, rb, a, out, stride, local) }
            }
            _ => scalar::block(self, rb, a, out, stride, local),
        }
    }
}

/// Result of [`self_check`] on one matrix.
#[derive(Clone, Debug)]
pub struct CheckResult {
    /// Largest |kernel − reference| / (‖reference‖∞ + tiny) over the checked rows.
    pub max_rel: f32,
    /// Rows checked.
    pub rows: usize,
}

/// Runs the kernel on a pseudo-random activation and compares the first and last row block with
/// the reference decode (exact f64 dot products on the activations as the kernel reads them, so
/// int8 activation rounding is not counted as kernel error). Tolerance is the caller's.
pub fn self_check(m: &QMatrix<'_>, path: KernelPath) -> CheckResult {
    let x = check_input(m.k);
    let mut y = vec![0f32; m.rows];
    m.matmul(path, &x, 1, &mut y);
    let x = Activations::new(&x, 1, m.k, m.k_padded()).effective();
    let r_tile = m.layout.rows;
    compare_rows(&y, r_tile, &x[..m.k], |r, w| m.row_reference(r, w))
}

/// The pseudo-random activation of a self-check (`k` values in ±0.5).
pub(crate) fn check_input(k: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// Compares the first and last `band` rows of a kernel's output `y` with exact f64 dot products
/// of the reference rows (`row_ref(r, out)`) and the activations `x` as the kernel read them.
pub(crate) fn compare_rows(
    y: &[f32],
    band: usize,
    x: &[f32],
    mut row_ref: impl FnMut(usize, &mut [f32]),
) -> CheckResult {
    let n = y.len();
    let mut rows: Vec<usize> = (0..band.min(n)).collect();
    rows.extend(n.saturating_sub(band)..n);
    rows.dedup();
    let mut w = vec![0f32; x.len()];
    let mut scale = 0f64;
    let mut errs = Vec::new();
    for &r in &rows {
        row_ref(r, &mut w);
        let want: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
        scale = scale.max(want.abs());
        errs.push((y[r] as f64 - want).abs());
    }
    let max_rel = errs
        .into_iter()
        .fold(0f32, |m, e| m.max((e / (scale + 1e-30)) as f32));
    CheckResult {
        max_rel,
        rows: rows.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::random_matrix;

    /// The bit patterns of `v`, for exact comparisons that also see NaNs.
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Exact products on the activations as the kernels read them (see [`Activations`]).
    fn reference_matmul(m: &QMatrix<'_>, x: &[f32], n: usize) -> Vec<f64> {
        let kp = m.k_padded();
        let xe = Activations::new(x, n, m.k, kp).effective();
        let x: Vec<f32> = (0..n)
            .flat_map(|t| xe[t * kp..t * kp + m.k].iter().copied())
            .collect();
        let mut y = vec![0f64; n * m.rows];
        let mut w = vec![0f32; m.k];
        for r in 0..m.rows {
            m.row_reference(r, &mut w);
            for t in 0..n {
                y[t * m.rows + r] = w
                    .iter()
                    .zip(&x[t * m.k..(t + 1) * m.k])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
            }
        }
        y
    }

    #[test]
    fn every_layout_and_path_matches_the_reference_decode() {
        for layout in TileLayout::host_layouts() {
            // K off the tile grid exercises padding; rows span several row blocks.
            let (rows, k) = (layout.rows * 3, layout.cols * 2 + 64);
            let data = random_matrix(layout, rows, k, 7);
            // Padding columns must be zero for the product to be right: zero them like a writer.
            let mut data = data;
            let ct = k.div_ceil(layout.cols);
            for (i, t) in data.chunks_mut(layout.bytes).enumerate() {
                if i % ct == ct - 1 {
                    for r in 0..layout.rows {
                        for g in (k % layout.cols) / 32..layout.groups() {
                            t[2 * (g * layout.rows + r)..2 * (g * layout.rows + r) + 2].fill(0);
                            if layout.zero {
                                let at = layout.zero_base() + 2 * (g * layout.rows + r);
                                t[at..at + 2].fill(0);
                            }
                        }
                    }
                }
            }
            let m = QMatrix::new(layout, rows, k, &data).expect("sizes");
            for n in [1, 3, 6, 16, 37] {
                let x: Vec<f32> = (0..n * k)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                    .collect();
                let want = reference_matmul(&m, &x, n);
                for path in KernelPath::available() {
                    let mut y = vec![0f32; n * rows];
                    m.matmul(path, &x, n, &mut y);
                    let scale = want.iter().fold(0f64, |a, &b| a.max(b.abs()));
                    for (i, (&a, &b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            ((a as f64) - b).abs() <= 1e-5 * scale,
                            "{} {:?} [{i}]: {a} vs {b}",
                            layout.name,
                            path
                        );
                    }
                    assert!(self_check(&m, path).max_rel < 1e-5);
                }
            }
        }
    }

    #[test]
    fn rows_ending_mid_block_are_written_for_one_token_and_for_a_batch() {
        let layout = TileLayout::by_name("Q41_1280").expect("layout");
        let (rows, k) = (layout.rows * 2 + 5, layout.cols * 2);
        let data = random_matrix(layout, rows, k, 5);
        let m = QMatrix::new(layout, rows, k, &data).expect("sizes");
        let x: Vec<f32> = (0..3 * k)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let want = reference_matmul(&m, &x, 3);
        let scale = want.iter().fold(0f64, |a, &b| a.max(b.abs()));
        for path in KernelPath::available() {
            let mut batch = vec![f32::NAN; 3 * rows];
            m.matmul(path, &x, 3, &mut batch);
            for t in 0..3 {
                // Poisoned output: every row must be overwritten, not accumulated into.
                let mut one = vec![f32::NAN; rows];
                m.matmul(path, &x[t * k..(t + 1) * k], 1, &mut one);
                assert_eq!(
                    bits(&one),
                    bits(&batch[t * rows..(t + 1) * rows]),
                    "{path:?} token {t}"
                );
                for (r, &v) in one.iter().enumerate() {
                    let w = want[t * rows + r];
                    assert!(
                        ((v as f64) - w).abs() <= 1e-5 * scale,
                        "{path:?} [{t}][{r}]"
                    );
                }
            }
        }
    }

    #[test]
    fn amx_tiles_give_the_avx512_numbers_bit_for_bit() {
        // AMX and AVX-512 VNNI share their f32 steps: bit for bit. Both differ from AVX2 only in
        // the order of float additions (checked against the reference in the test above).
        let paths = KernelPath::available();
        if !paths.contains(&KernelPath::Amx) {
            eprintln!("no AMX-INT8 on this CPU: the tile path is not run here");
            return;
        }
        // A thread Linux refuses runs the AVX-512 kernels instead: the numbers must match
        // either way, so a refusal is reported, not failed.
        let granted = rayon::broadcast(|_| amx::thread_ready());
        if !granted.iter().all(|&g| g) {
            eprintln!("Linux refused AMX to a pool thread ({granted:?}): comparing the fallback");
        }
        for layout in TileLayout::host_layouts().filter(|l| l.codes != Codes::Signed8) {
            let (rows, k) = (layout.rows * 3, layout.cols * 2 + 64);
            let data = random_matrix(layout, rows, k, 3);
            let m = QMatrix::new(layout, rows, k, &data).expect("sizes");
            for n in [16, 35, 64] {
                let x: Vec<f32> = (0..n * k)
                    .map(|i| ((i * 29 % 61) as f32 - 30.0) / 17.0)
                    .collect();
                let mut tiles = vec![0f32; n * rows];
                let mut vnni = vec![0f32; n * rows];
                m.matmul(KernelPath::Amx, &x, n, &mut tiles);
                m.matmul(KernelPath::Avx512Vnni, &x, n, &mut vnni);
                assert_eq!(bits(&tiles), bits(&vnni), "{} n={n}", layout.name);
            }
        }
    }

    #[test]
    fn a_gated_pair_gives_both_products_then_the_gate_bit_for_bit() {
        // f: any element-wise function of (g, u); the FFN passes act(g)·u.
        let f = |g: &mut [f32], u: &[f32]| {
            for (a, &b) in g.iter_mut().zip(u) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
        };
        for layout in
            ["Q41_5120", "Q40_4608", "Q8L_8704"].map(|n| TileLayout::by_name(n).expect("layout"))
        {
            // Rows ending mid-block, several tasks' worth of rows.
            let (rows, k) = (layout.rows * 9 + 5, layout.cols * 2);
            let (gd, ud) = (
                random_matrix(layout, rows, k, 21),
                random_matrix(layout, rows, k, 22),
            );
            let g = QMatrix::new(layout, rows, k, &gd).expect("sizes");
            let u = QMatrix::new(layout, rows, k, &ud).expect("sizes");
            for n in [1, 5, 37] {
                let x: Vec<f32> = (0..n * k)
                    .map(|i| ((i * 17 % 31) as f32 - 15.0) / 8.0)
                    .collect();
                for path in KernelPath::available() {
                    let (mut want, mut up) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                    matmul_many(path, &[g, u], &x, n, &mut [&mut want[..], &mut up[..]]);
                    f(&mut want, &up);
                    let mut got = vec![f32::NAN; n * rows];
                    assert!(matmul_gated(path, &g, &u, &x, n, &mut got, &f).is_some());
                    assert_eq!(bits(&got), bits(&want), "{} {path:?} n={n}", layout.name);
                }
            }
        }
        // Different shapes: refused, for the caller to run apart.
        let l = TileLayout::by_name("Q41_5120").expect("layout");
        let (a, b) = (random_matrix(l, 64, 256, 1), random_matrix(l, 32, 256, 2));
        let (a, b) = (
            QMatrix::new(l, 64, 256, &a).expect("sizes"),
            QMatrix::new(l, 32, 256, &b).expect("sizes"),
        );
        let mut h = vec![0f32; 64];
        assert!(matmul_gated(KernelPath::Scalar, &a, &b, &[0.0; 256], 1, &mut h, &f).is_none());
    }

    #[test]
    fn a_batch_gives_bit_for_bit_the_single_token_results() {
        for layout in TileLayout::host_layouts() {
            let (rows, k) = (layout.rows * 2, layout.cols * 2);
            let data = random_matrix(layout, rows, k, 11);
            let m = QMatrix::new(layout, rows, k, &data).expect("sizes");
            let n = 37;
            let x: Vec<f32> = (0..n * k)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
                .collect();
            for path in KernelPath::available() {
                let mut batch = vec![0f32; n * rows];
                m.matmul(path, &x, n, &mut batch);
                for t in 0..n {
                    let mut one = vec![0f32; rows];
                    m.matmul(path, &x[t * k..(t + 1) * k], 1, &mut one);
                    assert_eq!(
                        bits(&one),
                        bits(&batch[t * rows..(t + 1) * rows]),
                        "{} {path:?} token {t}",
                        layout.name
                    );
                }
            }
        }
    }
}
