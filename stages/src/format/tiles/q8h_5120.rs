//! `Q8H_5120`: the public converter's 8-bit tile in a 4-bit slot, w = d·q (q4nx-format §2, row Q8H_5120; evidence: golden).
//!
//! bf16 `d` at 0..255 (slot g·32+r, g < 4); bytes 256..511 are an exact copy of `d` (its signature); int8 codes at 512 + (r/16)·2048 + c·16 + r%16; bytes 4608..5119 are zero.

use super::lanes::{self, Lanes};

/// Bytes per tile.
pub const BYTES: usize = 5120;
/// Tile geometry and code-plane layout.
pub const LANES: Lanes = Lanes {
    rows: 32,
    cols: 128,
    lane: 16,
    base: 512,
};
const SLOTS: usize = LANES.rows * LANES.groups();
const _: () = assert!(LANES.rows * LANES.cols + LANES.base <= BYTES);

/// Decodes one tile into `out[r·128 + c]`.
pub fn decode(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    lanes::bf16_plane(tile, 0, &mut d);
    lanes::decode8(tile, LANES, &d, out);
}

/// Decodes one tile column-major into `out[c·R + r]` (the fast path; see `lanes::decode4_cols`).
#[inline(always)]
pub fn decode_cols(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    lanes::bf16_plane(tile, 0, &mut d);
    lanes::decode8_cols(tile, LANES, &d, out);
}
