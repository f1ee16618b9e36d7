//! `MXFP4_2560`: the gpt-oss expert tile, w = fp4(q)·2^(e−127) (q4nx-format §2, row MXFP4_2560; evidence: inferred (CONV formula)).
//!
//! mxfp4_25600

use super::dispatch;
use super::lanes::{self, Lanes};

/// Bytes per tile.
pub const BYTES: usize = 2560;
/// Tile geometry and code-plane layout.
pub const LANES: Lanes = Lanes {
    rows: 32,
    cols: 128,
    lane: 16,
    base: 512,
};
const SLOTS: usize = LANES.rows * LANES.groups();
const _: () = assert!(LANES.rows * LANES.cols / 2 + LANES.base == BYTES);

/// 2^(e−127) for an E8M0 exponent byte; 0xFF is NaN as in the OCP MX spec.
#[inline]
pub fn e8m0(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        e => f32::from_bits((e as u32) << 23),
    }
}

/// Decodes one tile into `out[r·128 + c]`.
pub fn decode(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    for (slot, v) in d.iter_mut().enumerate() {
        *v = e8m0(tile[slot]);
    }
    lanes::decode4(tile, LANES, &lanes::E2M1, &d, None, out);
}

/// Decodes one tile column-major into `out[c·R + r]` (the fast path; see `lanes::decode4_cols`).
#[inline(always)]
pub fn decode_cols(tile: &[u8], out: &mut [f32]) {
    let mut d = [0f32; SLOTS];
    for (slot, v) in d.iter_mut().enumerate() {
        *v = e8m0(tile[slot]);
    }
    dispatch::decode4_cols_fast(tile, LANES, dispatch::Nibbles::Fp4, &d, None, out);
}
