//! `Q40_5120`: the signed variant of the 5,120-byte tile, w = d·sext4(q) (q4nx-format §2, row Q40_5120; evidence: golden).
//!
//! q40_51200

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

/// Decodes one tile into `out[r·256 + c]` (the zero-point plane is ignored: it is all zero).
pub fn decode(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    lanes::bf16_plane(tile, 0, &mut d);
    lanes::decode4(tile, LANES, &lanes::SIGNED4, &d, None, out);
}

/// Decodes one tile column-major into `out[c·R + r]` (the fast path; see `lanes::decode4_cols`) (the zero-point plane is ignored: it is all zero).
#[inline(always)]
pub fn decode_cols(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    lanes::bf16_plane(tile, 0, &mut d);
    dispatch::decode4_cols_fast(tile, LANES, dispatch::Nibbles::Signed, &d, None, out);
}
