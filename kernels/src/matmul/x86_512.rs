//! AVX-512 VNNI kernels for the 4-bit tile kinds (`Q40_*`, `Q41_*`): `vpdpbusd` multiplies four
//! unsigned weight codes by four signed int8 activations and adds the four products into one i32
//! lane, so one instruction does 64 multiply-adds where the AVX2 path's `maddubs` does 32 and
//! needs a widening add after it.
//!
//! `vpdpbusd` wants each lane's four bytes to be four columns of one row, while a tile stores
//! each column's codes contiguous (q4nx-format §2). One `vpermb` (AVX-512 VBMI) per 64-byte load
//! moves the bytes into that order in a register; the tile in memory is the pack's, unchanged.
//!
//! * Lane bands of 32 rows (`Q40_4608`): a load is 4 columns × 32 rows. Lane `j` gets byte `j` of
//!   each column: its low nibbles are row `2j`, its high nibbles row `2j + 1`, so the group sums
//!   come out as even rows and odd rows; the bf16 scales split the same way with one shift or
//!   one mask, and the rows are put back in order once per row band.
//! * Lane bands of 16 rows (`Q41_1280`, `Q41_2560`, `Q41_5120`, `Q40_5120`): a load is 8 columns
//!   × 16 rows. Two `vpermb` give lane `r` byte `r/2` of columns 0..4 and of columns 4..8; one
//!   masked shift then takes the odd lanes' high nibbles (row `r` is byte `r/2`'s low nibble when
//!   `r` is even, its high nibble when odd), so each lane holds four codes of its own row and the
//!   sums come out in row order with no lane pairs to add per token.
//!
//! Signed nibbles are read as `q + 8` (xor 0x88) and `8·Σx` is taken back per group, as on the
//! AVX2 path. Up to eight tokens share each unpacked load. Tokens of a whole block of 16 read the
//! block-major tile order (`feed.rs`): one base register for all of a pass's tokens, and the
//! load's products in one `asm!` block the compiler cannot spill. A token's sums are integers, and its
//! float steps are the same whatever the batch, so a batch gives bit for bit the single-token
//! results on this path.

use std::arch::x86_64::*;

use super::activations::BlockOrder;
use super::layout::Codes;
use super::{Activations, QMatrix};

mod feed;
use feed::{Feed, dot4x2, dot8};

/// Tokens that share one unpacked load: 8 sums and 8 f32 accumulators in registers, beside the
/// load's unpacked codes. (32-row bands keep two sums and two accumulators per token; they take
/// at most [`TOKENS_32`].)
const TOKENS: usize = 8;

/// Tokens per pass over a 32-row band (even and odd rows: four registers per token).
const TOKENS_32: usize = 4;

/// Whether this path has a kernel for `codes` (the 8-bit kinds stay on AVX2).
pub(super) fn covers(codes: Codes) -> bool {
    matches!(codes, Codes::Signed4 | Codes::Unsigned4)
}

/// One row block of a 4-bit layout (see `QMatrix::block`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI/VBMI, AVX2 and FMA; `m.layout.codes` is 4-bit.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) unsafe fn block(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    // SAFETY: same contract.
    unsafe { block_from(m, rb, a, 0, out, stride, local) }
}

