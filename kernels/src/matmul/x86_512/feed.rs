//! Where the AVX-512 VNNI kernels read their tokens ([`Feed`]), and the products of one load
//! for a pass of tokens in the tile order ([`dot8`], [`dot4x2`]).

use std::arch::x86_64::*;

use super::super::Activations;
use super::super::activations::BlockOrder;
use super::super::x86::token_codes;
use super::{TOKENS, TOKENS_32};

/// Where one pass reads its tokens `t0 ..`: their codes and per-group factors, token-major
/// (`TILED` false) or in the block-major tile order of one block of 16
/// (`Activations::tile_order`, `BlockOrder::BlockMajor`; `TILED` true). There a pass's tokens
/// lie 32 bytes (one factor) apart: one base register and constant offsets for all of them,
/// where token-major rows need a register each, more than x86 has beside eight tokens' sums
/// (the compiler spilled their broadcasts to the stack). The values are the same either way.
#[derive(Clone, Copy)]
pub(super) struct Feed<'a, const TILED: bool> {
    a: &'a Activations,
    t0: usize,
    /// Factor index of (token `t0`, group 0) and the step from one group to the next.
    base: usize,
    group_step: usize,
}

impl<'a, const TILED: bool> Feed<'a, TILED> {
    pub(super) fn new(a: &'a Activations, t0: usize) -> Self {
        let groups = a.kp / 32;
        let (base, group_step) = if TILED {
            let order = BlockOrder::BlockMajor;
            let b = t0 / 16;
            let at = order.index(b, 0, a.n / 16, groups);
            (at + t0 % 16, order.index(b, 1, a.n / 16, groups) - at)
        } else {
            (t0 * groups, 1)
        };
        Feed {
            a,
            t0,
            base,
            group_step,
        }
    }

    /// Tokens `t0 .. t0+NT`'s 32 codes of group `gg`.
    ///
    /// # Panics
    /// When they are not all inside the activations.
    #[inline(always)]
    pub(super) fn codes<const NT: usize>(&self, gg: usize) -> [*const i8; NT] {
        if TILED {
            let at = self.at(0, gg) * 32;
            let base = self.a.qt[at..][..NT * 32].as_ptr();
            std::array::from_fn(|t| base.wrapping_add(32 * t))
        } else {
            token_codes::<i8, NT>(&self.a.q, self.a.kp, self.t0, gg * 32)
        }
    }

    /// Token `t0 + t`'s factor index of group `gg`.
    #[inline(always)]
    fn at(&self, t: usize, gg: usize) -> usize {
        let token_step = if TILED { 1 } else { self.a.kp / 32 };
        self.base + gg * self.group_step + t * token_step
    }

    /// Token `t0 + t`'s activation scale of group `gg`, and its zero-point factor where `zero`
    /// (the tiles have zero points; 0 otherwise, not read).
    #[inline(always)]
    pub(super) fn factors(&self, t: usize, gg: usize, zero: bool) -> (f32, f32) {
        let at = self.at(t, gg);
        let (qd, zs) = if TILED {
            (&self.a.qdt, &self.a.zst)
        } else {
            (&self.a.qd, &self.a.zs)
        };
        (qd[at], if zero { zs[at] } else { 0.0 })
    }

    /// Token `t0 + t`'s `8·Σx` of group `gg`.
    #[inline(always)]
    pub(super) fn qsum8(&self, t: usize, gg: usize) -> i32 {
        let at = self.at(t, gg);
        if TILED {
            self.a.qs8t[at]
        } else {
            self.a.qsum8[at]
        }
    }
}

