//! The two lane layouts every tile kind is built from (q4nx-format §2, "General 4-bit formula").
//!
//! A tile holds `R × C` weights. Codes are stored in bands of `P` rows ("lanes"): for 4-bit codes
//! the byte of `(r, c)` is `base + ((r/P)·C + c)·(P/2) + (r%P)/2`, low nibble for even `r%P`; for
//! 8-bit codes it is `base + ((r/P)·C + c)·P + r%P`. Scales (and zero-points) are per
//! (row, 32-column group), in group-major slots `g·R + r`. The kind modules decode their planes into
//! per-slot `d`/`m` arrays and call these loops, which write row-major `out[r·C + c]`.

/// The f32 value of each 4-bit code read as unsigned (`q`).
pub const UNSIGNED4: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
];

/// The f32 value of each 4-bit code read as two's complement (`sext4(q)`).
pub const SIGNED4: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
];

/// The value of each 4-bit code read as FP4 E2M1 (bit 3 = sign).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Geometry of one lane layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes {
    /// Rows per tile.
    pub rows: usize,
    /// Columns per tile.
    pub cols: usize,
    /// Rows per lane band.
    pub lane: usize,
    /// Byte offset of the code plane in the tile.
    pub base: usize,
}

impl Lanes {
    /// Number of 32-column groups.
    pub const fn groups(&self) -> usize {
        self.cols / 32
    }

    /// The slot of (row, group) in a scale plane.
    #[inline]
    pub const fn slot(&self, r: usize, g: usize) -> usize {
        g * self.rows + r
    }

    /// Byte offset of the 4-bit code of (r, c), and whether it is the high nibble.
    #[inline]
    pub const fn code4_at(&self, r: usize, c: usize) -> (usize, bool) {
        let p = self.lane;
        (
            self.base + ((r / p) * self.cols + c) * (p / 2) + (r % p) / 2,
            (r % p) % 2 == 1,
        )
    }

    /// Byte offset of the 8-bit code of (r, c).
    #[inline]
    pub const fn code8_at(&self, r: usize, c: usize) -> usize {
        let p = self.lane;
        self.base + ((r / p) * self.cols + c) * p + r % p
    }
}

/// Reads the bf16 at `tile[at..at+2]` as f32.
#[inline]
pub fn bf16_at(tile: &[u8], at: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([tile[at], tile[at + 1]]) as u32) << 16)
}

/// Reads `n` consecutive bf16 values starting at byte `at` into `out`.
#[inline]
pub fn bf16_plane(tile: &[u8], at: usize, out: &mut [f32]) {
    let src = &tile[at..at + 2 * out.len()];
    for (o, ch) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f32::from_bits((u16::from_le_bytes([ch[0], ch[1]]) as u32) << 16);
    }
}

/// The bf16 scale plane (`d`, slots `0..N`) and zero-point plane (`m`, the next `N` slots) of an
/// asymmetric 4-bit tile, as f32.
#[inline(always)]
pub fn scale_and_zero_planes<const N: usize>(tile: &[u8]) -> ([f32; N], [f32; N]) {
    let mut d = [0f32; N];
    let mut m = [0f32; N];
    bf16_plane(tile, 0, &mut d);
    bf16_plane(tile, 2 * N, &mut m);
    (d, m)
}

/// Decodes 4-bit codes: `out[r·C+c] = d[slot]·lut[q]` (+ `m[slot]` when `m` is given).
///
/// Walks the code plane in storage order (one lane band, one column, `P/2` bytes holding `P` rows),
/// so reads are sequential and each byte is touched once.
pub fn decode4(
    tile: &[u8],
    l: Lanes,
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
pub fn decode8(tile: &[u8], l: Lanes, d: &[f32], out: &mut [f32]) {
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
    l: Lanes,
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
pub fn decode8_cols(tile: &[u8], l: Lanes, d: &[f32], out: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_match_the_spec_examples() {
        // q4nx-format §8: Q41_5120 (17, 0) code byte 1024 + 2048 = 3072, high nibble.
        let l = Lanes {
            rows: 32,
            cols: 256,
            lane: 16,
            base: 1024,
        };
        assert_eq!(l.code4_at(17, 0), (3072, true));
        assert_eq!(l.code4_at(0, 40), (1344, false));
        // Q40_4608 (5, 77): 512 + 77·16 + 2 = 1746, high nibble.
        let s = Lanes {
            rows: 32,
            cols: 256,
            lane: 32,
            base: 512,
        };
        assert_eq!(s.code4_at(5, 77), (1746, true));
        // Q8L (21, 77) = 5845; Q8C (21, 77) = 2997.
        let q8l = Lanes {
            rows: 32,
            cols: 256,
            lane: 16,
            base: 512,
        };
        let q8c = Lanes {
            rows: 32,
            cols: 256,
            lane: 32,
            base: 512,
        };
        assert_eq!(q8l.code8_at(21, 77), 5845);
        assert_eq!(q8c.code8_at(21, 77), 2997);
        // Q41_2560 (21, 77): 512 + 1024 + 616 + 2 = 2154, high nibble.
        let q2560 = Lanes {
            rows: 32,
            cols: 128,
            lane: 16,
            base: 512,
        };
        assert_eq!(q2560.code4_at(21, 77), (2154, true));
    }
}
