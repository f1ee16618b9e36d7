//! The one table of tile kinds (q4nx-format §2). Every fact about a kind's bytes is stated here
//! once, in [`TileKind::layout`]'s table: the import's decoders and encoder (`onebit-stages`) and
//! the host kernels (`onebit-runtime`) all read the same rows.
//!
//! A tile holds `R × C` weights. Codes are stored in bands of `P` rows ("lanes"): for 4-bit codes
//! the byte of `(r, c)` is `base + ((r/P)·C + c)·(P/2) + (r%P)/2`, low nibble for even `r%P`; for
//! 8-bit codes it is `base + ((r/P)·C + c)·P + r%P`. Scales (and zero-points) are per
//! (row, 32-column group), in group-major slots `g·R + r`.
//!
//! Widths the FastFlowLM slice algebra predicts but no reader implements (5,632, 9,216, 9,728
//! bytes) are named refusals ([`Unreadable`]), not a catch-all.

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

/// Every kind, in the table's order, for iteration in tests and benchmarks.
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

/// How a kind's codes map to numbers (the `signedness` column of the tables).
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

/// Where a kind keeps its per-(row, group) scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scales {
    /// A bf16 plane at byte 0, slot `g·R + r`.
    Bf16,
    /// Q4_K-like: u8 scales at byte `slot` and u8 minimums at `256 + slot`, each times a per-row
    /// bf16 super scale (`S` at [`Q4K_S_AT`]) or super minimum (`M` at [`Q4K_M_AT`]).
    Q4kSuper,
    /// One E8M0 exponent byte per slot at byte `slot` (OCP MX).
    E8m0,
}

/// What the plane after a [`Scales::Bf16`] plane holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondPlane {
    /// No second plane: the codes follow.
    None,
    /// bf16 zero-points `m`, read as `w = d·q + m`.
    ZeroPoints,
    /// A zero-point plane the converter writes as zeros; readers ignore it.
    Zeros,
    /// An exact copy of the scale plane (Q8H_5120's signature).
    ScaleCopy,
}

/// One row of the table: everything about a kind's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileLayout {
    /// The kind.
    pub kind: TileKind,
    /// Kind name (`Q41_1280`, …), as the spec, tables and manifests write it.
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
    /// How codes become numbers.
    pub codes: Codes,
    /// Where the scales are.
    pub scales: Scales,
    /// What follows a bf16 scale plane.
    pub second: SecondPlane,
    /// Whether readers add a bf16 zero-point (`second == ZeroPoints`), derived from `second`.
    pub zero: bool,
}

/// Byte offset of Q4K_4736's per-row super scale `S` (bf16).
pub const Q4K_S_AT: usize = 4608;
/// Byte offset of Q4K_4736's per-row (negated) super minimum `M` (bf16).
pub const Q4K_M_AT: usize = 4672;

#[allow(clippy::too_many_arguments)]
const fn row(
    kind: TileKind,
    name: &'static str,
    (rows, cols, lane, base): (usize, usize, usize, usize),
    bytes: usize,
    codes: Codes,
    scales: Scales,
    second: SecondPlane,
) -> TileLayout {
    TileLayout {
        kind,
        name,
        rows,
        cols,
        lane,
        base,
        bytes,
        codes,
        scales,
        second,
        zero: matches!(second, SecondPlane::ZeroPoints),
    }
}

use Codes::*;
use SecondPlane as Z;

