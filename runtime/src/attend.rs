//! Attention's two products over the KV cache, blocked: several query vectors (the rows of one
//! sequence in a pass, the heads of one GQA group) against each key and value loaded once.
//!
//! * [`scores`]: `q·k` for up to 4 queries × 2 keys per step of the loop, each pair in its own
//!   8-lane accumulator: six loads feed eight FMAs, where one `dot` per pair loads two per FMA.
//! * [`weighted_sums`]: `Σⱼ pⱼ·vⱼ` for up to 4 queries per 8-float slice of the head, each `vⱼ`
//!   slice loaded once for all of them and the sums kept in registers over the keys, where an
//!   `axpy` per (query, key) loads and stores the sum each time.
//!
//! Each pair's (each output element's) arithmetic is fixed whatever the blocking — the same
//! accumulator, the same order over the head and over the keys, the same final reduction — so a
//! query's numbers are bit for bit the same alone (decode) as in a block (prefill, batches).

use crate::kv::Row;
#[cfg(target_arch = "x86_64")]
use crate::ops::simd;

/// `a·b` with eight partial sums in a fixed order (`ops::dot_portable`'s), `b` read in its own
/// type: the scores where the CPU has no AVX2.
fn dot_portable<R: Row>(a: &[f32], b: &R) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; 8];
    for i in 0..n / 8 {
        for (j, s) in acc.iter_mut().enumerate() {
            *s += a[i * 8 + j] * b.get(i * 8 + j);
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (i, &x) in a.iter().enumerate().take(n).skip(n / 8 * 8) {
        s += x * b.get(i);
    }
    s
}

/// Queries per block.
pub const QUERIES: usize = 4;

/// Queries per block of the weighted sums on the AVX-512 path: eight queries × two 16-float
/// slices take sixteen of the 32 registers, and each value slice is converted once for eight
/// queries instead of four.
const WIDE_QUERIES: usize = 8;

/// Floats of keys widened to f32 at a time for the AVX-512 scores: a block that stays in L1 (32
/// KiB) while every query of the task is scored against it.
const KEY_BLOCK_FLOATS: usize = 8192;

/// `out[i·keys.len() + j] = q_i·k_j` for any number of queries (all of one length `d`), the keys
/// read in the cache's own type. Queries go through the kernels [`QUERIES`] at a time; on the
/// AVX-512 path the keys are first widened to f32 a block at a time, once for all the queries
/// (a conversion per key and slice instead of one per query block). Each pair's arithmetic is
/// the same in any case.
pub fn scores<R: Row>(queries: &[&[f32]], keys: &[R], out: &mut [f32]) {
    let n = keys.len();
    assert!(out.len() >= queries.len() * n);
    if queries.is_empty() || keys.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        let d = queries[0].len();
        if wide() && d <= KEY_BLOCK_FLOATS / 4 {
            let per = KEY_BLOCK_FLOATS / d;
            let mut buf = [0f32; KEY_BLOCK_FLOATS];
            for (b, block) in keys.chunks(per).enumerate() {
                // SAFETY: `simd()` checked AVX2, FMA and F16C, `wide()` AVX-512 F.
                unsafe { avx512::widen(block, d, &mut buf) };
                let rows: Vec<&[f32]> = buf.chunks_exact(d).take(block.len()).collect();
                for (c, qs) in queries.chunks(QUERIES).enumerate() {
                    let out = &mut out[c * QUERIES * n..];
                    // SAFETY: as above.
                    unsafe {
                        match qs.len() {
                            1 => avx512::scores::<_, 1>(qs, &rows, out, n, b * per),
                            2 => avx512::scores::<_, 2>(qs, &rows, out, n, b * per),
                            3 => avx512::scores::<_, 3>(qs, &rows, out, n, b * per),
                            _ => avx512::scores::<_, 4>(qs, &rows, out, n, b * per),
                        }
                    }
                }
            }
            return;
        }
        for (c, qs) in queries.chunks(QUERIES).enumerate() {
            let out = &mut out[c * QUERIES * n..];
            // SAFETY: `simd()` checked AVX2, FMA and F16C, `wide()` AVX-512 F.
            unsafe {
                match (wide(), qs.len()) {
                    (true, 1) => avx512::scores::<R, 1>(qs, keys, out, n, 0),
                    (true, 2) => avx512::scores::<R, 2>(qs, keys, out, n, 0),
                    (true, 3) => avx512::scores::<R, 3>(qs, keys, out, n, 0),
                    (true, _) => avx512::scores::<R, 4>(qs, keys, out, n, 0),
                    (false, 1) => avx2::scores::<R, 1>(qs, keys, out),
                    (false, 2) => avx2::scores::<R, 2>(qs, keys, out),
                    (false, 3) => avx2::scores::<R, 3>(qs, keys, out),
                    (false, _) => avx2::scores::<R, 4>(qs, keys, out),
                }
            }
        }
        return;
    }
    for (i, q) in queries.iter().enumerate() {
        for (j, k) in keys.iter().enumerate() {
            out[i * n + j] = dot_portable(q, k);
        }
    }
}

