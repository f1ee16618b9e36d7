//! The column-major 4-bit decoder chosen at run time: the AVX2 kernel ([`super::avx2`]) when the
//! CPU has it, else its scalar twin ([`super::lanes::decode4_cols`]). Kept apart from both so that
//! the kernel and the scalar code never import each other.

use super::lanes::{Lanes, decode4_cols, e2m1, signed4, unsigned4};

/// How 4-bit codes become numbers, for [`decode4_cols_fast`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nibbles {
    /// `q`.
    Unsigned,
    /// `sext4(q)`.
    Signed,
    /// FP4 E2M1.
    Fp4,
}

/// [`decode4_cols`] with the AVX2 kernel when the CPU has it (integer nibbles only).
#[inline(always)]
pub fn decode4_cols_fast(
    tile: &[u8],
    l: Lanes,
    nibbles: Nibbles,
    d: &[f32],
    m: Option<&[f32]>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if nibbles != Nibbles::Fp4 && l.lane.is_multiple_of(16) && std::is_x86_feature_detected!("avx2")
    {
        // SAFETY: AVX2 is present (checked); sizes are checked inside.
        unsafe { super::avx2::decode4_cols(tile, l, nibbles == Nibbles::Signed, d, m, out) };
        return;
    }
    match nibbles {
        Nibbles::Unsigned => decode4_cols(tile, l, unsigned4, d, m, out),
        Nibbles::Signed => decode4_cols(tile, l, signed4, d, m, out),
        Nibbles::Fp4 => decode4_cols(tile, l, e2m1, d, m, out),
    }
}
