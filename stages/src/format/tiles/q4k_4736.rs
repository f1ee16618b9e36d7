//! `Q4K_4736`: a Q4_K super-block per tile row, w = S[r]·sc·q + M[r]·mn (q4nx-format §2, row Q4K_4736; evidence: inferred·ref).
//!
//! q4k_47360

use super::dispatch;
use super::lanes::{self, Lanes};

/// Bytes per tile.
pub const BYTES: usize = 4736;
/// Tile geometry and code-plane layout.
pub const LANES: Lanes = Lanes {
    rows: 32,
    cols: 256,
    lane: 32,
    base: 512,
};
const SLOTS: usize = LANES.rows * LANES.groups();
const _: () = assert!(LANES.rows * LANES.cols / 2 + LANES.base + 4 * LANES.rows == BYTES);

/// Byte offset of the per-row super scale `S`.
pub const S_AT: usize = 4608;
/// Byte offset of the per-row (negated) super min `M`.
pub const M_AT: usize = 4672;

/// The per-slot `d = S[r]·sc` and `m = M[r]·mn` of a tile, shared by both decoders.
#[inline(always)]
fn planes(tile: &[u8]) -> ([f32; SLOTS], [f32; SLOTS]) {
    let mut d = [0f32; SLOTS];
    let mut m = [0f32; SLOTS];
    for g in 0..LANES.groups() {
        for r in 0..LANES.rows {
            let slot = LANES.slot(r, g);
            d[slot] = lanes::bf16_at(tile, S_AT + 2 * r) * tile[slot] as f32;
            m[slot] = lanes::bf16_at(tile, M_AT + 2 * r) * tile[256 + slot] as f32;
        }
    }
    (d, m)
}

/// Decodes one tile into `out[r·256 + c]`.
pub fn decode(tile: &[u8], out: &mut [f32]) {
    let (d, m) = planes(tile);
    lanes::decode4(tile, LANES, &lanes::UNSIGNED4, &d, Some(&m), out);
}

/// Decodes one tile column-major into `out[c·R + r]` (the fast path; see `lanes::decode4_cols`).
#[inline(always)]
pub fn decode_cols(tile: &[u8], out: &mut [f32]) {
    let (d, m) = planes(tile);
    dispatch::decode4_cols_fast(tile, LANES, dispatch::Nibbles::Unsigned, &d, Some(&m), out);
}
