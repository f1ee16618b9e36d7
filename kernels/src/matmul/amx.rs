//! AMX-INT8 tiles for batches of 16 tokens and more on the 4-bit kinds: one `tdpbssd` multiplies
//! 16 tokens × 32 columns of int8 activations by 32 columns × 16 rows of weight codes, 8,192
//! multiply-adds, where `vpdpbusd` does 64.
//!
//! A row block's codes are unpacked, four groups at a time, into the tile unit's layout (`B`: per
//! 16 rows and 32-column group, 8 rows of 64 bytes, each 4 bytes being 4 columns of one row, as
//! signed bytes), in a buffer of the thread. Then group by group each unit's `B` is loaded once
//! and every block of 16 tokens multiplies its activation codes, read straight from
//! [`Activations::qt`] (`A`: 16 rows of 32 bytes; group-major, so one group's blocks stream), by
//! all of them. A group's scale is per row, so every product's 16 × 16 sums go out through
//! memory to an f32 step (`acc += (d·dx)·isum`); the tile unit computes the next block while the
//! vector units scale the last one.
//!
//! The integer sums are exact, and each group's f32 step is the AVX-512 path's own, in the same
//! order (`x86_512::scale`), so a row's numbers are bit for bit those of that path: tokens past
//! the last whole block of 16, and a thread Linux refuses AMX, take it with no visible
//! difference.
//!
//! Measured on `ffn_up` 6144×2048 at 128 tokens, one thread (`runtime/benches/matvec.rs`): a tile
//! store costs about as much as a product (12 against 14 cycles), so signed sums (nothing to take
//! back per group), one `B` load per group for every block, and activations whose blocks lie in
//! order took the product from 15.0 to 6.1–6.5 ms.
//!
//! Linux grants the tile state per thread: every thread asks with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` before its first tile instruction
//! ([`thread_ready`]), and keeps the answer.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};

use super::activations::BlockOrder::{self, GroupMajor};
use super::layout::Codes;
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

/// The tile configuration (palette 1): tmm0–tmm3 = C (16 × 64 bytes: 16 tokens × 16 rows of i32;
/// tmm0–1 for even blocks, tmm2–3 for odd ones, one per unit), tmm4 and tmm5 = A of even and odd
/// blocks (16 × 32: 16 tokens × 32 codes), tmm6 and tmm7 = B of the two units (8 × 64: 32 columns
/// × 16 rows in fours). Tiles are not renamed: alternating two sets of C and A lets one block's
/// products run while the last one's are stored.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    // colsb (u16 per tile) at 16 + 2·tmm, rows (u8 per tile) at 48 + tmm.
    let mut t = 0;
    while t < 8 {
        let (cols, rows) = match t {
            4 | 5 => (32, 16),
            6 | 7 => (64, 8),
            _ => (64, 16),
        };
        c[16 + 2 * t] = cols;
        c[48 + t] = rows;
        t += 1;
    }
    TileConfig(c)
};

