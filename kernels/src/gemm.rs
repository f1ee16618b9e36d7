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
//! Why not a crate: `matrixmultiply` (the earlier path, kept as the benchmark's baseline) runs
//! AVX2 kernels only and needs `W` in f32 (1.6 GB for Gemma 3 4B's tower instead of the
//! mapping's 0.8 GB); `gemm` has AVX-512 kernels but no bf16 and no blocked layouts. The panel
//! copy is where both are solved, so it is ours; the arithmetic around it is the textbook one.

use onebit_pack::mm_block::MmBlock;
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

/// The right-hand operand `W` (`n × k`) of `y += x · Wᵀ`, as a source of panels.
pub trait Weights: Sync {
    /// `(n, k)`: outputs (rows of `W`) and inputs (its columns).
    fn shape(&self) -> (usize, usize);
    /// `panel[t·NB + j] = W(n0 + j, k0 + t)` for `j < nc`, `t < kc` (`kc ≤ KB` and `k0` a
    /// multiple of `KB`); columns `nc..NB` are zero.
    fn pack(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [f32]);

    /// The panel at `(n0, k0)` already packed, where the source keeps them ([`Packed`]).
    fn packed(&self, _n0: usize, _k0: usize) -> Option<&[f32]> {
        None
    }
}

/// A matrix packed once into every panel, for a right operand many products read (attention's
/// keys and values are read by every block of queries).
pub struct Packed {
    n: usize,
    k: usize,
    panels: Vec<f32>,
}

impl Packed {
    /// Packs all of `w` (`⌈n/NB⌉·⌈k/KB⌉` panels of `KB × NB` values).
    pub fn new(w: &dyn Weights) -> Packed {
        let (n, k) = w.shape();
        let (bn, bk) = (n.div_ceil(NB), k.div_ceil(KB));
        let mut panels = vec![0.0f32; bn * bk * KB * NB];
        for (i, panel) in panels.chunks_mut(KB * NB).enumerate() {
            let (n0, k0) = ((i / bk) * NB, (i % bk) * KB);
            w.pack(n0, NB.min(n - n0), k0, KB.min(k - k0), panel);
        }
        Packed { n, k, panels }
    }
}

impl Weights for Packed {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn pack(&self, n0: usize, _nc: usize, k0: usize, _kc: usize, panel: &mut [f32]) {
        if let Some(p) = self.packed(n0, k0) {
            panel.copy_from_slice(p);
        }
    }
    fn packed(&self, n0: usize, k0: usize) -> Option<&[f32]> {
        let i = (n0 / NB) * self.k.div_ceil(KB) + k0 / KB;
        self.panels.get(i * KB * NB..(i + 1) * KB * NB)
    }
}

/// bf16 bytes (little-endian) widened to f32.
fn widen(b: &[u8]) -> f32 {
    half::bf16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// The packing of a source that stores `W`'s rows: row `j` of the panel's `nc` (its `kc`
/// values, from `row(j)`) goes down column `j`; the other columns are zero.
fn transpose_rows<I: Iterator<Item = f32>>(panel: &mut [f32], nc: usize, row: impl Fn(usize) -> I) {
    panel.fill(0.0);
    for j in 0..nc {
        for (t, v) in row(j).enumerate() {
            panel[t * NB + j] = v;
        }
    }
}

/// A bf16 matrix in a tower's MM blocks (`onebit_pack::mm_block`), read from its bytes.
pub struct Bf16Blocked<'a> {
    /// The tensor's bytes (the declared shape's `blocks_n × blocks_k × block` bf16 values).
    pub bytes: &'a [u8],
    /// The block geometry.
    pub block: MmBlock,
    /// Column blocks of the declared shape.
    pub blocks_k: usize,
    /// Outputs of the logical matrix (the padding beyond is never read).
    pub n: usize,
    /// Inputs of the logical matrix.
    pub k: usize,
}

