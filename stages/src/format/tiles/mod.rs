//! Tile decoders for every kind of q4nx-format §2. The kinds, their geometry and their planes are
//! [`onebit_pack::tiles`]' one table (re-exported here); this module holds only what truly differs
//! per kind: how a kind's scale planes become per-slot `d`/`m` ([`planes`]) and which number a
//! code stands for. The lane loops ([`lanes`], [`avx2`]) are shared by every kind.
//!
//! Widths the FastFlowLM slice algebra predicts but no reader implements (5,632, 9,216, 9,728 bytes)
//! are named refusals ([`Unreadable`]), not a catch-all.

#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod lanes;

pub use onebit_pack::tiles::{
    ALL_KINDS, Codes, Scales, SecondPlane, TileKind, TileLayout, Unreadable, WidthReading,
    candidates_for_width,
};
use onebit_pack::tiles::{Q4K_M_AT, Q4K_S_AT, e8m0};

/// The most scale slots a tile has (32 rows × 8 groups).
const MAX_SLOTS: usize = 256;
const _: () = {
    let mut i = 0;
    while i < ALL_KINDS.len() {
        assert!(ALL_KINDS[i].layout().slots() <= MAX_SLOTS);
        i += 1;
    }
};

/// Decoding one tile of a kind: the reader of the import.
pub trait TileCodec {
    /// Decodes one tile into `out[r·C + c]` (`out.len() ≥ R·C`). `tile.len()` must be the kind's
    /// bytes; the caller slices the tensor, so this never reads out of bounds.
    fn decode(self, tile: &[u8], out: &mut [f32]);

    /// Decodes one tile column-major into `out[c·R + r]`: the fast path, for consumers that do
    /// not need row order (statistics, verification sums). Equal, element for element, to
    /// [`TileCodec::decode`] transposed.
    fn decode_cols(self, tile: &[u8], out: &mut [f32]);
}

/// Per-slot `d` and, when the kind adds one, `m` of one tile, read from its scale planes: the
/// code that differs per kind.
#[inline(always)]
fn planes(l: &TileLayout, tile: &[u8], d: &mut [f32; MAX_SLOTS], m: &mut [f32; MAX_SLOTS]) -> bool {
    let n = l.slots();
    match l.scales {
        Scales::Bf16 => {
            lanes::bf16_plane(tile, 0, &mut d[..n]);
            if l.zero {
                lanes::bf16_plane(tile, l.zero_base(), &mut m[..n]);
            }
            l.zero
        }
        Scales::Q4kSuper => {
            for g in 0..l.groups() {
                for r in 0..l.rows {
                    let slot = l.slot(r, g);
                    d[slot] = lanes::bf16_at(tile, Q4K_S_AT + 2 * r) * tile[slot] as f32;
                    m[slot] = lanes::bf16_at(tile, Q4K_M_AT + 2 * r) * tile[256 + slot] as f32;
                }
            }
            true
        }
        Scales::E8m0 => {
            for (slot, v) in d[..n].iter_mut().enumerate() {
                *v = e8m0(tile[slot]);
            }
            false
        }
    }
}

/// Runs `$body` with `$l` bound to the kind's row of the table as a constant, so the lane loops
/// are compiled for each kind's geometry (unrolled and vectorized for its lane height) rather than
/// reading it at run time: that made the 8-bit decode 2.4× slower.
macro_rules! with_const_layout {
    ($kind:expr, |$l:ident| $body:expr) => {
        match $kind {
            TileKind::Q41_5120 => with_const_layout!(@ Q41_5120, $l, $body),
            TileKind::Q40_5120 => with_const_layout!(@ Q40_5120, $l, $body),
            TileKind::Q8H_5120 => with_const_layout!(@ Q8H_5120, $l, $body),
            TileKind::Q41_1280 => with_const_layout!(@ Q41_1280, $l, $body),
            TileKind::Q40_4608 => with_const_layout!(@ Q40_4608, $l, $body),
            TileKind::Q4K_4736 => with_const_layout!(@ Q4K_4736, $l, $body),
            TileKind::Q8L_8704 => with_const_layout!(@ Q8L_8704, $l, $body),
            TileKind::Q8C_8704 => with_const_layout!(@ Q8C_8704, $l, $body),
            TileKind::Q41_2560 => with_const_layout!(@ Q41_2560, $l, $body),
            TileKind::MXFP4_2560 => with_const_layout!(@ MXFP4_2560, $l, $body),
        }
    };
    (@ $kind:ident, $l:ident, $body:expr) => {{
        const L: &TileLayout = TileKind::$kind.layout();
        let $l = L;
        $body
    }};
}

