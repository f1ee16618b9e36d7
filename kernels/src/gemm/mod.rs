//! f32 matrix products for the image encoders: `y += x · Wᵀ`, where `W` is read in place from
//! wherever it lives: a tower's bf16 projection in its MM blocks straight from the file's
//! mapping ([`Bf16Blocked`]), a plain bf16 matrix ([`Bf16Rows`]), or f32 rows and columns of
//! another product (attention's keys, [`F32Rows`], and values, [`F32Cols`]).
//!
//! The classic blocked product: `W` is copied a panel at a time (`KB` inputs × `NB` outputs,
//! widened to f32 and laid out input-major, 32 KiB: L1), each panel feeds every row of a block of
//! `x` (`MC` rows), and a register tile of `MR` rows × up to 64 outputs accumulates over the
//! panel's depth: per input, one broadcast of each row's `x` and four 16-wide loads of the panel
//! for 24 fused multiply-adds on AVX-512 (AVX2: the panel in passes of 16 outputs). Tasks are
//! (row block, panel column) pairs, spread over rayon's pool; each writes its own rectangle of
//! `y`. The panel copy costs one read of `W` per row block, a 1/`MC` fraction of the arithmetic.
//!
//! [`Precision::Bf16`] rounds both operands to bf16 (to nearest even) and sums in f32: on CPUs
//! with AVX-512-BF16 the panels hold pairs of bf16 inputs per output (`u32`s, half an f32
//! panel's bytes; a tower's bf16 weights are copied bit for bit) and the tile is `vdpbf16ps`,
//! two products per lane an instruction; elsewhere the same rounding feeds the f32 tiles
//! ([`Precision::native`] tells which).
//!
//! Why not a crate: `matrixmultiply` (the earlier path, kept as the benchmark's baseline) runs
//! AVX2 kernels only and needs `W` in f32 (1.6 GB for Gemma 3 4B's tower instead of the
//! mapping's 0.8 GB); `gemm` has AVX-512 kernels but no bf16 and no blocked layouts. The panel
//! copy is where both are solved, so it is ours; the arithmetic around it is the textbook one.

use rayon::prelude::*;

use crate::KernelPath;

/// Outputs a packed panel holds (four 16-lane vectors).
pub const NB: usize = 64;
/// Inputs a packed panel holds: a divisor of every MM block's width (256, 512).
pub const KB: usize = 128;
/// Rows of `x` a register tile covers.
const MR: usize = 6;
/// Rows of `x` a task covers: each task packs its panels once, so a weight is widened
/// `m / MC` times a product (a 512-row slab of one panel's depth is 256 KiB of `x`: L2).
const MC: usize = 512;

mod precision;
mod sources;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use precision::{PRECISION_VAR, Precision};
use precision::{round_bf16, row_pairs};
use sources::Rounded;
pub use sources::{Bf16Blocked, Bf16Rows, F32Cols, F32Rows, Packed, Weights};

/// Values of an f32 panel; a bf16 panel holds half as many `u32`s.
const PANEL: usize = KB * NB;

/// The left operand and the output: with `(n, k) = w.shape()`, `x` is `m × k` at row stride
/// `ldx`, `y` is `m × n` at row stride `ldy` (its other columns untouched).
pub struct Operands<'a> {
    /// The left operand's values.
    pub x: &'a [f32],
    /// Rows of `x` and `y`.
    pub m: usize,
    /// Row stride of `x`.
    pub ldx: usize,
    /// The output's values.
    pub y: &'a mut [f32],
    /// Row stride of `y`.
    pub ldy: usize,
}

/// A raw view of `y` that tasks writing disjoint rectangles share.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: every task writes only its own (row block, panel column) rectangle of `y`.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The element `offset` values past the start.
    ///
    /// # Safety
    /// `offset` must lie inside `y`.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(offset) }
    }
}