/// `out_i = Σ_{j ∈ range_i} p_i[j − first]·v_j` for any number of queries: `values[j − first]`
/// is key `j`'s value vector, `weights[i]` query `i`'s weights from key `first` on, and query `i`
/// sums keys `ranges[i].0 ..= ranges[i].1` (its causal window) in increasing order. Each output
/// is overwritten. Queries go through the kernels [`QUERIES`] at a time ([`WIDE_QUERIES`] on the
/// AVX-512 path), each block reading the values in their own type. (Widening them to f32 a block of keys at a time, as the scores do,
/// measured slower: `benches/attend.rs`, 66–68 against 88–97 GFLOP/s at one thread; the
/// conversions overlap the FMAs, the separate widening pass does not.)
pub fn weighted_sums<R: Row>(
    weights: &[&[f32]],
    ranges: &[(usize, usize)],
    first: usize,
    values: &[R],
    outs: &mut [&mut [f32]],
) {
    assert!(weights.len() == ranges.len() && outs.len() == ranges.len());
    if weights.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        for o in outs.iter_mut() {
            o.fill(0.0);
        }
        let per = if wide() { WIDE_QUERIES } else { QUERIES };
        for ((w, r), o) in weights
            .chunks(per)
            .zip(ranges.chunks(per))
            .zip(outs.chunks_mut(per))
        {
            // SAFETY: `simd()` checked AVX2, FMA and F16C; `wide()` AVX-512 F.
            unsafe { avx2::accumulate(w, first, r, values, first, o, wide()) };
        }
        return;
    }
    for ((w, &(lo, hi)), out) in weights.iter().zip(ranges).zip(outs.iter_mut()) {
        out.fill(0.0);
        for j in lo..=hi {
            let p = w[j - first];
            let v = values[j - first];
            for (t, o) in out.iter_mut().enumerate() {
                *o += p * v.get(t);
            }
        }
    }
}