/// The table, in [`ALL_KINDS`] order. Geometry is `(R, C, P, base)`; evidence per row is in
/// q4nx-format §2.
#[rustfmt::skip]
const TABLE: [TileLayout; 10] = [
    row(TileKind::Q41_5120,   "Q41_5120",  (32, 256, 16, 1024), 5120, Unsigned4, Scales::Bf16,     Z::ZeroPoints),
    row(TileKind::Q40_5120,   "Q40_5120",  (32, 256, 16, 1024), 5120, Signed4,   Scales::Bf16,     Z::Zeros),
    row(TileKind::Q8H_5120,   "Q8H_5120",  (32, 128, 16, 512),  5120, Signed8,   Scales::Bf16,     Z::ScaleCopy),
    row(TileKind::Q41_1280,   "Q41_1280",  (16, 128, 16, 256),  1280, Unsigned4, Scales::Bf16,     Z::ZeroPoints),
    row(TileKind::Q40_4608,   "Q40_4608",  (32, 256, 32, 512),  4608, Signed4,   Scales::Bf16,     Z::None),
    row(TileKind::Q4K_4736,   "Q4K_4736",  (32, 256, 32, 512),  4736, Unsigned4, Scales::Q4kSuper, Z::None),
    row(TileKind::Q8L_8704,   "Q8L_8704",  (32, 256, 16, 512),  8704, Signed8,   Scales::Bf16,     Z::None),
    row(TileKind::Q8C_8704,   "Q8C_8704",  (32, 256, 32, 512),  8704, Signed8,   Scales::Bf16,     Z::None),
    row(TileKind::Q41_2560,   "Q41_2560",  (32, 128, 16, 512),  2560, Unsigned4, Scales::Bf16,     Z::ZeroPoints),
    row(TileKind::MXFP4_2560, "MXFP4_2560", (32, 128, 16, 512),  2560, Fp4,       Scales::E8m0,     Z::None),
];

// Every row's planes fit its bytes exactly where the spec says they do, checked at compile time.
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        let t = TABLE[i];
        assert!(t.kind as usize == i, "the table follows ALL_KINDS");
        assert!(t.rows.is_multiple_of(t.lane) && t.cols.is_multiple_of(32));
        let codes = match t.codes {
            Signed8 => t.rows * t.cols,
            _ => t.rows * t.cols / 2,
        };
        let tail = match t.scales {
            Scales::Q4kSuper => 4 * t.rows,
            _ => 0,
        };
        // The 8-bit kinds leave room past their codes (Q8H: 512 zero bytes; Q8L/Q8C fill it).
        assert!(t.base + codes + tail <= t.bytes);
        if !matches!(t.codes, Signed8) {
            assert!(t.base + codes + tail == t.bytes);
        }
        i += 1;
    }
    assert!(TABLE[TileKind::Q4K_4736 as usize].base + 4096 == Q4K_S_AT);
    assert!(Q4K_S_AT + 64 == Q4K_M_AT);
};

impl TileKind {
    /// The kind's row of the table.
    #[inline(always)]
    pub const fn layout(self) -> &'static TileLayout {
        &TABLE[self as usize]
    }

    /// The kind named `name` (`Q41_1280`, …), if it is one.
    pub fn from_name(name: &str) -> Option<TileKind> {
        TABLE.iter().find(|l| l.name == name).map(|l| l.kind)
    }

    /// The name used in the spec, tables and messages.
    pub const fn name(self) -> &'static str {
        self.layout().name
    }

    /// Bytes per tile.
    pub const fn bytes(self) -> usize {
        self.layout().bytes
    }

    /// Rows per tile.
    pub const fn rows(self) -> usize {
        self.layout().rows
    }

    /// Columns per tile.
    pub const fn cols(self) -> usize {
        self.layout().cols
    }

    /// How codes become numbers.
    pub const fn codes(self) -> Codes {
        self.layout().codes
    }

    /// Whether the tensor's dtype is `U8` (MXFP4) rather than `I8`.
    pub const fn is_u8(self) -> bool {
        matches!(self.codes(), Fp4)
    }
}

impl fmt::Display for TileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TileLayout {
    /// The layout named `name` when the host kernels run it: every kind with its scales in a bf16
    /// plane (the Q4_K-like and MXFP4 kinds are read by the import only).
    pub fn by_name(name: &str) -> Option<TileLayout> {
        TileKind::from_name(name)
            .map(|k| *k.layout())
            .filter(TileLayout::host_runs)
    }

    /// Every layout the host kernels run, in table order.
    pub fn host_layouts() -> impl Iterator<Item = TileLayout> {
        TABLE.into_iter().filter(TileLayout::host_runs)
    }

    /// Whether the host kernels run this layout (scales in a bf16 plane).
    pub fn host_runs(&self) -> bool {
        self.scales == Scales::Bf16
    }

    /// 32-column groups per tile.
    pub const fn groups(&self) -> usize {
        self.cols / 32
    }

    /// Scale slots per tile (`R · groups`).
    pub const fn slots(&self) -> usize {
        self.rows * self.groups()
    }