/// `sums[t] += wa·x_t[0..4] + wb·x_t[4..8]` (`vpdpbusd`, each four codes broadcast from memory)
/// for eight tokens whose codes lie 32 bytes apart from `p`: one block the compiler cannot
/// reorder. Written as intrinsics, the compiler hoisted the broadcasts of a whole group's loads
/// ahead of their products and spilled most of them to the stack (a store and a reload per
/// broadcast, where the embedded broadcast reads the activation once).
///
/// # Safety
/// The CPU has AVX-512 F and VNNI; `p + 32·t .. + 8` is readable for `t < 8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) unsafe fn dot8(sums: &mut [__m512i; TOKENS], wa: __m512i, wb: __m512i, p: *const i8) {
    let [s0, s1, s2, s3, s4, s5, s6, s7] = sums;
    // SAFETY: reads 4 bytes at each of p + 32·t and p + 32·t + 4 (the caller's contract);
    // writes only the eight sum registers.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {s0}, {wa}, dword ptr [{p}]{{1to16}}",
            "vpdpbusd {s1}, {wa}, dword ptr [{p} + 32]{{1to16}}",
            "vpdpbusd {s2}, {wa}, dword ptr [{p} + 64]{{1to16}}",
            "vpdpbusd {s3}, {wa}, dword ptr [{p} + 96]{{1to16}}",
            "vpdpbusd {s4}, {wa}, dword ptr [{p} + 128]{{1to16}}",
            "vpdpbusd {s5}, {wa}, dword ptr [{p} + 160]{{1to16}}",
            "vpdpbusd {s6}, {wa}, dword ptr [{p} + 192]{{1to16}}",
            "vpdpbusd {s7}, {wa}, dword ptr [{p} + 224]{{1to16}}",
            "vpdpbusd {s0}, {wb}, dword ptr [{p} + 4]{{1to16}}",
            "vpdpbusd {s1}, {wb}, dword ptr [{p} + 36]{{1to16}}",
            "vpdpbusd {s2}, {wb}, dword ptr [{p} + 68]{{1to16}}",
            "vpdpbusd {s3}, {wb}, dword ptr [{p} + 100]{{1to16}}",
            "vpdpbusd {s4}, {wb}, dword ptr [{p} + 132]{{1to16}}",
            "vpdpbusd {s5}, {wb}, dword ptr [{p} + 164]{{1to16}}",
            "vpdpbusd {s6}, {wb}, dword ptr [{p} + 196]{{1to16}}",
            "vpdpbusd {s7}, {wb}, dword ptr [{p} + 228]{{1to16}}",
            s0 = inout(zmm_reg) *s0,
            s1 = inout(zmm_reg) *s1,
            s2 = inout(zmm_reg) *s2,
            s3 = inout(zmm_reg) *s3,
            s4 = inout(zmm_reg) *s4,
            s5 = inout(zmm_reg) *s5,
            s6 = inout(zmm_reg) *s6,
            s7 = inout(zmm_reg) *s7,
            wa = in(zmm_reg) wa,
            wb = in(zmm_reg) wb,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
}

/// `lo[t] += wl·x_t`, `hi[t] += wh·x_t` (`vpdpbusd`, the four codes `x_t` broadcast from memory)
/// for four tokens whose codes lie 32 bytes apart from `p`: [`dot8`] for lane bands of 32 rows.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI; `p + 32·t .. + 4` is readable for `t < 4`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma")]
pub(super) unsafe fn dot4x2(
    lo: &mut [__m512i; TOKENS_32],
    hi: &mut [__m512i; TOKENS_32],
    wl: __m512i,
    wh: __m512i,
    p: *const i8,
) {
    let [l0, l1, l2, l3] = lo;
    let [h0, h1, h2, h3] = hi;
    // SAFETY: reads 4 bytes at each of p + 32·t (the caller's contract); writes only the eight
    // sum registers.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {l0}, {wl}, dword ptr [{p}]{{1to16}}",
            "vpdpbusd {h0}, {wh}, dword ptr [{p}]{{1to16}}",
            "vpdpbusd {l1}, {wl}, dword ptr [{p} + 32]{{1to16}}",
            "vpdpbusd {h1}, {wh}, dword ptr [{p} + 32]{{1to16}}",
            "vpdpbusd {l2}, {wl}, dword ptr [{p} + 64]{{1to16}}",
            "vpdpbusd {h2}, {wh}, dword ptr [{p} + 64]{{1to16}}",
            "vpdpbusd {l3}, {wl}, dword ptr [{p} + 96]{{1to16}}",
            "vpdpbusd {h3}, {wh}, dword ptr [{p} + 96]{{1to16}}",
            l0 = inout(zmm_reg) *l0,
            l1 = inout(zmm_reg) *l1,
            l2 = inout(zmm_reg) *l2,
            l3 = inout(zmm_reg) *l3,
            h0 = inout(zmm_reg) *h0,
            h1 = inout(zmm_reg) *h1,
            h2 = inout(zmm_reg) *h2,
            h3 = inout(zmm_reg) *h3,
            wl = in(zmm_reg) wl,
            wh = in(zmm_reg) wh,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
}
