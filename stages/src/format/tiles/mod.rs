//! Tile codecs for every kind of q4nx-format §2. Each kind has its own module, named as the spec
//! names it; this module holds [`TileKind`] and the only dispatching `match`.
//!
//! Widths the FastFlowLM slice algebra predicts but no reader implements (5,632, 9,216, 9,728 bytes)
//! are named refusals ([`Unreadable`]), not a catch-all.

#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod dispatch;
pub mod lanes;
pub mod mxfp4_2560;
pub mod q40_4608;
pub mod q40_5120;
pub mod q41_1280;
pub mod q41_2560;
pub mod q41_5120;
pub mod q4k_4736;
pub mod q8c_8704;
pub mod q8h_5120;
pub mod q8l_8704;

use std::fmt;

use serde::{Deserialize, Serialize};

/// Every tile kind a reader exists for.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TileKind {
    /// 5,120-byte asymmetric 4-bit (GGUF Q4_1).
    Q41_5120,
    /// 5,120-byte signed 4-bit (GGUF Q4_0), all-zero zero-point plane.
    Q40_5120,
    /// 5,120-byte 8-bit tile of the public converter (duplicate scale plane).
    Q8H_5120,
    /// 1,280-byte quarter tile (16 × 128).
    Q41_1280,
    /// 4,608-byte symmetric 4-bit, column-ordered codes.
    Q40_4608,
    /// 4,736-byte Q4_K-like tile.
    Q4K_4736,
    /// 8,704-byte 8-bit tile, 16-row lanes.
    Q8L_8704,
    /// 8,704-byte 8-bit tile, column order.
    Q8C_8704,
    /// 2,560-byte asymmetric 4-bit (gpt-oss attention, lm_head).
    Q41_2560,
    /// 2,560-byte MXFP4 (gpt-oss experts, U8).
    MXFP4_2560,
}

/// Every kind, for iteration in tests and benchmarks.
pub const ALL_KINDS: [TileKind; 10] = [
    TileKind::Q41_5120,
    TileKind::Q40_5120,
    TileKind::Q8H_5120,
    TileKind::Q41_1280,
    TileKind::Q40_4608,
    TileKind::Q4K_4736,
    TileKind::Q8L_8704,
    TileKind::Q8C_8704,
    TileKind::Q41_2560,
    TileKind::MXFP4_2560,
];

/// How a kind's codes map to numbers, for the `signedness` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codes {
    /// Unsigned 4-bit with a zero-point: `d·q + m`.
    Unsigned4,
    /// Two's-complement 4-bit: `d·sext4(q)`.
    Signed4,
    /// int8: `d·q`.
    Signed8,
    /// FP4 E2M1 with an E8M0 block exponent.
    Fp4,
}