/// `y += x · Wᵀ` at `precision`, over rayon's pool when `parallel` (false inside a task of an
/// outer parallel loop). Panics when the operands do not fit their slices (a caller's bug, not
/// input).
pub fn gemm(w: &dyn Weights, ops: Operands<'_>, parallel: bool, precision: Precision) {
    let ((n, k), m) = (w.shape(), ops.m);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ops.ldx >= k
            && ops.ldy >= n
            && (m - 1) * ops.ldx + k <= ops.x.len()
            && (m - 1) * ops.ldy + n <= ops.y.len(),
        "gemm operands: x {m}x{k} in {} at {}, y {m}x{n} in {} at {}",
        ops.x.len(),
        ops.ldx,
        ops.y.len(),
        ops.ldy
    );
    match precision {
        Precision::F32 => gemm_f32(w, ops, parallel),
        Precision::Bf16 if precision.native() => gemm_pairs(w, ops, parallel),
        Precision::Bf16 => {
            // The same rounding, then the f32 tiles.
            let mut x = vec![0.0f32; m * k];
            let round = |(i, row): (usize, &mut [f32])| {
                for (v, s) in row.iter_mut().zip(&ops.x[i * ops.ldx..i * ops.ldx + k]) {
                    *v = round_bf16(*s);
                }
            };
            if parallel {
                x.par_chunks_mut(k.max(1)).enumerate().for_each(round);
            } else {
                x.chunks_mut(k.max(1)).enumerate().for_each(round);
            }
            let rounded = Operands {
                x: &x,
                m,
                ldx: k,
                y: ops.y,
                ldy: ops.ldy,
            };
            gemm_f32(&Rounded(w), rounded, parallel);
        }
    }
}

/// The tasks of a product: (first row, first output) of each row block and panel column.
fn tasks(m: usize, n: usize) -> Vec<(usize, usize)> {
    (0..m.div_ceil(MC))
        .flat_map(|mb| (0..n.div_ceil(NB)).map(move |nb| (mb * MC, nb * NB)))
        .collect()
}

/// Runs `run` on every task, over rayon's pool when `parallel`.
fn for_tasks(
    tasks: &[(usize, usize)],
    parallel: bool,
    run: impl Fn(&(usize, usize)) + Sync + Send,
) {
    if parallel {
        tasks.par_iter().for_each(run);
    } else {
        tasks.iter().for_each(run);
    }
}

/// The f32 product (operands checked by [`gemm`]).
fn gemm_f32(w: &dyn Weights, ops: Operands<'_>, parallel: bool) {
    let ((n, k), m) = (w.shape(), ops.m);
    let path = Path::detect();
    let out = Out(ops.y.as_mut_ptr());
    let (x, ldx, ldy) = (ops.x, ops.ldx, ops.ldy);
    let run = |&(m0, n0): &(usize, usize)| {
        let mut own = Vec::new();
        if w.packed(n0, 0).is_none() {
            own = vec![0.0f32; PANEL];
        }
        let (mc, nc) = (MC.min(m - m0), NB.min(n - n0));
        for k0 in (0..k).step_by(KB) {
            let kc = KB.min(k - k0);
            let panel: &[f32] = match w.packed(n0, k0) {
                Some(p) => p,
                None => {
                    w.pack(n0, nc, k0, kc, &mut own);
                    &own
                }
            };
            for r0 in (0..mc).step_by(MR) {
                let rows = MR.min(mc - r0);
                let at = (m0 + r0) * ldx + k0;
                // SAFETY: the rectangle rows m0+r0.., columns n0..n0+nc lies inside `y` (checked
                // by `gemm`) and belongs to this task alone.
                let y = unsafe { out.at((m0 + r0) * ldy + n0) };
                let tile = Tile {
                    x: &x[at..],
                    ldx,
                    rows,
                    kc,
                    nc,
                };
                // SAFETY: as above; the kernels read `x` inside `tile.x` and `panel`.
                unsafe { path.tile(&tile, panel, y, ldy) };
            }
        }
    };
    for_tasks(&tasks(m, n), parallel, run);
}