/// The weighted sums' inner loop for one register width (AVX2's 8 floats, AVX-512's 16): adds
/// to `S` slices of `$w` floats from `c` of every query's output its sum over keys `lo ..= hi`
/// (those of its range). Each key's slices are loaded once for all queries and the sums stay in
/// registers over the keys (increasing order, one FMA per key and lane, so the width never
/// changes a number), with range checks only outside the keys `(clo, chi)` common to every
/// query. Weight `j` of query `i` is `weights[i][j − wfirst]`, key `j`'s value `values[j −
/// vfirst]`.
#[cfg(target_arch = "x86_64")]
macro_rules! slices_fn {
    ($feat:literal, $w:literal, $v:ty, $zero:ident, $load:ident, $loadu:ident, $set1:ident, $fma:ident, $store:ident) => {
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
            wfirst: usize,
            ranges: &[(usize, usize)],
            values: &[R],
            vfirst: usize,
            outs: &mut [&mut [f32]],
            c: usize,
            (lo, hi): (usize, usize),
            (clo, chi): (usize, usize),
        ) {
            let w: [&[f32]; NQ] = std::array::from_fn(|i| weights[i]);
            let r: [(usize, usize); NQ] = std::array::from_fn(|i| ranges[i]);
            let mut acc = [[$zero(); S]; NQ];
            for (out, acc) in outs.iter().zip(acc.iter_mut()) {
                for (s, a) in acc.iter_mut().enumerate() {
                    // SAFETY: every output holds c + w·S floats (this function's contract).
                    *a = unsafe { $loadu(out.as_ptr().add(c + $w * s)) };
                }
            }
            for j in lo..=hi {
                // Keys outside the common range are summed only by the queries whose range
                // holds them.
                let checked = j < clo || j > chi;
                let vr = values[j - vfirst];
                let mut v = [$zero(); S];
                for (s, v) in v.iter_mut().enumerate() {
                    // SAFETY: value j holds c + w·S values (this function's contract).
                    *v = unsafe { vr.$load(c + $w * s) };
                }
                for i in 0..NQ {
                    if !checked || (j >= r[i].0 && j <= r[i].1) {
                        let p = $set1(w[i][j - wfirst]);
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
/// [`WIDE_QUERIES`]).
#[cfg(target_arch = "x86_64")]
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

/// Whether the weighted sums take 16-float slices (AVX-512 F): where the CPU has it and the
/// kernel path is an AVX-512 one (`ONEBIT_KERNELS=avx2` keeps everything on AVX2 for side-by-side
/// runs). Each output element's arithmetic is the same either way, so are the numbers.
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    use crate::kernels::Path;
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        std::is_x86_feature_detected!("avx512f")
            && matches!(Path::detect(), Path::Amx | Path::Avx512Vnni)
    })
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::kv::Row;

    /// `NQ` queries against every key, four keys at a time, in 16-float slices: one 16-lane
    /// accumulator per pair (sixteen of the 32 registers; `NQ` is a constant so that they stay
    /// in registers), reduced by `_mm512_reduce_add_ps`: eight loads feed sixteen FMAs. A pair's
    /// sum runs in another order than the 8-float one, so its last bits may differ from the AVX2
    /// path's; it is fixed whatever the blocking, so a query gets the same bits alone and in a
    /// block.
    ///
    /// Pair (i, j) goes to `out[i·stride + offset + j]`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn scores<R: Row, const NQ: usize>(
        queries: &[&[f32]],
        keys: &[R],
        out: &mut [f32],
        stride: usize,
        offset: usize,
    ) {
        let q: [&[f32]; NQ] = std::array::from_fn(|i| queries[i]);
        let d = q[0].len();
        let full = d / 16 * 16;
        for q in &q {
            assert!(q.len() == d);
        }
        for k in keys {
            assert!(k.len() == d);
        }
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
    pub(super) unsafe fn widen<R: Row>(keys: &[R], d: usize, buf: &mut [f32]) {
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::kv::Row;
    use crate::ops::avx2::hsum;

    /// `NQ` queries against every key, two keys at a time, in 8-float slices: one 8-lane
    /// accumulator per pair (`NQ` a constant so that they stay in registers).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores<R: Row, const NQ: usize>(
        queries: &[&[f32]],
        keys: &[R],
        out: &mut [f32],
    ) {
        let q: [&[f32]; NQ] = std::array::from_fn(|i| queries[i]);
        let d = q[0].len();
        let full = d / 8 * 8;
        for q in &q {
            assert!(q.len() == d);
        }
        for k in keys {
            assert!(k.len() == d);
        }
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

    /// Adds to up to [`super::QUERIES`] outputs (up to [`super::WIDE_QUERIES`] where `wide`)
    /// their queries' weighted sums over their ranges (`(a, b)` with `a > b`: none); weight `j`
    /// of query `i` is `weights[i][j − wfirst]`, key `j`'s value `values[j − vfirst]`. `wide`:
    /// the CPU has AVX-512 F, and whole 64-float slices (32 with more than four queries) and
    /// 16-float ones take its registers.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (and AVX-512 F where `wide`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn accumulate<R: Row>(
        weights: &[&[f32]],
        wfirst: usize,
        ranges: &[(usize, usize)],
        values: &[R],
        vfirst: usize,
        outs: &mut [&mut [f32]],
        wide: bool,
    ) {
        let nq = weights.len();
        let most = if wide {
            super::WIDE_QUERIES
        } else {
            super::QUERIES
        };
        assert!(nq <= most && ranges.len() == nq && outs.len() == nq);
        let live = || ranges.iter().filter(|r| r.0 <= r.1);
        let (Some(lo), Some(hi)) = (live().map(|r| r.0).min(), live().map(|r| r.1).max()) else {
            return;
        };
        let d = outs[0].len();
        let full = d / 8 * 8;
        for (w, &(a, b)) in weights.iter().zip(ranges) {
            assert!(a > b || (a >= wfirst && w.len() > b - wfirst));
        }
        assert!(lo >= vfirst && values.len() > hi - vfirst);
        for j in lo..=hi {
            assert!(values[j - vfirst].len() == d);
        }
        for o in outs.iter() {
            assert!(o.len() == d);
        }
        // Keys every query sums (no range check), between those only some do.
        let common = (
            ranges.iter().map(|r| r.0).max().unwrap_or(0),
            ranges.iter().map(|r| r.1).min().unwrap_or(0),
        );
        let keys = (lo, hi);
        let mut c = 0;
        if wide && nq > super::QUERIES {
            while c + 32 <= full {
                // SAFETY: AVX-512 F (the caller's `wide`); c + 32 ≤ d (asserted above).
                unsafe {
                    slices_for!(
                        super::avx512,
                        2,
                        nq,
                        (
                            weights, wfirst, ranges, values, vfirst, outs, c, keys, common
                        )
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
                        (
                            weights, wfirst, ranges, values, vfirst, outs, c, keys, common
                        )
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
                        (
                            weights, wfirst, ranges, values, vfirst, outs, c, keys, common
                        )
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
                    (
                        weights, wfirst, ranges, values, vfirst, outs, c, keys, common
                    )
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
                    (
                        weights, wfirst, ranges, values, vfirst, outs, c, keys, common
                    )
                )
            };
        }
        for i in 0..nq {
            for (t, o) in outs[i].iter_mut().enumerate().skip(full) {
                for j in ranges[i].0..=ranges[i].1 {
                    *o += weights[i][j - wfirst] * values[j - vfirst].get(t);
                }
            }
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

#[cfg(test)]
#[path = "attend_tests.rs"]
mod tests;