impl Weights for Bf16Blocked<'_> {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn pack(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [f32]) {
        panel.fill(0.0);
        for j in 0..nc {
            // A panel's depth lies inside one block: row `n0 + j`'s values are contiguous there.
            let at = self
                .block
                .index(self.blocks_k as u64, (n0 + j) as u64, k0 as u64)
                as usize
                * 2;
            let row = &self.bytes[at..at + 2 * kc];
            for (t, b) in row.chunks_exact(2).enumerate() {
                panel[t * NB + j] = widen(b);
            }
        }
    }
}

/// A row-major bf16 matrix (`n × k`), read from its bytes.
pub struct Bf16Rows<'a> {
    /// `n·k` bf16 values.
    pub bytes: &'a [u8],
    /// Outputs.
    pub n: usize,
    /// Inputs.
    pub k: usize,
}

impl Weights for Bf16Rows<'_> {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn pack(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [f32]) {
        transpose_rows(panel, nc, |j| {
            let at = ((n0 + j) * self.k + k0) * 2;
            self.bytes[at..at + 2 * kc].chunks_exact(2).map(widen)
        });
    }
}

/// f32 rows: `W(j, t) = data[j·stride + t]` (attention's keys, one head's columns of each row).
pub struct F32Rows<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Outputs.
    pub n: usize,
    /// Inputs.
    pub k: usize,
    /// Distance between two rows' starts.
    pub stride: usize,
}

impl Weights for F32Rows<'_> {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn pack(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [f32]) {
        transpose_rows(panel, nc, |j| {
            let at = (n0 + j) * self.stride + k0;
            self.data[at..at + kc].iter().copied()
        });
    }
}

/// f32 columns: `W(j, t) = data[t·stride + j]` (attention's values: the product `P · V` reads
/// `V`'s rows as inputs).
pub struct F32Cols<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Outputs (columns of `data` used).
    pub n: usize,
    /// Inputs (rows of `data`).
    pub k: usize,
    /// Distance between two rows' starts.
    pub stride: usize,
}

impl Weights for F32Cols<'_> {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn pack(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [f32]) {
        for t in 0..kc {
            let at = (k0 + t) * self.stride + n0;
            let dst = &mut panel[t * NB..(t + 1) * NB];
            dst[..nc].copy_from_slice(&self.data[at..at + nc]);
            dst[nc..].fill(0.0);
        }
    }
}

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

