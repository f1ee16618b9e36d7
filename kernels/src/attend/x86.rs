//! The x86 kernels of [`super`]: AVX-512 (16-float slices, the scores' key widening and lane
//! sums) and AVX2 (8-float slices), and the weighted sums' inner loop both widths share.

/// The weighted sums' inner loop for one register width (AVX2's 8 floats, AVX-512's 16): adds
/// to `S` slices of `$w` floats from `c` of every query's output its sum over keys `lo ..= hi`
/// (those of its range). Each key's slices are loaded once for all queries and the sums stay in
/// registers over the keys (increasing order, one FMA per key and lane onto the output's
/// value, so neither the width nor a split of the keys into blocks changes a number), with
/// range checks only outside the keys `(clo, chi)` common to every query. Weight `j` of query `i` is `weights[i][j − first]`, key `j`'s value `values[j −
/// first]`.
macro_rules! slices_fn {
    ($feat:literal, $w:literal, $v:ty, $zero:ident, $load:ident, $loadf:ident, $set1:ident, $fma:ident, $store:ident) => {
        /// See `slices_fn!`.
        ///
        /// # Safety
        /// The CPU has the function's features; `c + w·S` ≤ the length of every value of keys
        /// `lo ..= hi` and every output.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn slices<R: Row, const S: usize, const NQ: usize>(
            weights: &[&[f32]],
            ranges: &[(usize, usize)],
            first: usize,
            values: &[R],
            outs: &mut [&mut [f32]],
            c: usize,
            (lo, hi): (usize, usize),
            (clo, chi): (usize, usize),
        ) {
            let w: [&[f32]; NQ] = std::array::from_fn(|i| weights[i]);
            let r: [(usize, usize); NQ] = std::array::from_fn(|i| ranges[i]);
            let mut acc = [[$zero(); S]; NQ];
            for (sums, out) in acc.iter_mut().zip(outs.iter()) {
                for (s, sum) in sums.iter_mut().enumerate() {
                    // SAFETY: every output holds c + w·S floats (this function's contract).
                    *sum = unsafe { $loadf(out.as_ptr().add(c + $w * s)) };
                }
            }
            for j in lo..=hi {
                // Keys outside the common range are summed only by the queries whose range
                // holds them.
                let checked = j < clo || j > chi;
                let vr = values[j - first];
                let mut v = [$zero(); S];
                for (s, v) in v.iter_mut().enumerate() {
                    // SAFETY: value j holds c + w·S values (this function's contract).
                    *v = unsafe { vr.$load(c + $w * s) };
                }
                for i in 0..NQ {
                    if !checked || (j >= r[i].0 && j <= r[i].1) {
                        let p = $set1(w[i][j - first]);
                        for s in 0..S {
                            acc[i][s] = $fma(p, v[s], acc[i][s]);
                        }
                    }
                }
            }
            for (out, sums) in outs.iter_mut().zip(&acc) {
                for (s, &sum) in sums.iter().enumerate() {
                    // SAFETY: every output holds c + w·S floats (this function's contract).
                    unsafe { $store(out.as_mut_ptr().add(c + $w * s), sum) };
                }
            }
        }
    };
}

/// `slices::<R, S, NQ>` of module `$m` for the run-time query count `$nq` (1 to
/// [`crate::attend::WIDE_QUERIES`]).
macro_rules! slices_for {
    ($($m:ident)::+, $s:literal, $nq:expr, ($($arg:expr),*)) => {
        match $nq {
            1 => $($m)::+::slices::<R, $s, 1>($($arg),*),
            2 => $($m)::+::slices::<R, $s, 2>($($arg),*),
            3 => $($m)::+::slices::<R, $s, 3>($($arg),*),
            4 => $($m)::+::slices::<R, $s, 4>($($arg),*),
            5 => $($m)::+::slices::<R, $s, 5>($($arg),*),
            6 => $($m)::+::slices::<R, $s, 6>($($arg),*),
            7 => $($m)::+::slices::<R, $s, 7>($($arg),*),
            _ => $($m)::+::slices::<R, $s, 8>($($arg),*),
        }
    };
}

