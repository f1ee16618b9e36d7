//! AVX2 + FMA kernels on int8 activations. Each 16-row sub-band of a lane band is two registers
//! of accumulators: for 4-bit codes the even rows (low nibbles) and the odd rows (high nibbles) of
//! a column's 8 bytes; for 8-bit codes rows 0–7 and 8–15 of its 16 bytes. Up to three tokens
//! share each unpacked column.
//!
//! 4-bit codes × int8 activations ([`int8_tokens`]): four columns' 32 bytes are one register;
//! a byte shuffle pairs each row's codes of two neighbouring columns, so `maddubs` (u8 × i8,
//! adjacent pairs summed) yields per-row sums of two columns at once, kept in i16 for the 32
//! columns of a group (|sum| ≤ 16·15·127 = 30,480 < 2¹⁵) and widened once per group.

use std::arch::x86_64::*;

use super::layout::Codes;
use super::{Activations, QMatrix};

/// One row block (see `QMatrix::block`).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let eight = matches!(m.layout.codes, Codes::Signed8);
    let mut t0 = 0;
    while t0 < a.n {
        let nt = (a.n - t0).min(3);
        // SAFETY: same CPU contract as this function.
        unsafe {
            match (eight, nt) {
                (true, 1) => s8_tokens::<1>(m, rb, a, t0, out, stride, local),
                (true, 2) => s8_tokens::<2>(m, rb, a, t0, out, stride, local),
                (true, _) => s8_tokens::<3>(m, rb, a, t0, out, stride, local),
                (false, 1) => int8_tokens::<1>(m, rb, a, t0, out, stride, local),
                (false, 2) => int8_tokens::<2>(m, rb, a, t0, out, stride, local),
                (false, _) => int8_tokens::<3>(m, rb, a, t0, out, stride, local),
            }
        }
        t0 += nt;
    }
}

/// 4-bit codes × int8 activations for tokens `t0 .. t0+NT` of one row block.
///
/// # Safety
/// AVX2 and FMA; `m` geometry checked by `QMatrix::new`, `a` built for `m.k_padded()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn int8_tokens<const NT: usize>(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    t0: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let l = &m.layout;
    let (kp, groups, per_tile) = (a.kp, a.kp / 32, l.groups());
    let (p, cols, base) = (l.lane, l.cols, l.base);
    let cstride = p / 2;
    debug_assert_eq!(kp, m.k_padded());
    // Signed nibbles: xor 8 maps q ∈ −8..7 to q + 8 ∈ 0..15; the 8·Σxq is taken back per group.
    let flip = _mm256_set1_epi8(if l.codes == Codes::Signed4 {
        0x88u8 as i8
    } else {
        0
    });
    let low = _mm256_set1_epi8(0x0F);
    // Per 128-bit lane: bytes of column a (0..8) and column b (8..16) interleaved, so byte pair
    // j holds row pair j of both columns.
    let pair = _mm256_setr_epi8(
        0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5,
        13, 6, 14, 7, 15,
    );
    // The four activation codes of columns c..c+4 (one broadcast i32): lane 0 alternates x[c],
    // x[c+1]; lane 1 alternates x[c+2], x[c+3].
    let xsel = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        2, 3,
    );
    for cb in 0..m.ct {
        let tile = m.tile(rb, cb);
        let tp = tile.as_ptr();
        prefetch_ahead(tp, l.bytes);
        for sb in 0..l.rows / 16 {
            let (band, sub) = ((sb * 16) / p, ((sb * 16) % p) / 16);
            let first = base + band * cols * cstride + sub * 8;
            for g in 0..per_tile {
                let gg = cb * per_tile + g;
                let c0 = g * 32;
                debug_assert!(first + (c0 + 31) * cstride + 8 <= tile.len());
                let xs = token_codes::<i8, NT>(&a.q, a.kp, t0, cb * cols + c0);
                let mut even = [_mm256_setzero_si256(); NT];
                let mut odd = [_mm256_setzero_si256(); NT];
                // SAFETY: `first + c0·cstride` is inside the tile (geometry checked at build).
                let mut cp = unsafe { tp.add(first + c0 * cstride) };
                for quad in 0..8 {
                    // SAFETY: columns c0 + 4·quad .. +4 of this sub-band: 8 bytes each at
                    // `cstride` apart, inside the tile (see the debug assertion above).
                    let w = unsafe {
                        if cstride == 8 {
                            _mm256_loadu_si256(cp as *const __m256i)
                        } else {
                            let l8 = |o: usize| _mm_loadl_epi64(cp.add(o) as *const __m128i);
                            let lo = _mm_unpacklo_epi64(l8(0), l8(cstride));
                            let hi = _mm_unpacklo_epi64(l8(2 * cstride), l8(3 * cstride));
                            _mm256_set_m128i(hi, lo)
                        }
                    };
                    let w = _mm256_shuffle_epi8(_mm256_xor_si256(w, flip), pair);
                    let lo = _mm256_and_si256(w, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
                    for t in 0..NT {
                        // SAFETY: 4 of the group's 32 codes at xs[t] + 4·quad.
                        let four = unsafe { (xs[t].add(4 * quad) as *const i32).read_unaligned() };
                        let xv = _mm256_shuffle_epi8(_mm256_set1_epi32(four), xsel);
                        even[t] = _mm256_add_epi16(even[t], _mm256_maddubs_epi16(lo, xv));
                        odd[t] = _mm256_add_epi16(odd[t], _mm256_maddubs_epi16(hi, xv));
                    }
                    // SAFETY: the last increment is not read.
                    cp = unsafe { cp.add(4 * cstride) };
                }
                // SAFETY: the tile holds the scale (and zero-point) plane of every group.
                let (d, z) = unsafe { group_scales(tp, l, g * l.rows + sb * 16) };
                for t in 0..NT {
                    let at_g = (t0 + t) * groups + gg;
                    let back = _mm256_set1_epi32(if l.codes == Codes::Signed4 {
                        a.qsum8[at_g]
                    } else {
                        0
                    });
                    // The two lanes hold the same rows over different columns: widen and add.
                    let widen = |v: __m256i| {
                        _mm256_sub_epi32(
                            _mm256_add_epi32(
                                _mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)),
                                _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)),
                            ),
                            back,
                        )
                    };
                    let v = row_order(
                        _mm256_cvtepi32_ps(widen(even[t])),
                        _mm256_cvtepi32_ps(widen(odd[t])),
                    );
                    let s = _mm256_set1_ps(a.zs[at_g]);
                    let at = (t0 + t) * stride + local + sb * 16;
                    accumulate16(&mut out[at..at + 16], d, a.qd[at_g], v, z, s);
                }
            }
        }
    }
}

