//! The x86 register tiles: AVX-512 (f32, and bf16 pairs on AVX-512-BF16) and AVX2.

use std::arch::x86_64::*;

use super::{MR, NB, PairTile, Tile};

/// `row`'s values rounded to bf16 pairs into `out` (`⌈len/2⌉` of them), 32 at a time.
///
/// # Safety
/// On a CPU with AVX-512F and AVX-512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn row_pairs_512(row: &[f32], out: &mut [u32]) {
    assert!(out.len() == row.len().div_ceil(2));
    let full = row.len() / 32;
    for c in 0..full {
        // SAFETY: 32 values from 32·c are inside `row`, 16 pairs from 16·c inside `out`.
        unsafe {
            let lo = _mm512_loadu_ps(row.as_ptr().add(32 * c));
            let hi = _mm512_loadu_ps(row.as_ptr().add(32 * c + 16));
            let bh: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(out.as_mut_ptr().add(16 * c).cast(), bh);
        }
    }
    let rest = &row[32 * full..];
    let mut padded = [0.0f32; 32];
    padded[..rest.len()].copy_from_slice(rest);
    let mut pairs = [0u32; 16];
    // SAFETY: both buffers hold a whole vector.
    unsafe {
        let lo = _mm512_loadu_ps(padded.as_ptr());
        let hi = _mm512_loadu_ps(padded.as_ptr().add(16));
        let bh: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(pairs.as_mut_ptr().cast(), bh);
    }
    let left = out.len() - 16 * full;
    out[16 * full..].copy_from_slice(&pairs[..left]);
}

/// AVX-512-BF16: `MR` rows × up to four 16-lane vectors of outputs, two inputs a step.
///
/// # Safety
/// As [`super::Path::tile`] for `t`'s bounds, on a CPU with AVX-512F and AVX-512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn tile_pairs(t: &PairTile<'_>, panel: &[u32], y: *mut f32, ldy: usize) {
    // SAFETY: the caller's contract; each call gets the tile's own rows and outputs.
    unsafe {
        match (t.rows, t.nc.div_ceil(16)) {
            (6, 4) => rows_pairs::<6, 4>(t, panel, y, ldy),
            (6, 3) => rows_pairs::<6, 3>(t, panel, y, ldy),
            (6, 2) => rows_pairs::<6, 2>(t, panel, y, ldy),
            (6, _) => rows_pairs::<6, 1>(t, panel, y, ldy),
            (r, v) => {
                for i in 0..r {
                    let one = PairTile {
                        x: &t.x[i * t.ldx..],
                        ldx: t.ldx,
                        rows: 1,
                        pairs: t.pairs,
                        nc: t.nc,
                    };
                    let yi = y.add(i * ldy);
                    match v {
                        4 => rows_pairs::<1, 4>(&one, panel, yi, ldy),
                        3 => rows_pairs::<1, 3>(&one, panel, yi, ldy),
                        2 => rows_pairs::<1, 2>(&one, panel, yi, ldy),
                        _ => rows_pairs::<1, 1>(&one, panel, yi, ldy),
                    }
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows_pairs<const R: usize, const V: usize>(
    t: &PairTile<'_>,
    panel: &[u32],
    y: *mut f32,
    ldy: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    let x = t.x.as_ptr();
    let p = panel.as_ptr();
    for k in 0..t.pairs {
        // SAFETY: k < pairs ≤ KB/2, so the panel row is inside `panel`; x rows checked by
        // the caller's assert.
        unsafe {
            let mut w: [__m512bh; V] = std::mem::zeroed();
            for (v, wv) in w.iter_mut().enumerate() {
                *wv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    p.add(k * NB + 16 * v).cast(),
                ));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let xv: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*x.add(i * t.ldx + k) as i32));
                for (a, wv) in row.iter_mut().zip(&w) {
                    *a = _mm512_dpbf16_ps(*a, xv, *wv);
                }
            }
        }
    }
    // SAFETY: the caller's contract on `y`.
    unsafe { store_rows(&acc, t.nc, y, ldy) };
}