/// [`block`] for tokens `first ..` only.
///
/// # Safety
/// As [`block`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) unsafe fn block_from(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    first: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    debug_assert!(covers(m.layout.codes));
    let wide = m.layout.lane == 32;
    // Tokens of whole blocks of 16 read the tile order where the caller made it.
    let tiled_to = if a.order == Some(BlockOrder::BlockMajor) {
        a.n / 16 * 16
    } else {
        0
    };
    let mut t0 = first;
    while t0 < a.n {
        let most = if wide { TOKENS_32 } else { TOKENS };
        let nt = (a.n - t0).min(most);
        let tiled = nt == most && t0 + nt <= tiled_to && t0 / 16 == (t0 + nt - 1) / 16;
        // One or two tokens: each sum in two registers (two dependency chains of `vpdpbusd`
        // instead of one twice as long); four and more interleave enough chains on their own.
        // Integer sums: the split changes no bit.
        // SAFETY: same CPU and geometry contract as this function.
        unsafe {
            match (wide, nt, tiled) {
                (true, _, true) => lane32::<TOKENS_32, 1, true>(m, rb, a, t0, out, stride, local),
                (false, _, true) => lane16::<TOKENS, 1, true>(m, rb, a, t0, out, stride, local),
                (true, 1, _) => lane32::<1, 2, false>(m, rb, a, t0, out, stride, local),
                (true, 2, _) => lane32::<2, 2, false>(m, rb, a, t0, out, stride, local),
                (true, 3, _) => lane32::<3, 2, false>(m, rb, a, t0, out, stride, local),
                (true, _, _) => lane32::<TOKENS_32, 1, false>(m, rb, a, t0, out, stride, local),
                (false, 1, _) => lane16::<1, 2, false>(m, rb, a, t0, out, stride, local),
                (false, 2, _) => lane16::<2, 2, false>(m, rb, a, t0, out, stride, local),
                (false, 3, _) => lane16::<3, 2, false>(m, rb, a, t0, out, stride, local),
                (false, 4, _) => lane16::<4, 1, false>(m, rb, a, t0, out, stride, local),
                (false, 5, _) => lane16::<5, 1, false>(m, rb, a, t0, out, stride, local),
                (false, 6, _) => lane16::<6, 1, false>(m, rb, a, t0, out, stride, local),
                (false, 7, _) => lane16::<7, 1, false>(m, rb, a, t0, out, stride, local),
                (false, _, _) => lane16::<TOKENS, 1, false>(m, rb, a, t0, out, stride, local),
            }
        }
        t0 += nt;
    }
}

/// `vpermb` index for a load of 4 columns × 16 bytes: lane `j` ← byte `j` of columns 0..4.
const PERM32: [u8; 64] = index_table!(u8, 64, |i| 16 * (i % 4) + i / 4);

/// `vpermb` indices for a load of 8 columns × 8 bytes: lane `r` ← byte `r/2` of columns 0..4
/// (`ROWS16_A`) and of columns 4..8 (`ROWS16_B`).
const ROWS16_A: [u8; 64] = index_table!(u8, 64, |i| 8 * (i % 4) + i / 8);
const ROWS16_B: [u8; 64] = index_table!(u8, 64, |i| 8 * (4 + i % 4) + i / 8);

/// Rows 0–15 and 16–31 of a 32-row band from its even-row and odd-row lanes.
const EVEN_ODD_LO: [i32; 16] = index_table!(i32, 16, |i| i / 2 + 16 * (i % 2));
const EVEN_ODD_HI: [i32; 16] = index_table!(i32, 16, |i| 8 + i / 2 + 16 * (i % 2));

/// How far ahead of its loads a kernel asks for the tiles' next bytes. The tiles of a matrix
/// are one contiguous run, so this reaches into the next tiles; a decode step streams hundreds
/// of megabytes once, and the hardware prefetcher alone left the kernel at about 55 % of the
/// read bandwidth.
const PREFETCH: usize = 4096;

/// Asks for the cache line at `p` (any address: a prefetch never faults).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
fn prefetch(p: *const u8) {
    // PREFETCHT0 reads nothing architecturally and does not fault on any address.
    _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
}

/// Bytes of the scale and zero-point planes in front of the codes.
fn planes(l: &super::TileLayout) -> usize {
    (if l.zero { 4 } else { 2 }) * l.rows * l.groups()
}

/// The xor that reads signed nibbles as `q + 8` (0 for unsigned codes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) fn flip_of(codes: Codes) -> __m512i {
    _mm512_set1_epi8(if codes == Codes::Signed4 {
        0x88u8 as i8
    } else {
        0
    })
}