/// Groups unpacked into B tiles at a time (4 KiB for 32 rows: the chunk stays in L1).
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
    let whole = if thread_ready() && a.order == Some(BlockOrder::GroupMajor) {
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

/// Slots of the ring of C tiles between the tile unit and the f32 step: a block's products
/// go to one slot while the f32 step reads the block before it from another.
const SLOTS: usize = 4;

/// i32 per ring slot: two C tiles (one per 16-row unit) of 1 KiB, and one cache line more, so
/// a slot's loads never sit a multiple of 4 KiB from another slot's stores (the CPU would take
/// them for the same address and hold the loads back).
const SLOT: usize = 2 * 256 + 16;

/// Tokens `0 .. n` (a multiple of 16) of one row block on tiles.
///
/// Per chunk of four groups, the B tiles of every unit (4 KiB for 32 rows) are unpacked once.
/// Then, group by group, the units' B tiles are loaded once, and each block of 16 tokens loads
/// its A tile and multiplies it by both: C tiles of alternate blocks go to alternate tile
/// registers (tmm0–1 and tmm2–3, A in tmm4 or tmm5), so the tile unit computes one block while
/// the last one's C tiles are stored. A block's f32 step runs after the next block's tile
/// instructions are issued, so the vector units work beside the tile unit. Each token's f32
/// sums stay in a buffer of the thread between groups; groups go in column order, so every row
/// adds its groups in the AVX-512 path's order.
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
    debug_assert!(units == 1 || units == 2, "tiles of 16 or 32 rows");
    s.b.resize(units * GROUPS * 512, 0);
    s.c.resize(SLOTS * SLOT, 0);
    s.acc.clear();
    s.acc.resize(units * n, _mm512_setzero_ps());
    if !CONFIGURED.with(|c| c.replace(true)) {
        // SAFETY: CONFIG is a valid palette-1 configuration, 64 bytes aligned to 64. Loaded once
        // per thread (the configuration is part of the thread's saved state; loading it again
        // per call costs more than a row block's products).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
    }
    let blocks = n / BLOCK;
    let zero = l.zero;
    for gg0 in (0..groups).step_by(GROUPS) {
        let batch = (groups - gg0).min(GROUPS);
        // SAFETY: same contract as this function; `s.b` holds units · GROUPS · 512 bytes.
        unsafe { unpack(m, rb, gg0, batch, &mut s.b) };
        for j in 0..batch {
            let gg = gg0 + j;
            let scales: [(__m512, __m512); 2] = std::array::from_fn(|u| {
                let tile = m.tile(rb, gg / per_tile);
                let slot = 2 * ((gg % per_tile) * rows + u.min(units - 1) * 16);
                let d = x86_512::widen16(&tile[slot..slot + 32]);
                let z = if zero {
                    x86_512::widen16(&tile[l.zero_base() + slot..][..32])
                } else {
                    _mm512_setzero_ps()
                };
                (d, z)
            });
            let b = &s.b[j * 512..];
            // SAFETY: the units' B tiles of chunk group `j`, 8 rows of 64 bytes at `b` and
            // `b[GROUPS·512 ..]` (unit 1, when there is one), inside `s.b`.
            unsafe {
                asm!(
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    b0 = in(reg) b[..512].as_ptr(),
                    b1 = in(reg) b[(units - 1) * GROUPS * 512..][..512].as_ptr(),
                    sb = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
            for blk in 0..blocks {
                let slot = &mut s.c[(blk % SLOTS) * SLOT..][..2 * 256];
                let at = a.qt[GroupMajor.index(blk, gg, blocks, groups) * 32..][..512].as_ptr();
                // SAFETY: A is 16 rows of 32 bytes inside `a.qt`; B is loaded above; `slot`
                // holds two 1 KiB tiles.
                unsafe { product(at, slot, blk % 2 == 1, units == 2) };
                if blk > 0 {
                    let prev = blk - 1;
                    let c = &s.c[(prev % SLOTS) * SLOT..][..2 * 256];
                    accumulate(&mut s.acc, c, prev, units, n, &scales, a, gg, zero);
                }
            }
            let last = blocks - 1;
            let c = &s.c[(last % SLOTS) * SLOT..][..2 * 256];
            accumulate(&mut s.acc, c, last, units, n, &scales, a, gg, zero);
        }
    }
    for u in 0..units {
        for t in 0..n {
            x86_512::add_to(&mut out[t * stride + local + u * 16..], s.acc[u * n + t]);
        }
    }
}

/// One tile step as one `asm!` block: zero the C tiles, load A (16 rows of 32 bytes at `$a`)
/// into tile `$at`, multiply it by each B tile into its C tile, and store each C tile (16 rows of
/// 64 bytes) at byte `$off` of `$c`. Tile registers are operands of the instruction text, so each
/// register set is its own invocation.
macro_rules! tile_step {
    ($a:expr, $c:expr, $at:literal; $(($ct:literal, $bt:literal, $off:literal)),+) => {
        asm!(
            $(concat!("tilezero ", $ct),)+
            concat!("tileloadd ", $at, ", [{a} + {sa}*1]"),
            $(concat!("tdpbssd ", $ct, ", ", $at, ", ", $bt),)+
            $(concat!("tilestored [{c} + {sb}*1 + ", $off, "], ", $ct),)+
            a = in(reg) $a,
            sa = in(reg) 32usize,
            sb = in(reg) 64usize,
            c = in(reg) $c,
            options(nostack)
        )
    };
}

/// One block of 16 tokens times the loaded B tiles (tmm6, and tmm7 when `two` units): C tile of
/// unit `v` into `c[256·v ..]`, 16 tokens × 16 rows of exact i32 sums. `odd` blocks use tmm2–3
/// and tmm5, even ones tmm0–1 and tmm4.
///
/// # Safety
/// The thread has tile state and [`CONFIG`] loaded and the B tiles loaded; `a` points to 16
/// rows of 32 bytes, `c` to two 1 KiB tiles.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn product(a: *const i8, c: &mut [i32], odd: bool, two: bool) {
    let c = c[..2 * 256].as_mut_ptr();
    // SAFETY (every arm): as this function's contract.
    unsafe {
        match (odd, two) {
            (false, true) => {
                tile_step!(a, c, "tmm4"; ("tmm0", "tmm6", "0"), ("tmm1", "tmm7", "1024"))
            }
            (true, true) => {
                tile_step!(a, c, "tmm5"; ("tmm2", "tmm6", "0"), ("tmm3", "tmm7", "1024"))
            }
            (false, false) => tile_step!(a, c, "tmm4"; ("tmm0", "tmm6", "0")),
            (true, false) => tile_step!(a, c, "tmm5"; ("tmm2", "tmm6", "0")),
        }
    }
}

/// Block `blk`'s f32 step for column group `gg` (C of unit `v` at `c[256·v ..]`): every
/// token's sums `acc += (d·dx)·isum (+ z·dx·Σx)`, the AVX-512 path's own operations in its
/// order (`x86_512::scale`; the tile sums are the signed ones, so nothing is taken back).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
fn accumulate(
    acc: &mut [__m512],
    c: &[i32],
    blk: usize,
    units: usize,
    n: usize,
    scales: &[(__m512, __m512); 2],
    a: &Activations,
    gg: usize,
    zero: bool,
) {
    let t0 = blk * BLOCK;
    let blocks = a.n / BLOCK;
    let at = GroupMajor.index(blk, gg, blocks, a.kp / 32);
    let qd = &a.qdt[at..][..BLOCK];
    let zs = &a.zst[at..][..BLOCK];
    for (u, &(d, z)) in scales.iter().enumerate().take(units) {
        let tile = &c[256 * u..][..256];
        let sums = &mut acc[u * n + t0..][..BLOCK];
        for (t, sum) in sums.iter_mut().enumerate() {
            let row = &tile[16 * t..][..16];
            // SAFETY: 16 i32 (sliced above).
            let isum = unsafe { _mm512_loadu_si512(row.as_ptr() as *const _) };
            let mut v = _mm512_fmadd_ps(
                _mm512_mul_ps(d, _mm512_set1_ps(qd[t])),
                _mm512_cvtepi32_ps(isum),
                *sum,
            );
            if zero {
                v = _mm512_fmadd_ps(z, _mm512_set1_ps(zs[t]), v);
            }
            *sum = v;
        }
    }
}

/// Unpacks groups `gg0 .. gg0+batch` of row block `rb` into B tiles: for 16-row unit `u` and
/// the chunk's group `j`, 512 bytes at `(u·GROUPS + j)·512`, byte `64·kk + 4n + i` = code of
/// row `16u + n`, column `32(gg0 + j) + 4kk + i`, as a signed byte (signed nibbles as `q`,
/// unsigned as `q`: both fit, so one signed×signed product serves every 4-bit kind).
///
/// # Safety
/// As [`block`]; `b` holds `rows/16 · GROUPS · 512` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn unpack(m: &QMatrix<'_>, rb: usize, gg0: usize, batch: usize, b: &mut [u8]) {
    let l = &m.layout;
    let (per_tile, cols, rows) = (l.groups(), l.cols, l.rows);
    let flip = x86_512::flip_of(l.codes);
    // `nibbles` reads signed codes as `q + 8`: take the 8 back.
    let back = _mm512_set1_epi8(if l.codes == Codes::Signed4 { 8 } else { 0 });
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
        let v = _mm512_sub_epi8(v, back);
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