/// `y += x · Wᵀ`, over rayon's pool when `parallel` (false inside a task of an outer parallel
/// loop). Panics when the operands do not fit their slices (a caller's bug, not input).
pub fn gemm(w: &dyn Weights, ops: Operands<'_>, parallel: bool) {
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
    let path = Path::detect();
    let tasks: Vec<(usize, usize)> = (0..m.div_ceil(MC))
        .flat_map(|mb| (0..n.div_ceil(NB)).map(move |nb| (mb * MC, nb * NB)))
        .collect();
    let out = Out(ops.y.as_mut_ptr());
    let (x, ldx, ldy) = (ops.x, ops.ldx, ops.ldy);
    let run = |&(m0, n0): &(usize, usize)| {
        let mut own = Vec::new();
        if w.packed(n0, 0).is_none() {
            own = vec![0.0f32; KB * NB];
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
                // above) and belongs to this task alone.
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
    if parallel {
        tasks.par_iter().for_each(run);
    } else {
        tasks.iter().for_each(run);
    }
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NB, Tile};

    /// AVX-512: `MR` rows × up to four 16-lane vectors of outputs in registers.
    ///
    /// # Safety
    /// As [`super::Path::tile`], on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_512(t: &Tile<'_>, panel: &[f32], y: *mut f32, ldy: usize) {
        // SAFETY: the caller's contract; each call gets the tile's own rows and outputs.
        unsafe {
            match (t.rows, t.nc.div_ceil(16)) {
                (6, 4) => rows_512::<6, 4>(t, panel, y, ldy),
                (6, 3) => rows_512::<6, 3>(t, panel, y, ldy),
                (6, 2) => rows_512::<6, 2>(t, panel, y, ldy),
                (6, _) => rows_512::<6, 1>(t, panel, y, ldy),
                (r, v) => {
                    // Fewer rows than a tile: one row at a time (the last tile of a block).
                    for i in 0..r {
                        let one = Tile {
                            x: &t.x[i * t.ldx..],
                            ldx: t.ldx,
                            rows: 1,
                            kc: t.kc,
                            nc: t.nc,
                        };
                        let yi = y.add(i * ldy);
                        match v {
                            4 => rows_512::<1, 4>(&one, panel, yi, ldy),
                            3 => rows_512::<1, 3>(&one, panel, yi, ldy),
                            2 => rows_512::<1, 2>(&one, panel, yi, ldy),
                            _ => rows_512::<1, 1>(&one, panel, yi, ldy),
                        }
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rows_512<const R: usize, const V: usize>(
        t: &Tile<'_>,
        panel: &[f32],
        y: *mut f32,
        ldy: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let x = t.x.as_ptr();
        let p = panel.as_ptr();
        for k in 0..t.kc {
            // SAFETY: k < kc ≤ KB, so the panel row is inside `panel`; x rows checked by the
            // caller's assert.
            unsafe {
                let mut w = [_mm512_setzero_ps(); V];
                for (v, wv) in w.iter_mut().enumerate() {
                    *wv = _mm512_loadu_ps(p.add(k * NB + 16 * v));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_ps(*x.add(i * t.ldx + k));
                    for (a, wv) in row.iter_mut().zip(&w) {
                        *a = _mm512_fmadd_ps(xv, *wv, *a);
                    }
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, a) in row.iter().enumerate() {
                let c = 16 * v;
                if c >= t.nc {
                    break;
                }
                let left = t.nc - c;
                let mask: __mmask16 = if left >= 16 { 0xffff } else { (1 << left) - 1 };
                // SAFETY: columns c.. c+16 masked to the tile's `nc`, rows < R = the tile's.
                unsafe {
                    let at = y.add(i * ldy + c);
                    let old = _mm512_maskz_loadu_ps(mask, at);
                    _mm512_mask_storeu_ps(at, mask, _mm512_add_ps(old, *a));
                }
            }
        }
    }

    /// AVX2 + FMA: the panel in passes of 16 outputs, `MR` rows × two 8-lane vectors each.
    ///
    /// # Safety
    /// As [`super::Path::tile`], on a CPU with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_avx2(t: &Tile<'_>, panel: &[f32], y: *mut f32, ldy: usize) {
        let x = t.x.as_ptr();
        let p = panel.as_ptr();
        for c in (0..t.nc).step_by(16) {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            for k in 0..t.kc {
                // SAFETY: as in `rows_512`; the panel is NB = 64 wide, c + 16 ≤ 64.
                unsafe {
                    let w0 = _mm256_loadu_ps(p.add(k * NB + c));
                    let w1 = _mm256_loadu_ps(p.add(k * NB + c + 8));
                    for (i, row) in acc.iter_mut().enumerate().take(t.rows) {
                        let xv = _mm256_set1_ps(*x.add(i * t.ldx + k));
                        row[0] = _mm256_fmadd_ps(xv, w0, row[0]);
                        row[1] = _mm256_fmadd_ps(xv, w1, row[1]);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate().take(t.rows) {
                let mut lanes = [0.0f32; 16];
                // SAFETY: `lanes` holds 16 values.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), row[0]);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), row[1]);
                }
                for (j, v) in lanes.iter().enumerate().take(t.nc - c) {
                    // SAFETY: column c + j < nc, row i < rows.
                    unsafe { *y.add(i * ldy + c + j) += v };
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
