//! `Q41_5120`: the 32×256 asymmetric 4-bit tile, w = d·q + m, q unsigned (q4nx-format §2, row Q41_5120; evidence: golden).
//!
//! q41_51200

use super::dispatch;
use super::lanes::{self, Lanes};

/// Bytes per tile.
pub const BYTES: usize = 5120;
/// Tile geometry and code-plane layout.
pub const LANES: Lanes = Lanes {
    rows: 32,
    cols: 256,
    lane: 16,
    base: 1024,
};
const SLOTS: usize = LANES.rows * LANES.groups();
const _: () = assert!(LANES.rows * LANES.cols / 2 + LANES.base == BYTES);

/// Decodes one tile into `out[r·256 + c]`.
pub fn decode(tile: &[u8], out: &mut [f32]) {
    let (d, m) = lanes::scale_and_zero_planes::<SLOTS>(tile);
    lanes::decode4(tile, LANES, &lanes::UNSIGNED4, &d, Some(&m), out);
}

/// Decodes one tile column-major into `out[c·R + r]` (the fast path; see `lanes::decode4_cols`).
#[inline(always)]
pub fn decode_cols(tile: &[u8], out: &mut [f32]) {
    let (d, m) = lanes::scale_and_zero_planes::<SLOTS>(tile);
    dispatch::decode4_cols_fast(tile, LANES, dispatch::Nibbles::Unsigned, &d, Some(&m), out);
}
