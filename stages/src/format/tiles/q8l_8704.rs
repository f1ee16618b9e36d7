//! `Q8L_8704`: the 8-bit tile in 16-row lanes, w = d·q (q4nx-format §2, row Q8L_8704; evidence: inferred·ref).
//!
//! bf16 `d` at 0..511 (slot g·32+r), int8 codes at 512 + (r/16)·4096 + c·16 + r%16. No byte tells it from Q8C_8704: decide by data.

use super::lanes::{self, Lanes};

/// Bytes per tile.
pub const BYTES: usize = 8704;
/// Tile geometry and code-plane layout.
pub const LANES: Lanes = Lanes {
    rows: 32,
    cols: 256,
    lane: 16,
    base: 512,
};
const SLOTS: usize = LANES.rows * LANES.groups();
const _: () = assert!(LANES.rows * LANES.cols + LANES.base <= BYTES);

/// Decodes one tile into `out[r·256 + c]`.
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