/// One load's 64 code bytes xor `flip` (signed nibbles read as `q + 8`), reordered by `perm`
/// where given, split into low and high nibbles: how both 4-bit paths (this one and the AMX
/// unpacking) read codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) fn nibbles(w: __m512i, flip: __m512i, perm: Option<__m512i>) -> (__m512i, __m512i) {
    let w = _mm512_xor_si512(w, flip);
    let w = match perm {
        Some(p) => _mm512_permutexvar_epi8(p, w),
        None => w,
    };
    let low = _mm512_set1_epi8(0x0F);
    (
        _mm512_and_si512(w, low),
        _mm512_and_si512(_mm512_srli_epi16(w, 4), low),
    )
}

/// What a group's integer sums become in f32: `acc + d·dx·isum + z·zx` (`isum` with the signed
/// offset already taken back, see [`start_sums`]; `dx`, `zx` the token's scale and zero-point
/// factor of the group).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) fn scale(
    acc: __m512,
    isum: __m512i,
    d: __m512,
    z: Option<__m512>,
    (dx, zx): (f32, f32),
) -> __m512 {
    let acc = _mm512_fmadd_ps(
        _mm512_mul_ps(d, _mm512_set1_ps(dx)),
        _mm512_cvtepi32_ps(isum),
        acc,
    );
    match z {
        Some(z) => _mm512_fmadd_ps(z, _mm512_set1_ps(zx), acc),
        None => acc,
    }
}

/// 16 little-endian bf16 values (the first 32 bytes of `src`) in order as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) fn widen16(src: &[u8]) -> __m512 {
    let src = &src[..32];
    // SAFETY: 32 bytes (sliced above).
    let v = unsafe { _mm256_loadu_si256(src.as_ptr() as *const __m256i) };
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
}

/// `out[..16] += v`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) fn add_to(out: &mut [f32], v: __m512) {
    let out = &mut out[..16];
    let p = out.as_mut_ptr();
    // SAFETY: `out` holds 16 floats (sliced above).
    unsafe { _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), v)) }
}

