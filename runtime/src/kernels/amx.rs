//! AMX-INT8 tiles for batches of 16 tokens and more on the 4-bit kinds: one `tdpbsud` multiplies
//! 16 tokens × 32 columns of int8 activations by 32 columns × 16 rows of weight codes, 8,192
//! multiply-adds, where `vpdpbusd` does 64.
//!
//! A row block's codes are unpacked, four groups at a time, into the tile unit's layout (`B`: per
//! 16 rows and 32-column group, 8 rows of 64 bytes, each 4 bytes being 4 columns of one row), in
//! a buffer of the thread; every block of 16 tokens reads its activation codes straight from
//! [`Activations::qt`] (`A`: 16 rows of 32 bytes, contiguous) and multiplies them by
//! the four groups' `B` back to back. The integer sums are exact, and each group's f32 step is the AVX-512 path's
//! own, in the same order (`x86_512::scale`), so a row's numbers are bit for bit those of that
//! path: tokens past the last whole block of 16, and a thread Linux refuses AMX, take it with
//! no visible difference.
//!
//! Linux grants the tile state per thread: every thread asks with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` before its first tile instruction
//! ([`thread_ready`]), and keeps the answer.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};

use super::layout::CodeKind;
use super::x86_512;
use super::{Activations, QMatrix};

/// Tokens per tile block (the tile's rows).
pub(super) const BLOCK: usize = 16;

/// Whether the CPU has AMX-INT8 and the OS saves tile state (XCR0 bits 17 and 18). Permission
/// is still needed per thread ([`thread_ready`]).
pub(super) fn cpu_has_amx() -> bool {
    // SAFETY: CPUID is always available on x86_64; XGETBV is checked for (OSXSAVE) first.
    unsafe {
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        let osxsave = __cpuid(1).ecx & (1 << 27) != 0;
        if !(tile && int8 && osxsave) {
            return false;
        }
        let xcr0 = xgetbv0();
        xcr0 & (0b11 << 17) == 0b11 << 17
    }
}

/// XCR0.
///
/// # Safety
/// The CPU reports OSXSAVE.
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 reads XCR0; the caller checked OSXSAVE.
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// A thread's buffers for [`tiles`], kept between calls.
struct Scratch {
    /// B tiles of one chunk of groups, every 16-row unit of the row block.
    b: Vec<u8>,
    /// Tile outputs of one chunk.
    c: Vec<i32>,
    /// Per unit and token, the 16 rows' f32 sums so far.
    acc: Vec<__m512>,
}

thread_local! {
    /// Whether this thread has loaded [`CONFIG`].
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
    /// This thread's answer from Linux: `None` until asked.
    static GRANTED: Cell<Option<bool>> = const { Cell::new(None) };
    /// This thread's unpacked weights, tile output and f32 sums.
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { b: Vec::new(), c: Vec::new(), acc: Vec::new() })
    };
}

/// Asks Linux for the tile state for this thread, once; whether it may run tile instructions.
pub(super) fn thread_ready() -> bool {
    GRANTED.with(|g| match g.get() {
        Some(ok) => ok,
        None => {
            let ok = request_permission();
            if !ok {
                tracing::warn!(
                    "Linux refused this thread AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM); its products run on AVX-512 VNNI"
                );
            }
            g.set(Some(ok));
            ok
        }
    })
}

#[cfg(target_os = "linux")]
fn request_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl takes two integers and touches no memory of ours; the syscall
    // clobbers rcx and r11 only.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_permission() -> bool {
    false
}

/// The tile configuration (palette 1): tmm0–tmm3 = C of four groups (16 × 64 bytes: 16 tokens ×
/// 16 rows of i32), tmm4 and tmm6 = A (16 × 32: 16 tokens × 32 codes), tmm5 and tmm7 = B (8 ×
/// 64: 32 columns × 16 rows in fours). Four accumulators and two A/B pairs let four products run
/// back to back: tiles are not renamed, so one C, A and B would serialize every group.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    // colsb (u16 per tile) at 16 + 2·tmm, rows (u8 per tile) at 48 + tmm.
    let mut t = 0;
    while t < 8 {
        let (cols, rows) = match t {
            4 | 6 => (32, 16),
            5 | 7 => (64, 8),
            _ => (64, 16),
        };
        c[16 + 2 * t] = cols;
        c[48 + t] = rows;
        t += 1;
    }
    TileConfig(c)
};