impl TileKind {
    /// The name used in the spec, tables and messages.
    pub fn name(self) -> &'static str {
        match self {
            TileKind::Q41_5120 => "Q41_5120",
            TileKind::Q40_5120 => "Q40_5120",
            TileKind::Q8H_5120 => "Q8H_5120",
            TileKind::Q41_1280 => "Q41_1280",
            TileKind::Q40_4608 => "Q40_4608",
            TileKind::Q4K_4736 => "Q4K_4736",
            TileKind::Q8L_8704 => "Q8L_8704",
            TileKind::Q8C_8704 => "Q8C_8704",
            TileKind::Q41_2560 => "Q41_2560",
            TileKind::MXFP4_2560 => "MXFP4_2560",
        }
    }

    /// The lane geometry (rows, cols, lane height, code base).
    pub fn lanes(self) -> lanes::Lanes {
        match self {
            TileKind::Q41_5120 => q41_5120::LANES,
            TileKind::Q40_5120 => q40_5120::LANES,
            TileKind::Q8H_5120 => q8h_5120::LANES,
            TileKind::Q41_1280 => q41_1280::LANES,
            TileKind::Q40_4608 => q40_4608::LANES,
            TileKind::Q4K_4736 => q4k_4736::LANES,
            TileKind::Q8L_8704 => q8l_8704::LANES,
            TileKind::Q8C_8704 => q8c_8704::LANES,
            TileKind::Q41_2560 => q41_2560::LANES,
            TileKind::MXFP4_2560 => mxfp4_2560::LANES,
        }
    }

    /// Bytes per tile.
    pub fn bytes(self) -> usize {
        match self {
            TileKind::Q41_5120 | TileKind::Q40_5120 | TileKind::Q8H_5120 => 5120,
            TileKind::Q41_1280 => q41_1280::BYTES,
            TileKind::Q40_4608 => q40_4608::BYTES,
            TileKind::Q4K_4736 => q4k_4736::BYTES,
            TileKind::Q8L_8704 | TileKind::Q8C_8704 => 8704,
            TileKind::Q41_2560 | TileKind::MXFP4_2560 => 2560,
        }
    }

    /// Rows per tile.
    pub fn rows(self) -> usize {
        self.lanes().rows
    }

    /// Columns per tile.
    pub fn cols(self) -> usize {
        self.lanes().cols
    }

    /// How codes become numbers.
    pub fn codes(self) -> Codes {
        match self {
            TileKind::Q41_5120 | TileKind::Q41_1280 | TileKind::Q4K_4736 | TileKind::Q41_2560 => {
                Codes::Unsigned4
            }
            TileKind::Q40_5120 | TileKind::Q40_4608 => Codes::Signed4,
            TileKind::Q8H_5120 | TileKind::Q8L_8704 | TileKind::Q8C_8704 => Codes::Signed8,
            TileKind::MXFP4_2560 => Codes::Fp4,
        }
    }

    /// Whether the tensor's dtype is `U8` (MXFP4) rather than `I8`.
    pub fn is_u8(self) -> bool {
        self == TileKind::MXFP4_2560
    }

    /// Decodes one tile into `out[r·C + c]` (`out.len() ≥ R·C`). `tile.len()` must be
    /// [`TileKind::bytes`]; the caller slices the tensor, so this never reads out of bounds.
    pub fn decode(self, tile: &[u8], out: &mut [f32]) {
        assert_eq!(tile.len(), self.bytes(), "tile slice of the wrong size");
        assert!(
            out.len() >= self.rows() * self.cols(),
            "output buffer too small"
        );
        match self {
            TileKind::Q41_5120 => q41_5120::decode(tile, out),
            TileKind::Q40_5120 => q40_5120::decode(tile, out),
            TileKind::Q8H_5120 => q8h_5120::decode(tile, out),
            TileKind::Q41_1280 => q41_1280::decode(tile, out),
            TileKind::Q40_4608 => q40_4608::decode(tile, out),
            TileKind::Q4K_4736 => q4k_4736::decode(tile, out),
            TileKind::Q8L_8704 => q8l_8704::decode(tile, out),
            TileKind::Q8C_8704 => q8c_8704::decode(tile, out),
            TileKind::Q41_2560 => q41_2560::decode(tile, out),
            TileKind::MXFP4_2560 => mxfp4_2560::decode(tile, out),
        }
    }

    /// Decodes one tile column-major into `out[c·R + r]`: the fast path, for consumers that
    /// do not need row order (statistics, verification sums). Equal, element for element, to
    /// [`TileKind::decode`] transposed.
    pub fn decode_cols(self, tile: &[u8], out: &mut [f32]) {
        assert_eq!(tile.len(), self.bytes(), "tile slice of the wrong size");
        assert!(
            out.len() >= self.rows() * self.cols(),
            "output buffer too small"
        );
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { self.decode_cols_avx2(tile, out) };
            return;
        }
        self.decode_cols_portable(tile, out);
    }

    /// [`TileKind::decode_cols`] compiled for AVX2: the same code, vectorized 8 lanes wide. No
    /// FMA contraction happens (Rust never fuses), so results are bit-identical to the portable
    /// build.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn decode_cols_avx2(self, tile: &[u8], out: &mut [f32]) {
        self.decode_cols_portable(tile, out);
    }

    #[inline(always)]
    fn decode_cols_portable(self, tile: &[u8], out: &mut [f32]) {
        match self {
            TileKind::Q41_5120 => q41_5120::decode_cols(tile, out),
            TileKind::Q40_5120 => q40_5120::decode_cols(tile, out),
            TileKind::Q8H_5120 => q8h_5120::decode_cols(tile, out),
            TileKind::Q41_1280 => q41_1280::decode_cols(tile, out),
            TileKind::Q40_4608 => q40_4608::decode_cols(tile, out),
            TileKind::Q4K_4736 => q4k_4736::decode_cols(tile, out),
            TileKind::Q8L_8704 => q8l_8704::decode_cols(tile, out),
            TileKind::Q8C_8704 => q8c_8704::decode_cols(tile, out),
            TileKind::Q41_2560 => q41_2560::decode_cols(tile, out),
            TileKind::MXFP4_2560 => mxfp4_2560::decode_cols(tile, out),
        }
    }

    /// The scale (`d`) of (row, group) as stored, and the zero-point (`m`) when the kind has one;
    /// for the statistics of scales and zero-points.
    pub fn scale_and_zero(self, tile: &[u8], r: usize, g: usize) -> (f32, Option<f32>) {
        let l = self.lanes();
        let slot = l.slot(r, g);
        match self {
            TileKind::Q41_5120 | TileKind::Q41_1280 | TileKind::Q41_2560 => (
                lanes::bf16_at(tile, 2 * slot),
                Some(lanes::bf16_at(tile, 2 * (l.rows * l.groups() + slot))),
            ),
            TileKind::Q40_5120
            | TileKind::Q40_4608
            | TileKind::Q8H_5120
            | TileKind::Q8L_8704
            | TileKind::Q8C_8704 => (lanes::bf16_at(tile, 2 * slot), None),
            TileKind::Q4K_4736 => (
                lanes::bf16_at(tile, q4k_4736::S_AT + 2 * r) * tile[slot] as f32,
                Some(lanes::bf16_at(tile, q4k_4736::M_AT + 2 * r) * tile[256 + slot] as f32),
            ),
            TileKind::MXFP4_2560 => (mxfp4_2560::e8m0(tile[slot]), None),
        }
    }
}

