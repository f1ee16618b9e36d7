//! Which kernel path runs: the fastest the CPU has, found at run time, or a slower one named by
//! [`PATH_VAR`] for side-by-side runs.

#[cfg(target_arch = "x86_64")]
use super::amx;

/// Which code path runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// AMX-INT8 tiles for every 16 tokens of a batch on the 4-bit kinds, the AVX-512 VNNI
    /// kernels for the rest (the same numbers bit for bit; see `amx`).
    Amx,
    /// AVX-512 VNNI (with VBMI) for the 4-bit kinds; the 8-bit kinds and the scan head run their
    /// AVX2 kernels (every CPU with these units has AVX2 and FMA).
    Avx512Vnni,
    /// AVX2 + FMA.
    Avx2,
    /// Portable scalar.
    Scalar,
}

/// Environment variable that picks a slower path than [`KernelPath::detect`]'s (`scalar`, `avx2`),
/// for side-by-side benchmarks and for ruling a kernel out; a path the CPU lacks is never
/// taken.
pub const PATH_VAR: &str = "ONEBIT_KERNELS";

impl KernelPath {
    /// The fastest path this CPU runs, or the one [`PATH_VAR`] names when the CPU runs it.
    pub fn detect() -> KernelPath {
        let best = KernelPath::best();
        match std::env::var(PATH_VAR)
            .ok()
            .as_deref()
            .and_then(KernelPath::by_name)
        {
            Some(p) if p.rank() <= best.rank() => p,
            _ => best,
        }
    }

    /// Every path this CPU runs, fastest first.
    pub fn available() -> Vec<KernelPath> {
        let best = KernelPath::best();
        [
            KernelPath::Amx,
            KernelPath::Avx512Vnni,
            KernelPath::Avx2,
            KernelPath::Scalar,
        ]
        .into_iter()
        .filter(|p| p.rank() <= best.rank())
        .collect()
    }

    fn best() -> KernelPath {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") && has!("avx512vbmi") {
                    if amx::cpu_has_amx() {
                        return KernelPath::Amx;
                    }
                    return KernelPath::Avx512Vnni;
                }
                return KernelPath::Avx2;
            }
        }
        KernelPath::Scalar
    }

    fn rank(self) -> u8 {
        match self {
            KernelPath::Amx => 3,
            KernelPath::Avx512Vnni => 2,
            KernelPath::Avx2 => 1,
            KernelPath::Scalar => 0,
        }
    }

    /// The path called `name` (as [`KernelPath::name`] spells it, or `avx512`).
    pub fn by_name(name: &str) -> Option<KernelPath> {
        match name {
            "amx" | "amx-int8" => Some(KernelPath::Amx),
            "avx512" | "avx512-vnni" => Some(KernelPath::Avx512Vnni),
            "avx2" | "avx2+fma" => Some(KernelPath::Avx2),
            "scalar" => Some(KernelPath::Scalar),
            _ => None,
        }
    }

    /// Whether the AVX2 kernels may run (every path but the scalar one).
    pub fn has_avx2(self) -> bool {
        self != KernelPath::Scalar
    }

    /// Name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Amx => "amx-int8",
            KernelPath::Avx512Vnni => "avx512-vnni",
            KernelPath::Avx2 => "avx2+fma",
            KernelPath::Scalar => "scalar",
        }
    }
}

/// Whether the f32 kernels take 16-float AVX-512 F vectors (attention's weighted sums, the image
/// encoders' products): where the CPU has AVX-512 F and the kernel path is an AVX-512 one
/// (`ONEBIT_KERNELS=avx2` keeps everything on AVX2 for side-by-side runs). Found once.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_floats() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        std::is_x86_feature_detected!("avx512f")
            && matches!(
                KernelPath::detect(),
                KernelPath::Amx | KernelPath::Avx512Vnni
            )
    })
}