/// Groups multiplied per tile batch.
const GROUPS: usize = 4;

/// `vpermt2b` indexes that build B rows from a load's low (`lo`) and high (`hi`) nibbles.
/// Lane bands of 16 rows (a load: 8 columns × 16 rows): output `h` is B row `4h..4h+4` columns,
/// byte `4n + i` = row `n`, column `4h + i`.
const B16: [[u8; 64]; 2] = [
    index_table!(u8, 64, |b| 8 * (b % 4) + b / 8 + 64 * (b / 4 % 2)),
    index_table!(u8, 64, |b| 8 * (4 + b % 4) + b / 8 + 64 * (b / 4 % 2)),
];

/// Lane bands of 32 rows (a load: 4 columns × 32 rows): output `s` is the B row of rows
/// `16s .. 16s+16`, byte `4n + i` = row `16s + n`, column `i`.
const B32: [[u8; 64]; 2] = [
    index_table!(u8, 64, |b| 16 * (b % 4) + b / 8 + 64 * (b / 4 % 2)),
    index_table!(u8, 64, |b| 16 * (b % 4) + 8 + b / 8 + 64 * (b / 4 % 2)),
];

/// One row block (see `QMatrix::block`): whole blocks of 16 tokens on tiles, the rest (and
/// everything when this thread has no tile state) on the AVX-512 path.
///
/// # Safety
/// The CPU must support AMX-INT8 and everything `x86_512::block` needs; `m.layout.codes` is
/// 4-bit.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) unsafe fn block(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    out: &mut [f32],
    stride: usize,
    local: usize,
) {
    let whole = if thread_ready() && a.qt.len() >= a.n / BLOCK * BLOCK * a.kp {
        a.n / BLOCK * BLOCK
    } else {
        0
    };
    if whole > 0 {
        SCRATCH.with(|s| {
            // SAFETY: same CPU and geometry contract as this function; the thread has tile
            // state.
            unsafe { tiles(m, rb, a, whole, out, stride, local, &mut s.borrow_mut()) }
        });
    }
    if whole < a.n {
        // SAFETY: same contract.
        unsafe { x86_512::block_from(m, rb, a, whole, out, stride, local) }
    }
}