    /// The slot of (row, group) in a scale plane.
    #[inline(always)]
    pub const fn slot(&self, r: usize, g: usize) -> usize {
        g * self.rows + r
    }

    /// Byte offset of the plane after the bf16 scales (zero-points, zeros or a copy of the scales).
    pub const fn zero_base(&self) -> usize {
        2 * self.slots()
    }

    /// Byte offset of the 4-bit code of (r, c), and whether it is the high nibble.
    #[inline(always)]
    pub const fn code4_at(&self, r: usize, c: usize) -> (usize, bool) {
        let p = self.lane;
        (
            self.base + ((r / p) * self.cols + c) * (p / 2) + (r % p) / 2,
            (r % p) % 2 == 1,
        )
    }

    /// Byte offset of the 8-bit code of (r, c).
    #[inline(always)]
    pub const fn code8_at(&self, r: usize, c: usize) -> usize {
        let p = self.lane;
        self.base + ((r / p) * self.cols + c) * p + r % p
    }

    /// The bf16 scale of (r, g) (layouts with [`Scales::Bf16`]).
    #[inline]
    pub fn d(&self, tile: &[u8], r: usize, g: usize) -> f32 {
        bf16_at(tile, 2 * self.slot(r, g))
    }

    /// The bf16 zero-point of (r, g), or 0 when the layout has none.
    #[inline]
    pub fn m(&self, tile: &[u8], r: usize, g: usize) -> f32 {
        if self.zero {
            bf16_at(tile, self.zero_base() + 2 * self.slot(r, g))
        } else {
            0.0
        }
    }

    /// The raw code of (r, c): a nibble (0..15) or a byte.
    #[inline]
    pub fn code(&self, tile: &[u8], r: usize, c: usize) -> u8 {
        match self.codes {
            Signed8 => tile[self.code8_at(r, c)],
            Unsigned4 | Signed4 | Fp4 => {
                let (at, high) = self.code4_at(r, c);
                if high { tile[at] >> 4 } else { tile[at] & 0x0F }
            }
        }
    }

    /// The code of (r, c) as a number, before scaling.
    #[inline]
    pub fn q(&self, tile: &[u8], r: usize, c: usize) -> f32 {
        let n = self.code(tile, r, c);
        match self.codes {
            Signed8 => n as i8 as f32,
            Signed4 => (((n << 4) as i8) >> 4) as f32,
            Unsigned4 => n as f32,
            Fp4 => E2M1[n as usize],
        }
    }

    /// The scale of (r, g) and the zero-point when the kind has one, as stored (every scale
    /// kind): for the statistics of scales and zero-points.
    pub fn scale_and_zero(&self, tile: &[u8], r: usize, g: usize) -> (f32, Option<f32>) {
        let slot = self.slot(r, g);
        match self.scales {
            Scales::Bf16 => (self.d(tile, r, g), self.zero.then(|| self.m(tile, r, g))),
            Scales::Q4kSuper => (
                bf16_at(tile, Q4K_S_AT + 2 * r) * tile[slot] as f32,
                Some(bf16_at(tile, Q4K_M_AT + 2 * r) * tile[256 + slot] as f32),
            ),
            Scales::E8m0 => (e8m0(tile[slot]), None),
        }
    }

    /// The weight at (r, c) of one tile: the reference decode, one element at a time, for every
    /// kind. The import's fast decoders and the host kernels are tested against it. A kind with
    /// no zero-point adds `0.0`, so a `−0` product reads `+0` here (the decoders keep `−0`).
    #[inline]
    pub fn w(&self, tile: &[u8], r: usize, c: usize) -> f32 {
        let (d, m) = self.scale_and_zero(tile, r, c / 32);
        d * self.q(tile, r, c) + m.unwrap_or(0.0)
    }
}

/// The value of each 4-bit code read as FP4 E2M1 (bit 3 = sign).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// 2^(e−127) for an E8M0 exponent byte; 0xFF is NaN as in the OCP MX spec.
#[inline]
pub fn e8m0(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        e => f32::from_bits((e as u32) << 23),
    }
}

/// Reads the little-endian bf16 at `b[at..at+2]` as f32.
#[inline(always)]
pub fn bf16_at(b: &[u8], at: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16)
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

