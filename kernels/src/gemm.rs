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

    /// The bf16 panel: `panel[p·NB + j]` holds `W(n0 + j, k0 + 2p)` in its low half and
    /// `W(n0 + j, k0 + 2p + 1)` in its high half, each rounded to bf16; pairs past `kc` and
    /// columns past `nc` are zero. By default [`Weights::pack`] rounded; bf16 sources copy bits.
    fn pack_pairs(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [u32]) {
        let mut wide = vec![0.0f32; KB * NB];
        self.pack(n0, nc, k0, kc, &mut wide);
        pairs_of_panel(&wide, kc, panel);
    }

    /// The bf16 panel at `(n0, k0)` already packed, where the source keeps them.
    fn packed_pairs(&self, _n0: usize, _k0: usize) -> Option<&[u32]> {
        None
    }
}

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
fn bf16_native() -> bool {
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
fn bf16_bits(v: f32) -> u32 {
    u32::from(half::bf16::from_f32(v).to_bits())
}

/// `v` rounded to bf16, widened back.
fn round_bf16(v: f32) -> f32 {
    f32::from_bits(bf16_bits(v) << 16)
}

/// An f32 panel's values as a bf16 panel of `kc` inputs (see [`Weights::pack_pairs`]).
fn pairs_of_panel(wide: &[f32], kc: usize, panel: &mut [u32]) {
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
fn row_pairs(row: &[f32], out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if bf16_native() {
        // SAFETY: bf16_native() found AVX-512-BF16; the lengths are checked inside.
        unsafe { x86::row_pairs_512(row, out) };
        return;
    }
    for (p, o) in out.iter_mut().enumerate() {
        let lo = bf16_bits(row[2 * p]);
        let hi = row.get(2 * p + 1).map_or(0, |v| bf16_bits(*v));
        *o = lo | (hi << 16);
    }
}

/// A matrix packed once into every panel, for a right operand many products read (attention's
/// keys and values are read by every block of queries).
pub struct Packed {
    n: usize,
    k: usize,
    panels: Panels,
}

/// A [`Packed`] matrix's panels, in the form its products read.
enum Panels {
    F32(Vec<f32>),
    Pairs(Vec<u32>),
}

/// Values of an f32 panel; a bf16 panel holds half as many `u32`s.
const PANEL: usize = KB * NB;

impl Packed {
    /// Packs all of `w` (`⌈n/NB⌉·⌈k/KB⌉` panels) for products at `precision`: bf16 pairs where
    /// that precision is native, f32 otherwise. A product at the other precision still reads it
    /// right, through a conversion per panel.
    pub fn new(w: &dyn Weights, precision: Precision) -> Packed {
        let (n, k) = w.shape();
        let (bn, bk) = (n.div_ceil(NB), k.div_ceil(KB));
        let at = |i: usize| ((i / bk) * NB, (i % bk) * KB);
        let panels = if precision == Precision::Bf16 && precision.native() {
            let mut panels = vec![0u32; bn * bk * PANEL / 2];
            for (i, panel) in panels.chunks_mut(PANEL / 2).enumerate() {
                let (n0, k0) = at(i);
                w.pack_pairs(n0, NB.min(n - n0), k0, KB.min(k - k0), panel);
            }
            Panels::Pairs(panels)
        } else {
            let mut panels = vec![0.0f32; bn * bk * PANEL];
            for (i, panel) in panels.chunks_mut(PANEL).enumerate() {
                let (n0, k0) = at(i);
                w.pack(n0, NB.min(n - n0), k0, KB.min(k - k0), panel);
            }
            Panels::F32(panels)
        };
        Packed { n, k, panels }
    }

    /// The index of the panel at `(n0, k0)`.
    fn index(&self, n0: usize, k0: usize) -> usize {
        (n0 / NB) * self.k.div_ceil(KB) + k0 / KB
    }
}

impl Weights for Packed {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn pack(&self, n0: usize, _nc: usize, k0: usize, _kc: usize, panel: &mut [f32]) {
        let i = self.index(n0, k0);
        match &self.panels {
            Panels::F32(p) => panel.copy_from_slice(&p[i * PANEL..(i + 1) * PANEL]),
            Panels::Pairs(p) => {
                for (t, pairs) in p[i * PANEL / 2..(i + 1) * PANEL / 2]
                    .chunks_exact(NB)
                    .enumerate()
                {
                    for (j, v) in pairs.iter().enumerate() {
                        panel[2 * t * NB + j] = f32::from_bits(v << 16);
                        panel[(2 * t + 1) * NB + j] = f32::from_bits(v & 0xffff_0000);
                    }
                }
            }
        }
    }
    fn pack_pairs(&self, n0: usize, _nc: usize, k0: usize, kc: usize, panel: &mut [u32]) {
        let i = self.index(n0, k0);
        match &self.panels {
            Panels::F32(p) => pairs_of_panel(&p[i * PANEL..(i + 1) * PANEL], kc, panel),
            Panels::Pairs(p) => panel.copy_from_slice(&p[i * PANEL / 2..(i + 1) * PANEL / 2]),
        }
    }
    fn packed(&self, n0: usize, k0: usize) -> Option<&[f32]> {
        let i = self.index(n0, k0);
        match &self.panels {
            Panels::F32(p) => p.get(i * PANEL..(i + 1) * PANEL),
            Panels::Pairs(_) => None,
        }
    }
    fn packed_pairs(&self, n0: usize, k0: usize) -> Option<&[u32]> {
        let i = self.index(n0, k0);
        match &self.panels {
            Panels::Pairs(p) => p.get(i * PANEL / 2..(i + 1) * PANEL / 2),
            Panels::F32(_) => None,
        }
    }
}

/// A source whose panels are rounded to bf16: the emulated [`Precision::Bf16`] on the f32 tiles.
struct Rounded<'a>(&'a dyn Weights);

impl Weights for Rounded<'_> {
    fn shape(&self) -> (usize, usize) {
        self.0.shape()
    }
    fn pack(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [f32]) {
        self.0.pack(n0, nc, k0, kc, panel);
        for v in panel.iter_mut() {
            *v = round_bf16(*v);
        }
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

/// The bf16 packing of a source that stores `W`'s rows as bf16 bytes: row `j`'s `kc` values
/// (`2·kc` bytes from `row(j)`), two at a time, go down column `j` bit for bit.
fn transpose_pairs<'b>(panel: &mut [u32], nc: usize, kc: usize, row: impl Fn(usize) -> &'b [u8]) {
    panel.fill(0);
    for j in 0..nc {
        let bytes = row(j);
        for (p, two) in bytes.chunks(4).enumerate() {
            let mut le = [0u8; 4];
            le[..two.len()].copy_from_slice(two);
            panel[p * NB + j] = u32::from_le_bytes(le);
        }
        debug_assert!(bytes.len() == 2 * kc);
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
    fn pack_pairs(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [u32]) {
        transpose_pairs(panel, nc, kc, |j| {
            let at = self
                .block
                .index(self.blocks_k as u64, (n0 + j) as u64, k0 as u64)
                as usize
                * 2;
            &self.bytes[at..at + 2 * kc]
        });
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
    fn pack_pairs(&self, n0: usize, nc: usize, k0: usize, kc: usize, panel: &mut [u32]) {
        transpose_pairs(panel, nc, kc, |j| {
            let at = ((n0 + j) * self.k + k0) * 2;
            &self.bytes[at..at + 2 * kc]
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NB, PairTile, Tile};

    /// `row`'s values rounded to bf16 pairs into `out` (`⌈len/2⌉` of them), 32 at a time.
    ///
    /// # Safety
    /// On a CPU with AVX-512F and AVX-512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn row_pairs_512(row: &[f32], out: &mut [u32]) {
        assert!(out.len() == row.len().div_ceil(2));
        let full = row.len() / 32;
        for c in 0..full {
            // SAFETY: 32 values from 32·c are inside `row`, 16 pairs from 16·c inside `out`.
            unsafe {
                let lo = _mm512_loadu_ps(row.as_ptr().add(32 * c));
                let hi = _mm512_loadu_ps(row.as_ptr().add(32 * c + 16));
                let bh: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(out.as_mut_ptr().add(16 * c).cast(), bh);
            }
        }
        let rest = &row[32 * full..];
        let mut padded = [0.0f32; 32];
        padded[..rest.len()].copy_from_slice(rest);
        let mut pairs = [0u32; 16];
        // SAFETY: both buffers hold a whole vector.
        unsafe {
            let lo = _mm512_loadu_ps(padded.as_ptr());
            let hi = _mm512_loadu_ps(padded.as_ptr().add(16));
            let bh: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(pairs.as_mut_ptr().cast(), bh);
        }
        let left = out.len() - 16 * full;
        out[16 * full..].copy_from_slice(&pairs[..left]);
    }

    /// AVX-512-BF16: `MR` rows × up to four 16-lane vectors of outputs, two inputs a step.
    ///
    /// # Safety
    /// As [`super::Path::tile`] for `t`'s bounds, on a CPU with AVX-512F and AVX-512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn tile_pairs(t: &PairTile<'_>, panel: &[u32], y: *mut f32, ldy: usize) {
        // SAFETY: the caller's contract; each call gets the tile's own rows and outputs.
        unsafe {
            match (t.rows, t.nc.div_ceil(16)) {
                (6, 4) => rows_pairs::<6, 4>(t, panel, y, ldy),
                (6, 3) => rows_pairs::<6, 3>(t, panel, y, ldy),
                (6, 2) => rows_pairs::<6, 2>(t, panel, y, ldy),
                (6, _) => rows_pairs::<6, 1>(t, panel, y, ldy),
                (r, v) => {
                    for i in 0..r {
                        let one = PairTile {
                            x: &t.x[i * t.ldx..],
                            ldx: t.ldx,
                            rows: 1,
                            pairs: t.pairs,
                            nc: t.nc,
                        };
                        let yi = y.add(i * ldy);
                        match v {
                            4 => rows_pairs::<1, 4>(&one, panel, yi, ldy),
                            3 => rows_pairs::<1, 3>(&one, panel, yi, ldy),
                            2 => rows_pairs::<1, 2>(&one, panel, yi, ldy),
                            _ => rows_pairs::<1, 1>(&one, panel, yi, ldy),
                        }
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn rows_pairs<const R: usize, const V: usize>(
        t: &PairTile<'_>,
        panel: &[u32],
        y: *mut f32,
        ldy: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let x = t.x.as_ptr();
        let p = panel.as_ptr();
        for k in 0..t.pairs {
            // SAFETY: k < pairs ≤ KB/2, so the panel row is inside `panel`; x rows checked by
            // the caller's assert.
            unsafe {
                let mut w: [__m512bh; V] = std::mem::zeroed();
                for (v, wv) in w.iter_mut().enumerate() {
                    *wv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        p.add(k * NB + 16 * v).cast(),
                    ));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let xv: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*x.add(i * t.ldx + k) as i32));
                    for (a, wv) in row.iter_mut().zip(&w) {
                        *a = _mm512_dpbf16_ps(*a, xv, *wv);
                    }
                }
            }
        }
        // SAFETY: the caller's contract on `y`.
        unsafe { store_rows(&acc, t.nc, y, ldy) };
    }

    /// Adds the accumulators into `y`'s rows, columns masked to `nc`.
    ///
    /// # Safety
    /// `y` valid for `R` rows of `nc` values at stride `ldy`; AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn store_rows<const R: usize, const V: usize>(
        acc: &[[__m512; V]; R],
        nc: usize,
        y: *mut f32,
        ldy: usize,
    ) {
        for (i, row) in acc.iter().enumerate() {
            for (v, a) in row.iter().enumerate() {
                let c = 16 * v;
                if c >= nc {
                    break;
                }
                let left = nc - c;
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
        // SAFETY: the caller's contract on `y`.
        unsafe { store_rows(&acc, t.nc, y, ldy) };
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