/// Tokens `0 .. n` (a multiple of 16) of one row block on tiles.
///
/// The loops keep what they reuse in L1: per chunk of four groups, the B tiles of every unit
/// (4 KiB for 32 rows) are unpacked once, and every block of 16 tokens multiplies its A tiles
/// by them; each token's f32 sums stay in a buffer of the thread between chunks, and chunks go
/// in column order, so every row adds its groups in the AVX-512 path's order.
///
/// # Safety
/// As [`block`], and this thread has tile state.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn tiles(
    m: &QMatrix<'_>,
    rb: usize,
    a: &Activations,
    n: usize,
    out: &mut [f32],
    stride: usize,
    local: usize,
    s: &mut Scratch,
) {
    let l = &m.layout;
    let (groups, per_tile, rows) = (a.kp / 32, l.groups(), l.rows);
    let units = rows / 16;
    s.b.resize(units * GROUPS * 512, 0);
    s.c.resize(GROUPS * BLOCK * 16, 0);
    s.acc.clear();
    s.acc.resize(units * n, _mm512_setzero_ps());
    let signed = l.codes == CodeKind::S4;
    if !CONFIGURED.with(|c| c.replace(true)) {
        // SAFETY: CONFIG is a valid palette-1 configuration, 64 bytes aligned to 64. Loaded once
        // per thread (the configuration is part of the thread's saved state; loading it again
        // per call costs more than a row block's products).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
    }
    for gg0 in (0..groups).step_by(GROUPS) {
        let batch = (groups - gg0).min(GROUPS);
        // SAFETY: same contract as this function; `s.b` holds units · GROUPS · 512 bytes.
        unsafe { unpack(m, rb, gg0, batch, &mut s.b) };
        for u in 0..units {
            let scales: [(__m512, Option<__m512>); GROUPS] = std::array::from_fn(|j| {
                let gg = (gg0 + j).min(groups - 1);
                let tile = m.tile(rb, gg / per_tile);
                let slot = 2 * ((gg % per_tile) * rows + u * 16);
                let d = x86_512::widen16(&tile[slot..slot + 32]);
                let z = l
                    .zero
                    .then(|| x86_512::widen16(&tile[l.zero_base() + slot..][..32]));
                (d, z)
            });
            for t0 in (0..n).step_by(BLOCK) {
                let at_a = |j: usize| a.qt[(t0 / BLOCK * groups + gg0 + j) * 512..][..512].as_ptr();
                let at_b = |j: usize| s.b[(u * GROUPS + j) * 512..][..512].as_ptr();
                let cp = s.c.as_mut_ptr();
                if batch == GROUPS {
                    // SAFETY: A: 16 rows of 32 bytes inside `a.qt`; B: 8 rows of 64 bytes inside
                    // `s.b` (both sliced above); C: four 1,024-byte outputs in `c`.
                    unsafe {
                        asm!(
                            "tilezero tmm0",
                            "tilezero tmm1",
                            "tilezero tmm2",
                            "tilezero tmm3",
                            "tileloadd tmm4, [{a0} + {sa}*1]",
                            "tileloadd tmm5, [{b0} + {sb}*1]",
                            "tileloadd tmm6, [{a1} + {sa}*1]",
                            "tileloadd tmm7, [{b1} + {sb}*1]",
                            "tdpbsud tmm0, tmm4, tmm5",
                            "tdpbsud tmm1, tmm6, tmm7",
                            "tileloadd tmm4, [{a2} + {sa}*1]",
                            "tileloadd tmm5, [{b2} + {sb}*1]",
                            "tileloadd tmm6, [{a3} + {sa}*1]",
                            "tileloadd tmm7, [{b3} + {sb}*1]",
                            "tdpbsud tmm2, tmm4, tmm5",
                            "tdpbsud tmm3, tmm6, tmm7",
                            "tilestored [{c} + {sb}*1], tmm0",
                            "add {c}, 1024",
                            "tilestored [{c} + {sb}*1], tmm1",
                            "add {c}, 1024",
                            "tilestored [{c} + {sb}*1], tmm2",
                            "add {c}, 1024",
                            "tilestored [{c} + {sb}*1], tmm3",
                            a0 = in(reg) at_a(0),
                            a1 = in(reg) at_a(1),
                            a2 = in(reg) at_a(2),
                            a3 = in(reg) at_a(3),
                            b0 = in(reg) at_b(0),
                            b1 = in(reg) at_b(1),
                            b2 = in(reg) at_b(2),
                            b3 = in(reg) at_b(3),
                            sa = in(reg) 32usize,
                            sb = in(reg) 64usize,
                            c = inout(reg) cp => _,
                            options(nostack)
                        );
                    }
                } else {
                    for j in 0..batch {
                        // SAFETY: as above, one group into `c[256·j ..]`.
                        unsafe {
                            asm!(
                                "tilezero tmm0",
                                "tileloadd tmm4, [{a} + {sa}*1]",
                                "tileloadd tmm5, [{b} + {sb}*1]",
                                "tdpbsud tmm0, tmm4, tmm5",
                                "tilestored [{c} + {sb}*1], tmm0",
                                a = in(reg) at_a(j),
                                b = in(reg) at_b(j),
                                sa = in(reg) 32usize,
                                sb = in(reg) 64usize,
                                c = in(reg) cp.add(256 * j),
                                options(nostack)
                            );
                        }
                    }
                }
                let sums = &mut s.acc[u * n + t0..u * n + t0 + BLOCK];
                for (t, acc) in sums.iter_mut().enumerate() {
                    let mut v = *acc;
                    for (j, &(d, z)) in scales.iter().enumerate().take(batch) {
                        let row = &s.c[256 * j + 16 * t..][..16];
                        // SAFETY: 16 i32 (sliced above).
                        let isum = unsafe { _mm512_loadu_si512(row.as_ptr() as *const _) };
                        let at = (t0 + t) * groups + gg0 + j;
                        v = x86_512::scale(v, isum, d, z, a, at, signed);
                    }
                    *acc = v;
                }
            }
        }
    }
    for u in 0..units {
        for t in 0..n {
            x86_512::add_to(&mut out[t * stride + local + u * 16..], s.acc[u * n + t]);
        }
    }
}

