//! `Q40_4608`: the 32×256 symmetric tile, w = d·sext4(q) (q4nx-format §2, row Q40_4608; evidence: seed #2218).
//!
//! q40_46080

use super::dispatch;
use super::lanes::{self, Lanes};

/// Bytes per tile.
pub const BYTES: usize = 4608;
/// Tile geometry and code-plane layout.
pub const LANES: Lanes = Lanes {
    rows: 32,
    cols: 256,
    lane: 32,
    base: 512,
};
const SLOTS: usize = LANES.rows * LANES.groups();
const _: () = assert!(LANES.rows * LANES.cols / 2 + LANES.base == BYTES);

/// Decodes one tile into `out[r·256 + c]`.
pub fn decode(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    lanes::bf16_plane(tile, 0, &mut d);
    lanes::decode4(tile, LANES, &lanes::SIGNED4, &d, None, out);
}

/// Decodes one tile column-major into `out[c·R + r]` (the fast path; see `lanes::decode4_cols`).
#[inline(always)]
pub fn decode_cols(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    lanes::bf16_plane(tile, 0, &mut d);
    dispatch::decode4_cols_fast(tile, LANES, dispatch::Nibbles::Signed, &d, None, out);
}