fn check_sizes(l: &TileLayout, tile: &[u8], out: &[f32]) {
    assert_eq!(tile.len(), l.bytes, "tile slice of the wrong size");
    assert!(out.len() >= l.rows * l.cols, "output buffer too small");
}

impl TileCodec for TileKind {
    fn decode(self, tile: &[u8], out: &mut [f32]) {
        let l = self.layout();
        check_sizes(l, tile, out);
        let (mut d, mut m) = ([0f32; MAX_SLOTS], [0f32; MAX_SLOTS]);
        let n = l.slots();
        let m = planes(l, tile, &mut d, &mut m).then_some(&m[..n]);
        let d = &d[..n];
        match l.codes {
            Codes::Signed8 => lanes::decode8(tile, l, d, out),
            Codes::Unsigned4 => lanes::decode4(tile, l, &lanes::UNSIGNED4, d, m, out),
            Codes::Signed4 => lanes::decode4(tile, l, &lanes::SIGNED4, d, m, out),
            Codes::Fp4 => lanes::decode4(tile, l, &onebit_pack::tiles::E2M1, d, m, out),
        }
    }

    fn decode_cols(self, tile: &[u8], out: &mut [f32]) {
        let l = self.layout();
        check_sizes(l, tile, out);
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { decode_cols_avx2(self, tile, out) };
            return;
        }
        with_const_layout!(self, |l| decode_cols_portable(l, tile, out));
    }
}

/// [`TileCodec::decode_cols`] compiled for AVX2: the same code, vectorized 8 lanes wide, with the
/// AVX2 nibble kernel for integer 4-bit codes. No FMA contraction happens (Rust never fuses), so
/// results are bit-identical to the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_cols_avx2(kind: TileKind, tile: &[u8], out: &mut [f32]) {
    with_const_layout!(kind, |l| decode_cols_avx2_with(l, tile, out))
}

/// [`decode_cols_avx2`] for one layout (inlined into it with the layout constant).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn decode_cols_avx2_with(l: &TileLayout, tile: &[u8], out: &mut [f32]) {
    let signed = match l.codes {
        Codes::Unsigned4 => false,
        Codes::Signed4 => true,
        Codes::Signed8 | Codes::Fp4 => return decode_cols_portable(l, tile, out),
    };
    let (mut d, mut m) = ([0f32; MAX_SLOTS], [0f32; MAX_SLOTS]);
    let n = l.slots();
    let m = planes(l, tile, &mut d, &mut m).then_some(&m[..n]);
    // SAFETY: only called from `decode_cols_avx2`, which the caller runs on a CPU with AVX2; sizes
    // were checked by the caller, and every table row's lane height is a multiple of 16.
    unsafe { avx2::decode4_cols(tile, l, signed, &d[..n], m, out) }
}

#[inline(always)]
fn decode_cols_portable(l: &TileLayout, tile: &[u8], out: &mut [f32]) {
    let (mut d, mut m) = ([0f32; MAX_SLOTS], [0f32; MAX_SLOTS]);
    let n = l.slots();
    let m = planes(l, tile, &mut d, &mut m).then_some(&m[..n]);
    let d = &d[..n];
    match l.codes {
        Codes::Signed8 => lanes::decode8_cols(tile, l, d, out),
        Codes::Unsigned4 => lanes::decode4_cols(tile, l, lanes::unsigned4, d, m, out),
        Codes::Signed4 => lanes::decode4_cols(tile, l, lanes::signed4, d, m, out),
        Codes::Fp4 => lanes::decode4_cols(tile, l, lanes::e2m1, d, m, out),
    }
}