/// The bf16 product on `vdpbf16ps` (operands checked by [`gemm`]; only where
/// [`Precision::native`] says so): `x` rounded to pairs once, then the tasks as in f32.
fn gemm_pairs(w: &dyn Weights, ops: Operands<'_>, parallel: bool) {
    let ((n, k), m) = (w.shape(), ops.m);
    let k2 = k.div_ceil(2);
    let mut xp = vec![0u32; m * k2];
    let src = ops.x;
    let convert = |(i, row): (usize, &mut [u32])| {
        row_pairs(&src[i * ops.ldx..i * ops.ldx + k], row);
    };
    if parallel {
        xp.par_chunks_mut(k2).enumerate().for_each(convert);
    } else {
        xp.chunks_mut(k2).enumerate().for_each(convert);
    }
    let out = Out(ops.y.as_mut_ptr());
    let ldy = ops.ldy;
    let xp = &xp;
    let run = |&(m0, n0): &(usize, usize)| {
        let mut own = Vec::new();
        if w.packed_pairs(n0, 0).is_none() {
            own = vec![0u32; PANEL / 2];
        }
        let (mc, nc) = (MC.min(m - m0), NB.min(n - n0));
        for k0 in (0..k).step_by(KB) {
            let kc = KB.min(k - k0);
            let panel: &[u32] = match w.packed_pairs(n0, k0) {
                Some(p) => p,
                None => {
                    w.pack_pairs(n0, nc, k0, kc, &mut own);
                    &own
                }
            };
            for r0 in (0..mc).step_by(MR) {
                let rows = MR.min(mc - r0);
                // SAFETY: as in `gemm_f32`.
                let y = unsafe { out.at((m0 + r0) * ldy + n0) };
                let tile = PairTile {
                    x: &xp[(m0 + r0) * k2 + k0 / 2..],
                    ldx: k2,
                    rows,
                    pairs: kc.div_ceil(2),
                    nc,
                };
                assert!(
                    rows <= MR
                        && tile.pairs <= KB / 2
                        && nc <= NB
                        && panel.len() >= PANEL / 2
                        && (rows - 1) * k2 + tile.pairs <= tile.x.len()
                );
                #[cfg(target_arch = "x86_64")]
                // SAFETY: native() found AVX-512-BF16; the assert bounds every read, `y`'s
                // rectangle is this task's.
                unsafe {
                    x86::tile_pairs(&tile, panel, y, ldy)
                };
            }
        }
    };
    for_tasks(&tasks(m, n), parallel, run);
}

/// One bf16 register tile's operands: `rows × pairs` of `x`'s pairs from its start, `nc`
/// outputs.
struct PairTile<'a> {
    x: &'a [u32],
    ldx: usize,
    rows: usize,
    pairs: usize,
    nc: usize,
}

/// One register tile's operands: `rows × kc` of `x` from its start, `nc` outputs.
struct Tile<'a> {
    x: &'a [f32],
    ldx: usize,
    rows: usize,
    kc: usize,
    nc: usize,
}

/// The instruction set the tiles run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Avx512,
    Avx2,
    Scalar,
}

impl Path {
    /// From the kernels' path ([`KernelPath::detect`], so `ONEBIT_KERNELS` picks a slower one
    /// here too), found once: attention calls a product per block of queries and head.
    fn detect() -> Path {
        static PATH: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *PATH.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if crate::matmul::path::avx512_floats() {
                return Path::Avx512;
            }
            match KernelPath::detect() {
                KernelPath::Scalar => Path::Scalar,
                _ => Path::Avx2,
            }
        })
    }

    /// `y[i][j] += Σ_t x[i][t] · panel[t][j]` for the tile.
    ///
    /// # Safety
    /// `y` must be valid for `rows` rows of `nc` values at stride `ldy`; the path's instructions
    /// must exist (as [`Path::detect`] ensures).
    unsafe fn tile(self, t: &Tile<'_>, panel: &[f32], y: *mut f32, ldy: usize) {
        assert!(
            t.rows <= MR
                && t.kc <= KB
                && t.nc <= NB
                && panel.len() >= KB * NB
                && (t.rows - 1) * t.ldx + t.kc <= t.x.len()
        );
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller's contract; the asserts above bound every read.
            Path::Avx512 => unsafe { x86::tile_512(t, panel, y, ldy) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Path::Avx2 => unsafe { x86::tile_avx2(t, panel, y, ldy) },
            // SAFETY: as above.
            _ => unsafe { tile_scalar(t, panel, y, ldy) },
        }
    }
}

/// The portable tile.
///
/// # Safety
/// As [`Path::tile`].
unsafe fn tile_scalar(t: &Tile<'_>, panel: &[f32], y: *mut f32, ldy: usize) {
    for i in 0..t.rows {
        let mut acc = [0.0f32; NB];
        for p in 0..t.kc {
            let xv = t.x[i * t.ldx + p];
            for (a, w) in acc.iter_mut().zip(&panel[p * NB..(p + 1) * NB]) {
                *a += xv * w;
            }
        }
        for (j, a) in acc.iter().enumerate().take(t.nc) {
            // SAFETY: the caller's contract on `y`.
            unsafe { *y.add(i * ldy + j) += a };
        }
    }
}

#[cfg(test)]
mod tests;