/// 8-bit codes × int8 activations for tokens `t0 .. t0+NT` of one row block. Per pair of
/// columns: the two columns' 16 codes of a sub-band interleaved into row pairs, widened to i16,
/// and `madd` with the two activation codes (their i16 copies, `Activations::q16`, which the
/// caller fills with `Activations::widen`, broadcast as one i32 straight from memory) gives each
/// row's sum of both columns in i32 (no saturation: |w·x| ≤ 128·127); rows stay in order, 0–7 and
/// 8–15.
///
/// # Safety
/// AVX2 and FMA; `m` geometry checked by `QMatrix::new`, `a` built for `m.k_padded()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn s8_tokens<const NT: usize>(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    t0: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let l = &m.layout;
    let (kp, groups, per_tile) = (a.kp, a.kp / 32, l.groups());
    let (p, cols, base) = (l.lane, l.cols, l.base);
    debug_assert_eq!(kp, m.k_padded());
    for cb in 0..m.ct {
        let tile = m.tile(rb, cb);
        let tp = tile.as_ptr();
        prefetch_ahead(tp, l.bytes);
        for sb in 0..l.rows / 16 {
            let (band, sub) = ((sb * 16) / p, ((sb * 16) % p) / 16);
            let first = base + band * cols * p + sub * 16;
            for g in 0..per_tile {
                let gg = cb * per_tile + g;
                let c0 = g * 32;
                debug_assert!(first + (c0 + 31) * p + 16 <= tile.len());
                let xs = token_codes::<i16, NT>(&a.q16, a.kp, t0, cb * cols + c0);
                let mut lo = [_mm256_setzero_si256(); NT];
                let mut hi = [_mm256_setzero_si256(); NT];
                // SAFETY: `first + c0·p` is inside the tile (geometry checked at build).
                let mut cp = unsafe { tp.add(first + c0 * p) };
                for pair in 0..16 {
                    // SAFETY: columns c0 + 2·pair and the next: 16 bytes each, `p` apart, inside
                    // the tile (see the debug assertion above).
                    let (w0, w1) = unsafe {
                        let c = _mm_loadu_si128(cp as *const __m128i);
                        let d = _mm_loadu_si128(cp.add(p) as *const __m128i);
                        (
                            _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(c, d)),
                            _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(c, d)),
                        )
                    };
                    for t in 0..NT {
                        // SAFETY: 2 of the group's 32 widened codes at xs[t] + 2·pair.
                        let two = unsafe { (xs[t].add(2 * pair) as *const i32).read_unaligned() };
                        let xv = _mm256_set1_epi32(two);
                        lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(w0, xv));
                        hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(w1, xv));
                    }
                    // SAFETY: the last increment is not read.
                    cp = unsafe { cp.add(2 * p) };
                }
                // SAFETY: the tile holds the scale plane of every group.
                let (d, z) = unsafe { group_scales(tp, l, g * l.rows + sb * 16) };
                for t in 0..NT {
                    let at_g = (t0 + t) * groups + gg;
                    let v = (_mm256_cvtepi32_ps(lo[t]), _mm256_cvtepi32_ps(hi[t]));
                    let at = (t0 + t) * stride + local + sb * 16;
                    accumulate16(
                        &mut out[at..at + 16],
                        d,
                        a.qd[at_g],
                        v,
                        z,
                        _mm256_setzero_ps(),
                    );
                }
            }
        }
    }
}