/// 4-bit codes in lane bands of 32 rows, tokens `t0 .. t0+NT`, each sum in `S` registers (the
/// quads of a group alternate between them).
///
/// # Safety
/// As [`block`]; `m.layout.lane == 32`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn lane32<const NT: usize, const S: usize, const TILED: bool>(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    t0: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let l = &m.layout;
    let (per_tile, cols, rows) = (l.groups(), l.cols, l.rows);
    debug_assert_eq!(a.kp, m.k_padded());
    let feed = Feed::<TILED>::new(a, t0);
    let signed = l.codes == Codes::Signed4;
    let flip = flip_of(l.codes);
    let high_half = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    // SAFETY: the index arrays hold 64 bytes / 16 i32.
    let (perm, lo_idx, hi_idx) = unsafe {
        (
            _mm512_loadu_si512(PERM32.as_ptr() as *const _),
            _mm512_loadu_si512(EVEN_ODD_LO.as_ptr() as *const _),
            _mm512_loadu_si512(EVEN_ODD_HI.as_ptr() as *const _),
        )
    };
    // Even and odd rows of a 32-lane scale plane slice as f32.
    let split = |v: __m512i| {
        (
            _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(v, high_half)),
        )
    };
    for band in 0..rows / 32 {
        let mut even = [_mm512_setzero_ps(); NT];
        let mut odd = [_mm512_setzero_ps(); NT];
        for cb in 0..m.ct {
            let tile = m.tile(rb, cb);
            let codes = l.base + band * cols * 16;
            assert!(codes + cols * 16 <= tile.len() && planes(l) <= l.base);
            let tp = tile.as_ptr();
            for g in 0..per_tile {
                let gg = cb * per_tile + g;
                let xs = feed.codes::<NT>(gg);
                let start = start_sums::<NT, S, TILED>(&feed, gg, signed);
                let (mut lo, mut hi) = (start, start);
                for quad in 0..8 {
                    let (lo, hi) = (&mut lo[quad % S], &mut hi[quad % S]);
                    // SAFETY: columns g·32 + 4·quad .. +4 of this band, 16 bytes each, inside
                    // the code plane (asserted above).
                    let at = codes + (g * 32 + quad * 4) * 16;
                    prefetch(tp.wrapping_add(at + PREFETCH));
                    let w = unsafe { _mm512_loadu_si512(tp.add(at) as *const _) };
                    let (wl, wh) = nibbles(w, flip, Some(perm));
                    if TILED && NT == TOKENS_32 && S == 1 {
                        let lo: &mut [__m512i; TOKENS_32] =
                            (&mut lo[..]).try_into().expect("TOKENS_32 sums");
                        let hi: &mut [__m512i; TOKENS_32] =
                            (&mut hi[..]).try_into().expect("TOKENS_32 sums");
                        // SAFETY: the feed's 4 tokens lie 32 bytes apart from xs[0] (tile
                        // order); 4 of each one's 32 codes at + 4·quad.
                        unsafe { dot4x2(lo, hi, wl, wh, xs[0].add(4 * quad)) };
                        continue;
                    }
                    for t in 0..NT {
                        // SAFETY: 4 of the group's 32 codes at xs[t] + 4·quad.
                        let four = unsafe { (xs[t].add(4 * quad) as *const i32).read_unaligned() };
                        let xv = _mm512_set1_epi32(four);
                        lo[t] = _mm512_dpbusd_epi32(lo[t], wl, xv);
                        hi[t] = _mm512_dpbusd_epi32(hi[t], wh, xv);
                    }
                }
                let slot = 2 * (g * rows + band * 32);
                // SAFETY: the scale (and zero-point) plane holds rows·groups bf16 values; this
                // band's 32 of group g are 64 bytes at `slot`.
                let (d, z) = unsafe {
                    let d = split(_mm512_loadu_si512(tp.add(slot) as *const _));
                    let z = l.zero.then(|| {
                        split(_mm512_loadu_si512(tp.add(l.zero_base() + slot) as *const _))
                    });
                    (d, z)
                };
                for t in 0..NT {
                    let f = feed.factors(t, gg, l.zero);
                    let (l, h) = (sum_of::<NT, S>(&lo, t), sum_of::<NT, S>(&hi, t));
                    even[t] = scale(even[t], l, d.0, z.map(|z| z.0), f);
                    odd[t] = scale(odd[t], h, d.1, z.map(|z| z.1), f);
                }
            }
        }
        for t in 0..NT {
            let at = (t0 + t) * stride + local + band * 32;
            add_to(
                &mut out[at..],
                _mm512_permutex2var_ps(even[t], lo_idx, odd[t]),
            );
            add_to(
                &mut out[at + 16..],
                _mm512_permutex2var_ps(even[t], hi_idx, odd[t]),
            );
        }
    }
}

/// The integer sums of group `gg` for the feed's `NT` tokens before any product: `−8·Σx` in
/// the first register of each token where the codes are signed (read as `q + 8`, so the
/// offset is taken back as the sums start, not by a subtraction per token at the end), zero
/// elsewhere. Integers: the same sums either way.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
fn start_sums<const NT: usize, const S: usize, const TILED: bool>(
    feed: &Feed<'_, TILED>,
    gg: usize,
    signed: bool,
) -> [[__m512i; NT]; S] {
    let mut v = [[_mm512_setzero_si512(); NT]; S];
    if signed {
        for (t, first) in v[0].iter_mut().enumerate() {
            *first = _mm512_set1_epi32(-feed.qsum8(t, gg));
        }
    }
    v
}

/// Token `t`'s sum over its `S` registers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
fn sum_of<const NT: usize, const S: usize>(parts: &[[__m512i; NT]; S], t: usize) -> __m512i {
    let mut v = parts[0][t];
    for p in &parts[1..] {
        v = _mm512_add_epi32(v, p[t]);
    }
    v
}