/// Adds the accumulators into `y`'s rows, columns masked to `nc`.
///
/// # Safety
/// `y` valid for `R` rows of `nc` values at stride `ldy`; AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn store_rows<const R: usize, const V: usize>(
    acc: &[[__m512; V]; R],
    nc: usize,
    y: *mut f32,
    ldy: usize,
) {
    for (i, row) in acc.iter().enumerate() {
        for (v, a) in row.iter().enumerate() {
            let c = 16 * v;
            if c >= nc {
                break;
            }
            let left = nc - c;
            let mask: __mmask16 = if left >= 16 { 0xffff } else { (1 << left) - 1 };
            // SAFETY: columns c.. c+16 masked to the tile's `nc`, rows < R = the tile's.
            unsafe {
                let at = y.add(i * ldy + c);
                let old = _mm512_maskz_loadu_ps(mask, at);
                _mm512_mask_storeu_ps(at, mask, _mm512_add_ps(old, *a));
            }
        }
    }
}

/// AVX-512: `MR` rows × up to four 16-lane vectors of outputs in registers.
///
/// # Safety
/// As [`super::Path::tile`], on a CPU with AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn tile_512(t: &Tile<'_>, panel: &[f32], y: *mut f32, ldy: usize) {
    // SAFETY: the caller's contract; each call gets the tile's own rows and outputs.
    unsafe {
        match (t.rows, t.nc.div_ceil(16)) {
            (6, 4) => rows_512::<6, 4>(t, panel, y, ldy),
            (6, 3) => rows_512::<6, 3>(t, panel, y, ldy),
            (6, 2) => rows_512::<6, 2>(t, panel, y, ldy),
            (6, _) => rows_512::<6, 1>(t, panel, y, ldy),
            (r, v) => {
                // Fewer rows than a tile: one row at a time (the last tile of a block).
                for i in 0..r {
                    let one = Tile {
                        x: &t.x[i * t.ldx..],
                        ldx: t.ldx,
                        rows: 1,
                        kc: t.kc,
                        nc: t.nc,
                    };
                    let yi = y.add(i * ldy);
                    match v {
                        4 => rows_512::<1, 4>(&one, panel, yi, ldy),
                        3 => rows_512::<1, 3>(&one, panel, yi, ldy),
                        2 => rows_512::<1, 2>(&one, panel, yi, ldy),
                        _ => rows_512::<1, 1>(&one, panel, yi, ldy),
                    }
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn rows_512<const R: usize, const V: usize>(
    t: &Tile<'_>,
    panel: &[f32],
    y: *mut f32,
    ldy: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    let x = t.x.as_ptr();
    let p = panel.as_ptr();
    for k in 0..t.kc {
        // SAFETY: k < kc ≤ KB, so the panel row is inside `panel`; x rows checked by the
        // caller's assert.
        unsafe {
            let mut w = [_mm512_setzero_ps(); V];
            for (v, wv) in w.iter_mut().enumerate() {
                *wv = _mm512_loadu_ps(p.add(k * NB + 16 * v));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*x.add(i * t.ldx + k));
                for (a, wv) in row.iter_mut().zip(&w) {
                    *a = _mm512_fmadd_ps(xv, *wv, *a);
                }
            }
        }
    }
    // SAFETY: the caller's contract on `y`.
    unsafe { store_rows(&acc, t.nc, y, ldy) };
}

/// AVX2 + FMA: the panel in passes of 16 outputs, `MR` rows × two 8-lane vectors each.
///
/// # Safety
/// As [`super::Path::tile`], on a CPU with AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn tile_avx2(t: &Tile<'_>, panel: &[f32], y: *mut f32, ldy: usize) {
    let x = t.x.as_ptr();
    let p = panel.as_ptr();
    for c in (0..t.nc).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for k in 0..t.kc {
            // SAFETY: as in `rows_512`; the panel is NB = 64 wide, c + 16 ≤ 64.
            unsafe {
                let w0 = _mm256_loadu_ps(p.add(k * NB + c));
                let w1 = _mm256_loadu_ps(p.add(k * NB + c + 8));
                for (i, row) in acc.iter_mut().enumerate().take(t.rows) {
                    let xv = _mm256_set1_ps(*x.add(i * t.ldx + k));
                    row[0] = _mm256_fmadd_ps(xv, w0, row[0]);
                    row[1] = _mm256_fmadd_ps(xv, w1, row[1]);
                }
            }
        }
        for (i, row) in acc.iter().enumerate().take(t.rows) {
            let mut lanes = [0.0f32; 16];
            // SAFETY: `lanes` holds 16 values.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), row[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), row[1]);
            }
            for (j, v) in lanes.iter().enumerate().take(t.nc - c) {
                // SAFETY: column c + j < nc, row i < rows.
                unsafe { *y.add(i * ldy + c + j) += v };
            }
        }
    }
}
