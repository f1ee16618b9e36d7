//! The lane loops every tile kind is decoded by (q4nx-format §2, "General 4-bit formula"), on the
//! geometry of [`onebit_pack::tiles`]' table. The codec ([`super`]) reads a kind's planes into
//! per-slot `d`/`m` arrays and calls these loops, which write row-major `out[r·C + c]` or, the
//! fast twins, column-major `out[c·R + r]`.

pub use onebit_pack::tiles::bf16_at;
use onebit_pack::tiles::{E2M1, TileLayout};

/// The f32 value of each 4-bit code read as unsigned (`q`).
pub const UNSIGNED4: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
];

/// The f32 value of each 4-bit code read as two's complement (`sext4(q)`).
pub const SIGNED4: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
];

/// Reads `n` consecutive bf16 values starting at byte `at` into `out`.
#[inline]
pub fn bf16_plane(tile: &[u8], at: usize, out: &mut [f32]) {
    let src = &tile[at..at + 2 * out.len()];
    for (o, ch) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f32::from_bits((u16::from_le_bytes([ch[0], ch[1]]) as u32) << 16);
    }
}

/// Decodes 4-bit codes: `out[r·C+c] = d[slot]·lut[q]` (+ `m[slot]` when `m` is given).
///
/// Walks the code plane in storage order (one lane band, one column, `P/2` bytes holding `P` rows),
/// so reads are sequential and each byte is touched once.
pub fn decode4(
    tile: &[u8],
    l: &TileLayout,
    lut: &[f32; 16],
    d: &[f32],
    m: Option<&[f32]>,
    out: &mut [f32],
) {
    let (rows, cols, p) = (l.rows, l.cols, l.lane);
    debug_assert!(out.len() >= rows * cols && d.len() >= rows * l.groups());
    let half = p / 2;
    for band in 0..rows / p {
        let band_base = l.base + band * cols * half;
        for c in 0..cols {
            let g = c / 32;
            let bytes = &tile[band_base + c * half..band_base + (c + 1) * half];
            let r0 = band * p;
            let ds = &d[g * rows + r0..g * rows + r0 + p];
            match m {
                Some(m) => {
                    let ms = &m[g * rows + r0..g * rows + r0 + p];
                    for (j, &b) in bytes.iter().enumerate() {
                        let r = 2 * j;
                        out[(r0 + r) * cols + c] = ds[r] * lut[(b & 15) as usize] + ms[r];
                        out[(r0 + r + 1) * cols + c] =
                            ds[r + 1] * lut[(b >> 4) as usize] + ms[r + 1];
                    }
                }
                None => {
                    for (j, &b) in bytes.iter().enumerate() {
                        let r = 2 * j;
                        out[(r0 + r) * cols + c] = ds[r] * lut[(b & 15) as usize];
                        out[(r0 + r + 1) * cols + c] = ds[r + 1] * lut[(b >> 4) as usize];
                    }
                }
            }
        }
    }
}

/// Decodes 8-bit codes: `out[r·C+c] = d[slot]·(code as i8)`.
pub fn decode8(tile: &[u8], l: &TileLayout, d: &[f32], out: &mut [f32]) {
    let (rows, cols, p) = (l.rows, l.cols, l.lane);
    debug_assert!(out.len() >= rows * cols && d.len() >= rows * l.groups());
    for band in 0..rows / p {
        let band_base = l.base + band * cols * p;
        for c in 0..cols {
            let g = c / 32;
            let bytes = &tile[band_base + c * p..band_base + (c + 1) * p];
            let r0 = band * p;
            let ds = &d[g * rows + r0..g * rows + r0 + p];
            for (j, &b) in bytes.iter().enumerate() {
                out[(r0 + j) * cols + c] = ds[j] * (b as i8) as f32;
            }
        }
    }
}

/// Decodes 4-bit codes column-major: `out[c·R + r] = d[slot]·map(q)` (+ `m[slot]`).
///
/// The fast twin of [`decode4`]. In storage order each column of a lane band holds its `P` rows'
/// codes in `P/2` consecutive bytes, and the `d`/`m` slots of those rows are consecutive too, so
/// writing columns keeps every load and store contiguous and the 16-wide inner loops vectorize.
#[inline(always)]
pub fn decode4_cols(
    tile: &[u8],
    l: &TileLayout,
    map: impl Fn(u8) -> f32,
    d: &[f32],
    m: Option<&[f32]>,
    out: &mut [f32],
) {
    let (rows, cols, p) = (l.rows, l.cols, l.lane);
    let half = p / 2;
    assert!(
        out.len() >= rows * cols && tile.len() >= l.base + rows * cols / 2 && p.is_multiple_of(16)
    );
    for band in 0..rows / p {
        let band_base = l.base + band * cols * half;
        let r0 = band * p;
        for c in 0..cols {
            let g = c / 32;
            let bytes = &tile[band_base + c * half..band_base + (c + 1) * half];
            for (k, chunk) in bytes.chunks_exact(8).enumerate() {
                let rr = r0 + 16 * k;
                let mut qb = [0u8; 16];
                for j in 0..8 {
                    qb[2 * j] = chunk[j] & 15;
                    qb[2 * j + 1] = chunk[j] >> 4;
                }
                let mut q = [0f32; 16];
                for i in 0..16 {
                    q[i] = map(qb[i]);
                }
                let dd = &d[g * rows + rr..g * rows + rr + 16];
                let o = &mut out[c * rows + rr..c * rows + rr + 16];
                match m {
                    Some(m) => {
                        let mm = &m[g * rows + rr..g * rows + rr + 16];
                        for i in 0..16 {
                            o[i] = dd[i] * q[i] + mm[i];
                        }
                    }
                    None => {
                        for i in 0..16 {
                            o[i] = dd[i] * q[i];
                        }
                    }
                }
            }
        }
    }
}

/// Decodes 8-bit codes column-major: `out[c·R + r] = d[slot]·(code as i8)`; the fast twin of
/// [`decode8`].
#[inline(always)]
pub fn decode8_cols(tile: &[u8], l: &TileLayout, d: &[f32], out: &mut [f32]) {
    let (rows, cols, p) = (l.rows, l.cols, l.lane);
    for band in 0..rows / p {
        let band_base = l.base + band * cols * p;
        let r0 = band * p;
        for c in 0..cols {
            let g = c / 32;
            let bytes = &tile[band_base + c * p..band_base + (c + 1) * p];
            let dd = &d[g * rows + r0..g * rows + r0 + p];
            let o = &mut out[c * rows + r0..c * rows + r0 + p];
            for i in 0..p {
                o[i] = dd[i] * (bytes[i] as i8) as f32;
            }
        }
    }
}

/// `q` as unsigned.
#[inline(always)]
pub fn unsigned4(q: u8) -> f32 {
    q as f32
}

/// `sext4(q)`.
#[inline(always)]
pub fn signed4(q: u8) -> f32 {
    (((q << 4) as i8) >> 4) as f32
}

/// FP4 E2M1.
#[inline(always)]
pub fn e2m1(q: u8) -> f32 {
    E2M1[(q & 15) as usize]
}