/// 4-bit codes in lane bands of 16 rows, tokens `t0 .. t0+NT`, each sum in `S` registers (the
/// first four columns of each load go to the first, the last four to the last).
///
/// # Safety
/// As [`block`]; `m.layout.lane == 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn lane16<const NT: usize, const S: usize, const TILED: bool>(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    t0: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let l = &m.layout;
    let (per_tile, cols, rows) = (l.groups(), l.cols, l.rows);
    debug_assert_eq!(a.kp, m.k_padded());
    let feed = Feed::<TILED>::new(a, t0);
    let signed = l.codes == Codes::Signed4;
    let flip = flip_of(l.codes);
    let low = _mm512_set1_epi8(0x0F);
    // SAFETY: the index arrays hold 64 bytes each.
    let (pa, pb) = unsafe {
        (
            _mm512_loadu_si512(ROWS16_A.as_ptr() as *const _),
            _mm512_loadu_si512(ROWS16_B.as_ptr() as *const _),
        )
    };
    // Lane r's four bytes → row r's four codes: odd lanes take the high nibbles.
    let row_codes = |v: __m512i| _mm512_and_si512(_mm512_mask_srli_epi32(v, 0xAAAA, v, 4), low);
    for band in 0..rows / 16 {
        let mut acc = [_mm512_setzero_ps(); NT];
        for cb in 0..m.ct {
            let tile = m.tile(rb, cb);
            let codes = l.base + band * cols * 8;
            assert!(codes + cols * 8 <= tile.len() && planes(l) <= l.base);
            let tp = tile.as_ptr();
            for g in 0..per_tile {
                let gg = cb * per_tile + g;
                let xs = feed.codes::<NT>(gg);
                let mut sums = start_sums::<NT, S, TILED>(&feed, gg, signed);
                for oct in 0..4 {
                    // SAFETY: columns g·32 + 8·oct .. +8 of this band, 8 bytes each, inside the
                    // code plane (asserted above).
                    let at = codes + (g * 32 + oct * 8) * 8;
                    prefetch(tp.wrapping_add(at + PREFETCH));
                    let w = unsafe { _mm512_loadu_si512(tp.add(at) as *const _) };
                    let w = _mm512_xor_si512(w, flip);
                    let wa = row_codes(_mm512_permutexvar_epi8(pa, w));
                    let wb = row_codes(_mm512_permutexvar_epi8(pb, w));
                    if TILED && NT == TOKENS && S == 1 {
                        let sums: &mut [__m512i; TOKENS] =
                            (&mut sums[0][..]).try_into().expect("TOKENS sums");
                        // SAFETY: the feed's 8 tokens lie 32 bytes apart from xs[0] (tile
                        // order); 8 of each one's 32 codes at + 8·oct.
                        unsafe { dot8(sums, wa, wb, xs[0].add(8 * oct)) };
                        continue;
                    }
                    for t in 0..NT {
                        // SAFETY: 8 of the group's 32 codes at xs[t] + 8·oct.
                        let (xa, xb) = unsafe {
                            let p = xs[t].add(8 * oct) as *const i32;
                            (p.read_unaligned(), p.add(1).read_unaligned())
                        };
                        sums[0][t] = _mm512_dpbusd_epi32(sums[0][t], wa, _mm512_set1_epi32(xa));
                        sums[S - 1][t] =
                            _mm512_dpbusd_epi32(sums[S - 1][t], wb, _mm512_set1_epi32(xb));
                    }
                }
                // This band's 16 bf16 scales (zero-points) of group g.
                let slot = 2 * (g * rows + band * 16);
                let d = widen16(&tile[slot..slot + 32]);
                let z = l.zero.then(|| widen16(&tile[l.zero_base() + slot..][..32]));
                for (t, acc) in acc.iter_mut().enumerate() {
                    *acc = scale(
                        *acc,
                        sum_of::<NT, S>(&sums, t),
                        d,
                        z,
                        feed.factors(t, gg, l.zero),
                    );
                }
            }
        }
        for (t, v) in acc.into_iter().enumerate() {
            add_to(&mut out[(t0 + t) * stride + local + band * 16..], v);
        }
    }
}