/// Asks for the tile two tiles on, one cache line at a time: a matrix's tiles are one contiguous
/// run, and the hardware prefetcher alone leaves a streaming decode well short of the read
/// bandwidth (a prefetch never faults, so running past the matrix is harmless).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn prefetch_ahead(tp: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(tp.wrapping_add(2 * bytes + off).cast());
    }
}

/// The bf16 scales and zero-points (zero without a zero-point plane) of rows `slot .. slot+16`
/// of one group as f32, each as rows 0–7 and 8–15.
///
/// # Safety
/// AVX2; `tp` is a tile of layout `l` and `slot + 16 ≤ R·G`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_scales(
    tp: *const u8,
    l: &super::TileLayout,
    slot: usize,
) -> ((__m256, __m256), (__m256, __m256)) {
    // SAFETY: the scale plane holds R·G bf16 values at the tile's start, the zero-point plane
    // as many after it; the caller guarantees slot + 16 ≤ R·G.
    unsafe {
        let d = bf16x16(tp.add(2 * slot));
        let z = if l.zero {
            bf16x16(tp.add(l.zero_base() + 2 * slot))
        } else {
            (_mm256_setzero_ps(), _mm256_setzero_ps())
        };
        (d, z)
    }
}

/// Even rows (0, 2, …, 14) and odd rows (1, 3, …, 15) in row order, as rows 0–7 and 8–15:
/// unpack pairs per 128-bit lane, then join the lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn row_order(even: __m256, odd: __m256) -> (__m256, __m256) {
    let (u0, u1) = (_mm256_unpacklo_ps(even, odd), _mm256_unpackhi_ps(even, odd));
    (
        _mm256_permute2f128_ps(u0, u1, 0x20),
        _mm256_permute2f128_ps(u0, u1, 0x31),
    )
}

/// `out[r] += d[r]·dx·v[r] + z[r]·s` for the 16 rows of `out` (each pair: rows 0–7, 8–15).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn accumulate16(
    out: &mut [f32],
    d: (__m256, __m256),
    dx: f32,
    v: (__m256, __m256),
    z: (__m256, __m256),
    s: __m256,
) {
    assert!(out.len() >= 16, "16 rows");
    let dx = _mm256_set1_ps(dx);
    let add_lo = _mm256_add_ps(
        _mm256_mul_ps(_mm256_mul_ps(d.0, dx), v.0),
        _mm256_mul_ps(z.0, s),
    );
    let add_hi = _mm256_add_ps(
        _mm256_mul_ps(_mm256_mul_ps(d.1, dx), v.1),
        _mm256_mul_ps(z.1, s),
    );
    let op = out.as_mut_ptr();
    // SAFETY: `out` holds at least 16 floats (asserted above).
    unsafe {
        _mm256_storeu_ps(op, _mm256_add_ps(_mm256_loadu_ps(op), add_lo));
        _mm256_storeu_ps(op.add(8), _mm256_add_ps(_mm256_loadu_ps(op.add(8)), add_hi));
    }
}

/// Where the activation codes (`v`: `q` or `q16`, `n × kp`) of tokens `t0 .. t0+NT` start at
/// column `col`.
///
/// # Panics
/// When a token's 32 codes from `col` are not all inside `v`.
#[inline]
pub(super) fn token_codes<T, const NT: usize>(
    v: &[T],
    kp: usize,
    t0: usize,
    col: usize,
) -> [*const T; NT] {
    std::array::from_fn(|t| v[(t0 + t) * kp + col..][..32].as_ptr())
}

/// 16 little-endian bf16 values at `p` as two vectors of f32.
///
/// # Safety
/// AVX2; 32 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16x16(p: *const u8) -> (__m256, __m256) {
    // SAFETY: caller guarantees 32 bytes.
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(p as *const __m128i),
            _mm_loadu_si128(p.add(16) as *const __m128i),
        )
    };
    let widen = |v: __m128i| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    (widen(a), widen(b))
}