impl fmt::Display for TileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Widths the FastFlowLM slice algebra predicts and no reader implements (q4nx-format §2 notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// 4-bit codes + scales + zero-point + bias.
    W5632,
    /// 8-bit codes + scales + zero-point.
    W9216,
    /// 8-bit codes + scales + zero-point + bias.
    W9728,
}

impl Unreadable {
    /// What the slice algebra says the width holds.
    pub fn describe(self) -> &'static str {
        match self {
            Unreadable::W5632 => "4-bit + zero-point + bias",
            Unreadable::W9216 => "8-bit + zero-point",
            Unreadable::W9728 => "8-bit + zero-point + bias",
        }
    }
}

/// What a declared row width (the last dimension) names, for a tensor of `dtype`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WidthReading {
    /// These kinds fit the width and dtype; the detector narrows them down.
    Candidates(Vec<TileKind>),
    /// A known FastFlowLM size with no reader.
    KnownUnreadable(u64, Unreadable),
    /// Not a tile width at all.
    NotAKind(u64),
}

/// The candidates a declared width names (seed #2248: the width names the kind).
pub fn candidates_for_width(width: u64, dtype_is_u8: bool) -> WidthReading {
    use TileKind::*;
    let c = |v: Vec<TileKind>| WidthReading::Candidates(v);
    match (width, dtype_is_u8) {
        (1280, false) => c(vec![Q41_1280]),
        (2560, false) => c(vec![Q41_2560]),
        (2560, true) => c(vec![MXFP4_2560]),
        (4608, false) => c(vec![Q40_4608]),
        (4736, false) => c(vec![Q4K_4736]),
        (5120, false) => c(vec![Q41_5120, Q40_5120, Q8H_5120]),
        (8704, false) => c(vec![Q8L_8704, Q8C_8704]),
        (5632, _) => WidthReading::KnownUnreadable(width, Unreadable::W5632),
        (9216, _) => WidthReading::KnownUnreadable(width, Unreadable::W9216),
        (9728, _) => WidthReading::KnownUnreadable(width, Unreadable::W9728),
        (w, _) => WidthReading::NotAKind(w),
    }
}