/// Unpacks groups `gg0 .. gg0+batch` of row block `rb` into B tiles: for 16-row unit `u` and
/// the chunk's group `j`, 512 bytes at `(u·GROUPS + j)·512`, byte `64·kk + 4n + i` = code of
/// row `16u + n`, column `32(gg0 + j) + 4kk + i` (signed nibbles as `q + 8`).
///
/// # Safety
/// As [`block`]; `b` holds `rows/16 · GROUPS · 512` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn unpack(m: &QMatrix<'_>, rb: usize, gg0: usize, batch: usize, b: &mut [u8]) {
    let l = &m.layout;
    let (per_tile, cols, rows) = (l.groups(), l.cols, l.rows);
    let flip = x86_512::flip_of(l.codes);
    let wide = l.lane == 32;
    let idx = if wide { &B32 } else { &B16 };
    // SAFETY: the index tables hold 64 bytes each.
    let (i0, i1) = unsafe {
        (
            _mm512_loadu_si512(idx[0].as_ptr() as *const _),
            _mm512_loadu_si512(idx[1].as_ptr() as *const _),
        )
    };
    let mut store = |at: usize, v: __m512i| {
        let dst = &mut b[at..at + 64];
        // SAFETY: 64 bytes at `dst` (sliced above).
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr() as *mut _, v) }
    };
    for j in 0..batch {
        let gg = gg0 + j;
        let (tile, g) = (m.tile(rb, gg / per_tile), gg % per_tile);
        if wide {
            // Bands of 32 rows: a load is 4 columns; its two B rows go to units 2·band and
            // 2·band + 1.
            for band in 0..rows / 32 {
                for quad in 0..8 {
                    let at = l.base + band * cols * 16 + (g * 32 + quad * 4) * 16;
                    let (lo, hi) = x86_512::nibbles(load(&tile[at..at + 64]), flip, None);
                    for (s, i) in [i0, i1].into_iter().enumerate() {
                        let u = 2 * band + s;
                        store(
                            (u * GROUPS + j) * 512 + 64 * quad,
                            _mm512_permutex2var_epi8(lo, i, hi),
                        );
                    }
                }
            }
        } else {
            // Bands of 16 rows: a load is 8 columns, two B rows of the band's unit.
            for band in 0..rows / 16 {
                for oct in 0..4 {
                    let at = l.base + band * cols * 8 + (g * 32 + oct * 8) * 8;
                    let (lo, hi) = x86_512::nibbles(load(&tile[at..at + 64]), flip, None);
                    for (h, i) in [i0, i1].into_iter().enumerate() {
                        store(
                            (band * GROUPS + j) * 512 + 64 * (2 * oct + h),
                            _mm512_permutex2var_epi8(lo, i, hi),
                        );
                    }
                }
            }
        }
    }
}

/// 64 code bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
fn load(src: &[u8]) -> __m512i {
    let src = &src[..64];
    // SAFETY: 64 bytes (sliced above).
    unsafe { _mm512_loadu_si512(src.as_ptr() as *const _) }
}