/// The queries of one kernel call as an array of `NQ`, and their length `d`, checked against
/// every key: the scores kernels' common entry checks.
fn checked<'q, R: crate::kv::Row, const NQ: usize>(
    queries: &[&'q [f32]],
    keys: &[R],
) -> ([&'q [f32]; NQ], usize) {
    let q: [&[f32]; NQ] = std::array::from_fn(|i| queries[i]);
    let d = q[0].len();
    assert!(q.iter().all(|q| q.len() == d) && keys.iter().all(|k| k.len() == d));
    (q, d)
}

pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use crate::kv::Row;

    /// `NQ` queries against every key, four keys at a time, in 16-float slices: one 16-lane
    /// accumulator per pair (sixteen of the 32 registers; `NQ` is a constant so that they stay
    /// in registers), the sixteen reduced together by [`reduce16`]: eight loads feed sixteen
    /// FMAs. A pair's
    /// sum runs in another order than the 8-float one, so its last bits may differ from the AVX2
    /// path's; it is fixed whatever the blocking, so a query gets the same bits alone and in a
    /// block.
    ///
    /// Pair (i, j) goes to `out[i·stride + offset + j]`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(in crate::attend) unsafe fn scores<R: Row, const NQ: usize>(
        queries: &[&[f32]],
        keys: &[R],
        out: &mut [f32],
        stride: usize,
        offset: usize,
    ) {
        let (q, d) = super::checked::<R, NQ>(queries, keys);
        let full = d / 16 * 16;
        assert!(NQ > 0 && out.len() >= (NQ - 1) * stride + offset + keys.len());
        for (j0, four) in keys.chunks(4).enumerate() {
            let nk = four.len();
            // Fewer than four keys: the last one stands in for the missing (its sums are dropped).
            let k = [
                four[0],
                four[1.min(nk - 1)],
                four[2.min(nk - 1)],
                four[nk - 1],
            ];
            let mut acc = [[_mm512_setzero_ps(); 4]; NQ];
            let mut c = 0;
            while c < full {
                // SAFETY: c + 16 ≤ d, the length of every query and key (asserted above); the
                // caller checked AVX-512 F.
                unsafe {
                    let kv = [
                        k[0].load16(c),
                        k[1].load16(c),
                        k[2].load16(c),
                        k[3].load16(c),
                    ];
                    for i in 0..NQ {
                        let qv = _mm512_loadu_ps(q[i].as_ptr().add(c));
                        for j in 0..4 {
                            acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
                        }
                    }
                }
                c += 16;
            }
            let mut pairs = [_mm512_setzero_ps(); 16];
            for (i, acc) in acc.iter().enumerate() {
                pairs[4 * i..4 * i + 4].copy_from_slice(acc);
            }
            let mut sums = [0f32; 16];
            // SAFETY: 16 floats to `sums`; the caller checked AVX-512 F.
            unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), reduce16(pairs)) };
            for i in 0..NQ {
                for j in 0..4 {
                    if j < nk {
                        let mut s = sums[4 * j + i];
                        for (t, &x) in q[i].iter().enumerate().skip(full) {
                            s += x * four[j].get(t);
                        }
                        out[i * stride + offset + 4 * j0 + j] = s;
                    }
                }
            }
        }
    }

    /// Keys as f32 rows of `d` floats in `buf`, each value read as the kernels read it.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(in crate::attend) unsafe fn widen<R: Row>(keys: &[R], d: usize, buf: &mut [f32]) {
        let full = d / 16 * 16;
        assert!(buf.len() >= keys.len() * d);
        for (k, dst) in keys.iter().zip(buf.chunks_exact_mut(d)) {
            assert!(k.len() == d);
            let mut c = 0;
            while c < full {
                // SAFETY: c + 16 ≤ d, the length of the key and of its row in `buf`.
                unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(c), k.load16(c)) };
                c += 16;
            }
            for (t, x) in dst.iter_mut().enumerate().skip(full) {
                *x = k.get(t);
            }
        }
    }

    /// The sixteen lane sums of sixteen vectors at once: lane `4j + i` of the result is the sum
    /// of `v[4i + j]`'s lanes. Each vector's lanes are paired as `_mm512_reduce_add_ps` pairs them
    /// (lane l with l + 8, then l + 4, l + 2, l + 1), so every sum has the same bits as that
    /// reduction's, in 15 additions and 30 shuffles where sixteen reductions take 64 and 64.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn reduce16(v: [__m512; 16]) -> __m512 {
        // Lanes l and l + 8: [v₂ₚ halves summed | v₂ₚ₊₁ halves summed].
        let mut w = [_mm512_setzero_ps(); 8];
        for (p, w) in w.iter_mut().enumerate() {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            *w = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            );
        }
        // l and l + 4: 128-bit chunk k of x_q holds v₄q₊ₖ's four partial sums.
        let mut x = [_mm512_setzero_ps(); 4];
        for (q, x) in x.iter_mut().enumerate() {
            let (a, b) = (w[2 * q], w[2 * q + 1]);
            *x = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            );
        }
        // l and l + 2, then l and l + 1, within each 128-bit chunk.
        let y0 = _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(x[0], x[1]),
            _mm512_shuffle_ps::<0xEE>(x[0], x[1]),
        );
        let y1 = _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(x[2], x[3]),
            _mm512_shuffle_ps::<0xEE>(x[2], x[3]),
        );
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(y0, y1),
            _mm512_shuffle_ps::<0xDD>(y0, y1),
        )
    }

    slices_fn!(
        "avx512f",
        16,
        __m512,
        _mm512_setzero_ps,
        load16,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps
    );
}

pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use crate::kv::Row;
    use crate::ops::avx2::hsum;

    /// `NQ` queries against every key, two keys at a time, in 8-float slices: one 8-lane
    /// accumulator per pair (`NQ` a constant so that they stay in registers).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::attend) unsafe fn scores<R: Row, const NQ: usize>(
        queries: &[&[f32]],
        keys: &[R],
        out: &mut [f32],
    ) {
        let (q, d) = super::checked::<R, NQ>(queries, keys);
        let full = d / 8 * 8;
        let n = keys.len();
        assert!(out.len() >= NQ * n);
        for (j0, pair) in keys.chunks(2).enumerate() {
            let nk = pair.len();
            let (k0, k1) = (pair[0], pair[nk - 1]);
            let mut acc = [[_mm256_setzero_ps(); 2]; NQ];
            let mut c = 0;
            while c < full {
                // SAFETY: c + 8 ≤ d, the length of every query and key (asserted above).
                unsafe {
                    let kv = [k0.load8(c), k1.load8(c)];
                    for i in 0..NQ {
                        let qv = _mm256_loadu_ps(q[i].as_ptr().add(c));
                        acc[i][0] = _mm256_fmadd_ps(qv, kv[0], acc[i][0]);
                        acc[i][1] = _mm256_fmadd_ps(qv, kv[1], acc[i][1]);
                    }
                }
                c += 8;
            }
            for i in 0..NQ {
                for j in 0..2 {
                    if j < nk {
                        let mut s = hsum(acc[i][j]);
                        for (t, &x) in q[i].iter().enumerate().skip(full) {
                            s += x * pair[j].get(t);
                        }
                        out[i * n + 2 * j0 + j] = s;
                    }
                }
            }
        }
    }

    /// See `super::weighted_sums`, for up to [`crate::attend::QUERIES`] queries (up to
    /// [`crate::attend::WIDE_QUERIES`] where `wide`), over the keys of `block` only (inclusive),
    /// added to the outputs: a caller that splits the keys into blocks zeroes the outputs first
    /// and goes through the blocks in increasing order, and gets the numbers of one block of
    /// all. The columns past the last whole 8 (a head size that is not a multiple of 8) are
    /// written whole when `block` holds the first key. `wide`: the CPU has AVX-512 F, and whole
    /// 64-float slices (32 with more than four queries) and 16-float ones take its registers.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (and AVX-512 F where `wide`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::attend) unsafe fn weighted_sums<R: Row>(
        weights: &[&[f32]],
        ranges: &[(usize, usize)],
        first: usize,
        values: &[R],
        outs: &mut [&mut [f32]],
        wide: bool,
        block: (usize, usize),
    ) {
        let nq = weights.len();
        let most = if wide {
            crate::attend::WIDE_QUERIES
        } else {
            crate::attend::QUERIES
        };
        assert!(nq <= most && ranges.len() == nq && outs.len() == nq);
        let d = outs[0].len();
        let full = d / 8 * 8;
        let all_lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let lo = all_lo.max(block.0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0).min(block.1);
        for (w, &(a, b)) in weights.iter().zip(ranges) {
            assert!(a >= first && w.len() > b - first);
        }
        for j in lo..=hi {
            assert!(values[j - first].len() == d);
        }
        for o in outs.iter() {
            assert!(o.len() == d);
        }
        // Keys every query sums (no range check), between those only some do.
        let common = (
            ranges.iter().map(|r| r.0).max().unwrap_or(0).max(block.0),
            ranges.iter().map(|r| r.1).min().unwrap_or(0).min(block.1),
        );
        // The columns past the last whole 8, whole (every key of every range), once: in the
        // block that holds the first key any query sums.
        if block.0 <= all_lo && all_lo <= block.1 {
            for i in 0..nq {
                for (t, o) in outs[i].iter_mut().enumerate().skip(full) {
                    let mut s = 0f32;
                    for j in ranges[i].0..=ranges[i].1 {
                        s += weights[i][j - first] * values[j - first].get(t);
                    }
                    *o = s;
                }
            }
        }
        if lo > hi {
            return;
        }
        let keys = (lo, hi);
        let mut c = 0;
        if wide && nq > crate::attend::QUERIES {
            while c + 32 <= full {
                // SAFETY: AVX-512 F (the caller's `wide`); c + 32 ≤ d (asserted above).
                unsafe {
                    slices_for!(
                        super::avx512,
                        2,
                        nq,
                        (weights, ranges, first, values, outs, c, keys, common)
                    )
                };
                c += 32;
            }
        }
        if wide {
            while c + 64 <= full {
                // SAFETY: AVX-512 F (the caller's `wide`); c + 64 ≤ d (asserted above).
                unsafe {
                    slices_for!(
                        super::avx512,
                        4,
                        nq,
                        (weights, ranges, first, values, outs, c, keys, common)
                    )
                };
                c += 64;
            }
            while c + 16 <= full {
                // SAFETY: as above, c + 16 ≤ d.
                unsafe {
                    slices_for!(
                        super::avx512,
                        1,
                        nq,
                        (weights, ranges, first, values, outs, c, keys, common)
                    )
                };
                c += 16;
            }
        }
        while c + 16 <= full {
            // SAFETY: c + 16 ≤ d, the length of every value and output (asserted above).
            unsafe {
                slices_for!(
                    self,
                    2,
                    nq,
                    (weights, ranges, first, values, outs, c, keys, common)
                )
            };
            c += 16;
        }
        if c < full {
            // SAFETY: c + 8 ≤ d, as above.
            unsafe {
                slices_for!(
                    self,
                    1,
                    nq,
                    (weights, ranges, first, values, outs, c, keys, common)
                )
            };
        }
    }

    slices_fn!(
        "avx2,fma,f16c",
        8,
        __m256,
        _mm256_setzero_ps,
        load8,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
}
