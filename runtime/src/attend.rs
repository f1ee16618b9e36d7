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

/// `out[i·keys.len() + j] = q_i·k_j` for up to [`QUERIES`] queries (all of one length `d`), the
/// keys read in the cache's own type.
pub fn scores<R: Row>(queries: &[&[f32]], keys: &[R], out: &mut [f32]) {
    assert!(queries.len() <= QUERIES && out.len() >= queries.len() * keys.len());
    #[cfg(target_arch = "x86_64")]
    if simd() && wide() {
        for (j0, four) in keys.chunks(4).enumerate() {
            let mut block = [[0f32; 4]; QUERIES];
            // SAFETY: `simd()` checked AVX2, FMA and F16C, `wide()` AVX-512 F.
            unsafe { avx512::scores(queries, four, &mut block) };
            for (i, row) in block.iter().enumerate().take(queries.len()) {
                for (jj, &s) in row.iter().enumerate().take(four.len()) {
                    out[i * keys.len() + 4 * j0 + jj] = s;
                }
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        for (j0, pair) in keys.chunks(2).enumerate() {
            let mut block = [[0f32; 2]; QUERIES];
            // SAFETY: `simd()` checked AVX2, FMA and F16C.
            unsafe { avx2::scores(queries, pair, &mut block) };
            for (i, row) in block.iter().enumerate().take(queries.len()) {
                for (jj, &s) in row.iter().enumerate().take(pair.len()) {
                    out[i * keys.len() + 2 * j0 + jj] = s;
                }
            }
        }
        return;
    }
    for (i, q) in queries.iter().enumerate() {
        for (j, k) in keys.iter().enumerate() {
            out[i * keys.len() + j] = dot_portable(q, k);
        }
    }
}

/// `out_i = Σ_{j ∈ range_i} p_i[j − first]·v_j` for up to [`QUERIES`] queries: `values[j −
/// first]` is key `j`'s value vector, `weights[i]` query `i`'s weights from key `first` on, and
/// query `i` sums keys `ranges[i].0 ..= ranges[i].1` (its causal window) in increasing order.
/// Each output is overwritten.
pub fn weighted_sums<R: Row>(
    weights: &[&[f32]],
    ranges: &[(usize, usize)],
    first: usize,
    values: &[R],
    outs: &mut [&mut [f32]],
) {
    assert!(
        weights.len() <= QUERIES && weights.len() == ranges.len() && outs.len() == ranges.len()
    );
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2, FMA and F16C; `wide()` AVX-512 F.
        return unsafe { avx2::weighted_sums(weights, ranges, first, values, outs, wide()) };
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

/// The weighted sums' inner loop for one register width (AVX2's 8 floats, AVX-512's 16): `S`
/// slices of `$w` floats from `c` of every query's sum. Each key's slices are loaded once for all
/// queries and the sums stay in registers over the keys (increasing order, one FMA per key and
/// lane, so the width never changes a number), with range checks only outside the keys
/// `(clo, chi)` common to every query.
#[cfg(target_arch = "x86_64")]
macro_rules! slices_fn {
    ($feat:literal, $w:literal, $v:ty, $zero:ident, $load:ident, $set1:ident, $fma:ident, $store:ident) => {
        /// See `slices_fn!`.
        ///
        /// # Safety
        /// The CPU has the function's features; `c + w·S` ≤ the length of every value of keys
        /// `lo ..= hi` and every output.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn slices<R: Row, const S: usize>(
            weights: &[&[f32]],
            ranges: &[(usize, usize)],
            first: usize,
            values: &[R],
            outs: &mut [&mut [f32]],
            c: usize,
            (lo, hi): (usize, usize),
            (clo, chi): (usize, usize),
        ) {
            let nq = weights.len();
            let mut acc = [[$zero(); S]; QUERIES];
            let mut key = |j: usize, checked: bool| {
                let vr = values[j - first];
                // SAFETY: value j holds c + w·S values (this function's contract).
                let v: [$v; S] = std::array::from_fn(|s| unsafe { vr.$load(c + $w * s) });
                for i in 0..nq {
                    if !checked || (j >= ranges[i].0 && j <= ranges[i].1) {
                        let p = $set1(weights[i][j - first]);
                        for s in 0..S {
                            acc[i][s] = $fma(p, v[s], acc[i][s]);
                        }
                    }
                }
            };
            if clo <= chi {
                for j in lo..clo {
                    key(j, true);
                }
                for j in clo..=chi {
                    key(j, false);
                }
                for j in chi + 1..=hi {
                    key(j, true);
                }
            } else {
                for j in lo..=hi {
                    key(j, true);
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

    use super::QUERIES;
    use crate::kv::Row;

    /// Up to 4 queries × 1 to 4 keys in 16-float slices, one 16-lane accumulator per pair
    /// (sixteen of the 32 registers), reduced by `_mm512_reduce_add_ps`: eight loads feed sixteen
    /// FMAs. A pair's sum runs in another order than the 8-float one, so its last bits may differ
    /// from the AVX2 path's; it is fixed whatever the blocking, so a query still gets the same
    /// bits alone and in a block.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn scores<R: Row>(
        queries: &[&[f32]],
        keys: &[R],
        out: &mut [[f32; 4]; QUERIES],
    ) {
        let d = queries[0].len();
        let full = d / 16 * 16;
        for q in queries {
            assert!(q.len() == d);
        }
        for k in keys {
            assert!(k.len() == d);
        }
        let (nq, nk) = (queries.len(), keys.len());
        // Fewer than four keys: the last one stands in for the missing (its sums are dropped).
        let k: [R; 4] = std::array::from_fn(|j| keys[j.min(nk - 1)]);
        let mut acc = [[_mm512_setzero_ps(); 4]; QUERIES];
        for c in (0..full).step_by(16) {
            // SAFETY: c + 16 ≤ d, the length of every query and key (asserted above); the
            // caller checked AVX-512 F.
            unsafe {
                let kv = [
                    k[0].load16(c),
                    k[1].load16(c),
                    k[2].load16(c),
                    k[3].load16(c),
                ];
                for i in 0..nq {
                    let qv = _mm512_loadu_ps(queries[i].as_ptr().add(c));
                    for j in 0..4 {
                        acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
                    }
                }
            }
        }
        for i in 0..nq {
            for j in 0..nk {
                let mut s = _mm512_reduce_add_ps(acc[i][j]);
                for (t, &q) in queries[i].iter().enumerate().skip(full) {
                    s += q * keys[j].get(t);
                }
                out[i][j] = s;
            }
        }
    }

    slices_fn!(
        "avx512f",
        16,
        __m512,
        _mm512_setzero_ps,
        load16,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps
    );
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::QUERIES;
    use crate::kv::Row;
    use crate::ops::avx2::hsum;

    /// Up to 4 queries × 1 or 2 keys.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores<R: Row>(
        queries: &[&[f32]],
        keys: &[R],
        out: &mut [[f32; 2]; QUERIES],
    ) {
        let d = queries[0].len();
        let full = d / 8 * 8;
        for q in queries {
            assert!(q.len() == d);
        }
        for k in keys {
            assert!(k.len() == d);
        }
        let mut acc = [[_mm256_setzero_ps(); 2]; QUERIES];
        let (nq, nk) = (queries.len(), keys.len());
        let k1 = keys[nk - 1];
        for c in (0..full).step_by(8) {
            // SAFETY: c + 8 ≤ d, the length of every query and key (asserted above).
            unsafe {
                let kv = [keys[0].load8(c), k1.load8(c)];
                for i in 0..nq {
                    let qv = _mm256_loadu_ps(queries[i].as_ptr().add(c));
                    acc[i][0] = _mm256_fmadd_ps(qv, kv[0], acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(qv, kv[1], acc[i][1]);
                }
            }
        }
        for i in 0..nq {
            for j in 0..nk {
                let mut s = hsum(acc[i][j]);
                for (t, &q) in queries[i].iter().enumerate().skip(full) {
                    s += q * keys[j].get(t);
                }
                out[i][j] = s;
            }
        }
    }

    /// See `super::weighted_sums`; `wide`: the CPU has AVX-512 F, and whole 64- and 16-float
    /// slices take its registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weighted_sums<R: Row>(
        weights: &[&[f32]],
        ranges: &[(usize, usize)],
        first: usize,
        values: &[R],
        outs: &mut [&mut [f32]],
        wide: bool,
    ) {
        let nq = weights.len();
        let d = outs[0].len();
        let full = d / 8 * 8;
        let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
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
            ranges.iter().map(|r| r.0).max().unwrap_or(0),
            ranges.iter().map(|r| r.1).min().unwrap_or(0),
        );
        let mut c = 0;
        let (keys, common) = ((lo, hi), common);
        if wide {
            while c + 64 <= full {
                // SAFETY: AVX-512 F (the caller's `wide`); c + 64 ≤ d (asserted above).
                unsafe {
                    super::avx512::slices::<R, 4>(
                        weights, ranges, first, values, outs, c, keys, common,
                    )
                };
                c += 64;
            }
            while c + 16 <= full {
                // SAFETY: as above, c + 16 ≤ d.
                unsafe {
                    super::avx512::slices::<R, 1>(
                        weights, ranges, first, values, outs, c, keys, common,
                    )
                };
                c += 16;
            }
        }
        while c + 16 <= full {
            // SAFETY: c + 16 ≤ d, the length of every value and output (asserted above).
            unsafe { slices::<R, 2>(weights, ranges, first, values, outs, c, (lo, hi), common) };
            c += 16;
        }
        if c < full {
            // SAFETY: c + 8 ≤ d, as above.
            unsafe { slices::<R, 1>(weights, ranges, first, values, outs, c, (lo, hi), common) };
        }
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

    slices_fn!(
        "avx2,fma,f16c",
        8,
        __m256,
        _mm256_setzero_ps,
        load8,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
}

#[cfg(test)]
#[path = "attend_tests.rs"]
mod tests;
