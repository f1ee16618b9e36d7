//! What a product's operands are: f32, or rounded to bf16 (natively on AVX-512-BF16), and the
//! roundings both sides of a bf16 product share.

use super::{NB, Path};

/// What a product's operands are before they are multiplied; sums are f32 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32 operands: the reference arithmetic (a bf16 weight widened exactly).
    F32,
    /// Both operands rounded to bf16, to nearest even: `vdpbf16ps` on AVX-512-BF16, the same
    /// rounding before the f32 tiles elsewhere (see [`Precision::native`]).
    Bf16,
}

/// Environment variable that picks the image encoders' [`Precision`] (`f32` or `bf16`) instead
/// of [`Precision::for_encoders`]'s choice.
pub const PRECISION_VAR: &str = "ONEBIT_VISION_PRECISION";

impl Precision {
    /// Whether this precision has its own instructions here: f32 always; bf16 where the CPU has
    /// AVX-512-BF16 and the kernel path is an AVX-512 one (`ONEBIT_KERNELS=avx2` turns it off).
    pub fn native(self) -> bool {
        match self {
            Precision::F32 => true,
            Precision::Bf16 => bf16_native(),
        }
    }

    /// The image encoders' precision: [`PRECISION_VAR`] where set to `f32` or `bf16`, else
    /// f32. bf16 is not the default even where it is native: on the Xeons measured
    /// (docs/benchmarks.md) `vdpbf16ps` retires one 32-pair instruction every two cycles
    /// against two 16-lane FMAs a cycle, so bf16 operands halve the products' speed for their
    /// rounding. Found once.
    pub fn for_encoders() -> Precision {
        static CHOSEN: std::sync::OnceLock<Precision> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            std::env::var(PRECISION_VAR)
                .ok()
                .as_deref()
                .and_then(Precision::by_name)
                .unwrap_or(Precision::F32)
        })
    }

    /// The precision called `name` (`f32`, `bf16`).
    pub fn by_name(name: &str) -> Option<Precision> {
        match name {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            _ => None,
        }
    }

    /// Name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// Whether `vdpbf16ps` runs here (found once).
pub(super) fn bf16_native() -> bool {
    static NATIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NATIVE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if Path::detect() == Path::Avx512 && std::is_x86_feature_detected!("avx512bf16") {
            return true;
        }
        false
    })
}

/// `v` rounded to bf16 (to nearest even), as its bits.
pub(super) fn bf16_bits(v: f32) -> u32 {
    u32::from(half::bf16::from_f32(v).to_bits())
}

/// `v` rounded to bf16, widened back.
pub(super) fn round_bf16(v: f32) -> f32 {
    f32::from_bits(bf16_bits(v) << 16)
}

/// An f32 panel's values as a bf16 panel of `kc` inputs (see [`Weights::pack_pairs`]).
pub(super) fn pairs_of_panel(wide: &[f32], kc: usize, panel: &mut [u32]) {
    panel.fill(0);
    for p in 0..kc.div_ceil(2) {
        let (lo, hi) = (2 * p, 2 * p + 1);
        for j in 0..NB {
            let a = bf16_bits(wide[lo * NB + j]);
            let b = if hi < kc {
                bf16_bits(wide[hi * NB + j])
            } else {
                0
            };
            panel[p * NB + j] = a | (b << 16);
        }
    }
}

/// A row's values as bf16 pairs (the last one's high half zero when the row is odd).
pub(super) fn row_pairs(row: &[f32], out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if bf16_native() {
        // SAFETY: bf16_native() found AVX-512-BF16; the lengths are checked inside.
        unsafe { super::x86::row_pairs_512(row, out) };
        return;
    }
    for (p, o) in out.iter_mut().enumerate() {
        let lo = bf16_bits(row[2 * p]);
        let hi = row.get(2 * p + 1).map_or(0, |v| bf16_bits(*v));
        *o = lo | (hi << 16);
    }
}