/// The candidates a declared width names (seed #2248: the width names the kind): every kind of
/// the table with that many bytes and that dtype, in table order.
pub fn candidates_for_width(width: u64, dtype_is_u8: bool) -> WidthReading {
    let kinds: Vec<TileKind> = ALL_KINDS
        .into_iter()
        .filter(|k| k.bytes() as u64 == width && k.is_u8() == dtype_is_u8)
        .collect();
    if !kinds.is_empty() {
        return WidthReading::Candidates(kinds);
    }
    match width {
        5632 => WidthReading::KnownUnreadable(width, Unreadable::W5632),
        9216 => WidthReading::KnownUnreadable(width, Unreadable::W9216),
        9728 => WidthReading::KnownUnreadable(width, Unreadable::W9728),
        w => WidthReading::NotAKind(w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_its_own_row_and_its_name_reads_back() {
        for k in ALL_KINDS {
            assert_eq!(k.layout().kind, k);
            assert_eq!(TileKind::from_name(k.name()), Some(k));
            assert_eq!(
                serde_json::to_value(k).expect("serialize"),
                serde_json::json!(k.name()),
                "the serialized name is the table's"
            );
        }
        assert_eq!(TileKind::from_name("Q41_9999"), None);
    }

    #[test]
    fn the_host_runs_the_bf16_scale_kinds_only() {
        let host: Vec<&str> = TileLayout::host_layouts().map(|l| l.name).collect();
        assert_eq!(
            host,
            [
                "Q41_5120", "Q40_5120", "Q8H_5120", "Q41_1280", "Q40_4608", "Q8L_8704", "Q8C_8704",
                "Q41_2560"
            ]
        );
        assert!(TileLayout::by_name("Q4K_4736").is_none());
        assert!(TileLayout::by_name("MXFP4_2560").is_none());
        assert!(TileLayout::by_name("BF16").is_none());
    }

    #[test]
    fn formulas_match_the_spec_examples() {
        // q4nx-format §8: Q41_5120 (17, 0) code byte 1024 + 2048 = 3072, high nibble.
        let l = TileKind::Q41_5120.layout();
        assert_eq!(l.code4_at(17, 0), (3072, true));
        assert_eq!(l.code4_at(0, 40), (1344, false));
        // Q40_4608 (5, 77): 512 + 77·16 + 2 = 1746, high nibble.
        assert_eq!(TileKind::Q40_4608.layout().code4_at(5, 77), (1746, true));
        // Q8L (21, 77) = 5845; Q8C (21, 77) = 2997.
        assert_eq!(TileKind::Q8L_8704.layout().code8_at(21, 77), 5845);
        assert_eq!(TileKind::Q8C_8704.layout().code8_at(21, 77), 2997);
        // Q41_2560 (21, 77): 512 + 1024 + 616 + 2 = 2154, high nibble.
        assert_eq!(TileKind::Q41_2560.layout().code4_at(21, 77), (2154, true));
    }

    #[test]
    fn widths_name_their_kinds_and_the_unreadable_ones() {
        use TileKind::*;
        let c = |w, u8| candidates_for_width(w, u8);
        assert_eq!(c(1280, false), WidthReading::Candidates(vec![Q41_1280]));
        assert_eq!(c(2560, false), WidthReading::Candidates(vec![Q41_2560]));
        assert_eq!(c(2560, true), WidthReading::Candidates(vec![MXFP4_2560]));
        assert_eq!(c(4608, false), WidthReading::Candidates(vec![Q40_4608]));
        assert_eq!(c(4736, false), WidthReading::Candidates(vec![Q4K_4736]));
        assert_eq!(
            c(5120, false),
            WidthReading::Candidates(vec![Q41_5120, Q40_5120, Q8H_5120])
        );
        assert_eq!(
            c(8704, false),
            WidthReading::Candidates(vec![Q8L_8704, Q8C_8704])
        );
        assert_eq!(
            c(5632, true),
            WidthReading::KnownUnreadable(5632, Unreadable::W5632)
        );
        assert_eq!(
            c(9216, false),
            WidthReading::KnownUnreadable(9216, Unreadable::W9216)
        );
        assert_eq!(
            c(9728, false),
            WidthReading::KnownUnreadable(9728, Unreadable::W9728)
        );
        assert_eq!(c(5120, true), WidthReading::NotAKind(5120));
        assert_eq!(c(1000, false), WidthReading::NotAKind(1000));
    }
}
