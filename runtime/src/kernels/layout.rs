//! Tile layouts the host kernels read, by kind name (q4nx-format §2). The runtime keeps the NPU
//! tiles byte for byte and computes on them directly: every layout is a grid of `R×C` tiles
//! holding per-(row, 32-column group) bf16 scales, optional bf16 zero-points, and codes in lane
//! bands of `P` rows where each column's `P` codes are contiguous. That column-contiguous order
//! is what SIMD wants for a matrix-vector product (one column's codes times one broadcast
//! activation), so no host re-layout is needed and the pack carries one copy of the weights.

/// How codes become numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// 0..15, w = d·q + m.
    U4,
    /// Two's-complement nibble, w = d·q.
    S4,
    /// int8, w = d·q.
    S8,
}

/// One tile layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileLayout {
    /// Kind name (`Q41_1280`, …).
    pub name: &'static str,
    /// Rows per tile (R).
    pub rows: usize,
    /// Columns per tile (C).
    pub cols: usize,
    /// Rows per lane band (P).
    pub lane: usize,
    /// Byte offset of the code plane.
    pub base: usize,
    /// Bytes per tile.
    pub bytes: usize,
    /// Code kind.
    pub codes: CodeKind,
    /// Whether a zero-point plane follows the scale plane.
    pub zero: bool,
}

#[allow(clippy::too_many_arguments)]
const fn l(
    name: &'static str,
    rows: usize,
    cols: usize,
    lane: usize,
    base: usize,
    bytes: usize,
    codes: CodeKind,
    zero: bool,
) -> TileLayout {
    TileLayout {
        name,
        rows,
        cols,
        lane,
        base,
        bytes,
        codes,
        zero,
    }
}

/// Every layout the host kernels run.
pub const LAYOUTS: [TileLayout; 8] = [
    l("Q41_5120", 32, 256, 16, 1024, 5120, CodeKind::U4, true),
    l("Q40_5120", 32, 256, 16, 1024, 5120, CodeKind::S4, false),
    l("Q41_1280", 16, 128, 16, 256, 1280, CodeKind::U4, true),
    l("Q41_2560", 32, 128, 16, 512, 2560, CodeKind::U4, true),
    l("Q40_4608", 32, 256, 32, 512, 4608, CodeKind::S4, false),
    l("Q8H_5120", 32, 128, 16, 512, 5120, CodeKind::S8, false),
    l("Q8L_8704", 32, 256, 16, 512, 8704, CodeKind::S8, false),
    l("Q8C_8704", 32, 256, 32, 512, 8704, CodeKind::S8, false),
];

impl TileLayout {
    /// The layout named `name`, if the host runs it.
    pub fn by_name(name: &str) -> Option<TileLayout> {
        LAYOUTS.iter().copied().find(|l| l.name == name)
    }

    /// 32-column groups per tile.
    pub const fn groups(&self) -> usize {
        self.cols / 32
    }

    /// Byte offset of the zero-point plane.
    pub const fn zero_base(&self) -> usize {
        2 * self.rows * self.groups()
    }

    /// The bf16 scale of (r, g).
    #[inline]
    pub fn d(&self, tile: &[u8], r: usize, g: usize) -> f32 {
        bf16(tile, 2 * (g * self.rows + r))
    }

    /// The bf16 zero-point of (r, g), or 0.
    #[inline]
    pub fn m(&self, tile: &[u8], r: usize, g: usize) -> f32 {
        if self.zero {
            bf16(tile, self.zero_base() + 2 * (g * self.rows + r))
        } else {
            0.0
        }
    }

    /// The code of (r, c) as a number (before scaling).
    #[inline]
    pub fn q(&self, tile: &[u8], r: usize, c: usize) -> f32 {
        let p = self.lane;
        match self.codes {
            CodeKind::S8 => tile[self.base + ((r / p) * self.cols + c) * p + r % p] as i8 as f32,
            CodeKind::U4 | CodeKind::S4 => {
                let at = self.base + ((r / p) * self.cols + c) * (p / 2) + (r % p) / 2;
                let n = if (r % p) % 2 == 1 {
                    tile[at] >> 4
                } else {
                    tile[at] & 0x0F
                };
                if self.codes == CodeKind::S4 {
                    (((n << 4) as i8) >> 4) as f32
                } else {
                    n as f32
                }
            }
        }
    }

    /// The weight at (r, c) of one tile: the reference decode.
    #[inline]
    pub fn w(&self, tile: &[u8], r: usize, c: usize) -> f32 {
        let g = c / 32;
        self.d(tile, r, g) * self.q(tile, r, c) + self.m(tile, r, g)
    }
}

#[inline]
fn bf16(b: &[u8], at: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16)
}
