//! AVX2 kernels for the 4-bit column-major decode: the fast twin of `lanes::decode4_cols`, chosen
//! at run time when the CPU has AVX2. Multiply and add stay separate instructions (no FMA), so the
//! output is bit-identical to the portable code; `tiles_from_spec` checks every element.

use std::arch::x86_64::*;

use onebit_pack::tiles::TileLayout;

/// Decodes 4-bit codes column-major (`out[c·R + r]`), unsigned (`d·q + m`) or signed
/// (`d·sext4(q)`).
///
/// # Safety
/// The CPU must support AVX2. Slices must be as `lanes::decode4_cols` requires (its callers check
/// tile and output sizes); the lane height must be a multiple of 16.
#[target_feature(enable = "avx2")]
pub unsafe fn decode4_cols(
    tile: &[u8],
    l: &TileLayout,
    signed: bool,
    d: &[f32],
    m: Option<&[f32]>,
    out: &mut [f32],
) {
    let (rows, cols, p) = (l.rows, l.cols, l.lane);
    let half = p / 2;
    let mask = _mm_set1_epi8(0x0f);
    let eight = _mm_set1_epi8(8);
    assert!(out.len() >= rows * cols && tile.len() >= l.base + rows * cols / 2);
    assert!(d.len() >= rows * l.groups() && m.is_none_or(|m| m.len() >= rows * l.groups()));
    // The scales of a (lane band, 32-column group) are the same for all 32 columns of the group:
    // load them once per group, then stream the columns.
    for band in 0..rows / p {
        let band_base = l.base + band * cols * half;
        let r0 = band * p;
        for g in 0..cols / 32 {
            for k in 0..half / 8 {
                let rr = r0 + 16 * k;
                // SAFETY (all loads/stores below): `g·R + rr + 16 ≤ d.len()` (and `m`), the code
                // byte `at + 8 ≤ tile.len()` and `c·R + rr + 16 ≤ out.len()` by the geometry
                // asserted above.
                unsafe {
                    let dp = d.as_ptr().add(g * rows + rr);
                    let (d0, d1) = (_mm256_loadu_ps(dp), _mm256_loadu_ps(dp.add(8)));
                    let (m0, m1) = match m {
                        Some(m) => {
                            let mp = m.as_ptr().add(g * rows + rr);
                            (_mm256_loadu_ps(mp), _mm256_loadu_ps(mp.add(8)))
                        }
                        None => (_mm256_setzero_ps(), _mm256_setzero_ps()),
                    };
                    for c in g * 32..(g + 1) * 32 {
                        let at = band_base + c * half + 8 * k;
                        let b = _mm_loadl_epi64(tile.as_ptr().add(at) as *const __m128i);
                        let lo = _mm_and_si128(b, mask);
                        let hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
                        let q = _mm_unpacklo_epi8(lo, hi);
                        let (q0, q1) = if signed {
                            let s = _mm_sub_epi8(_mm_xor_si128(q, eight), eight);
                            (
                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)),
                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))),
                            )
                        } else {
                            (
                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)),
                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))),
                            )
                        };
                        let mut o0 = _mm256_mul_ps(d0, q0);
                        let mut o1 = _mm256_mul_ps(d1, q1);
                        if m.is_some() {
                            o0 = _mm256_add_ps(o0, m0);
                            o1 = _mm256_add_ps(o1, m1);
                        }
                        let op = out.as_mut_ptr().add(c * rows + rr);
                        _mm256_storeu_ps(op, o0);
                        _mm256_storeu_ps(op.add(8), o1);
                    }
                }
            }
        }
    }
}
