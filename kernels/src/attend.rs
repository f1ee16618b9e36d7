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

/// Values of a key block of the AVX-512 weighted sums: 64 keys of 128 (16 KiB of an f16 cache)
/// stay in L1 while every query block of the task sums them, where a pass over all keys per
/// query block read them from L2 or beyond each time.
const VALUE_BLOCK_FLOATS: usize = 8192;

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
        // Widening pays even for one query block (a decode step's heads): the kernel then runs
        // without conversions beside its FMAs. Hunyuan shape, decode at depth 4,096, 2 threads,
        // alternated: 13.2–13.3 tok/s widened against 12.3–12.6 reading f16.
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
/// AVX-512 path), each block reading the values in their own type. (Widening them to f32 a block
/// of keys at a time, as the scores do, measured slower: `benches/attend.rs`, 66–68 against
/// 88–97 GFLOP/s at one thread; the conversions overlap the FMAs, the separate widening pass
/// does not.)
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
        let per = if wide() { WIDE_QUERIES } else { QUERIES };
        for o in outs.iter_mut() {
            o.fill(0.0);
        }
        let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        // Keys a block at a time, every query block over each: the block's values stay in L1
        // while all the task's queries read them.
        let d = outs[0].len().max(1);
        let span = (VALUE_BLOCK_FLOATS / d).max(1);
        let span = if wide() { span } else { usize::MAX };
        let mut b0 = lo;
        while b0 <= hi {
            let b1 = b0.saturating_add(span - 1).min(hi);
            for ((w, r), o) in weights
                .chunks(per)
                .zip(ranges.chunks(per))
                .zip(outs.chunks_mut(per))
            {
                // SAFETY: `simd()` checked AVX2, FMA and F16C; `wide()` AVX-512 F.
                unsafe { avx2::weighted_sums(w, r, first, values, o, wide(), (b0, b1)) };
            }
            b0 = b1 + 1;
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

/// Whether the weighted sums take 16-float slices (AVX-512 F); each output element's arithmetic
/// is the same either way, so are the numbers.
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    crate::matmul::path::avx512_floats()
}

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
use x86::{avx2, avx512};

#[cfg(test)]
#[path = "attend_tests.rs"]
mod tests;
