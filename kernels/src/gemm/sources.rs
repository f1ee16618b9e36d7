//! The sources of a product's right operand `W`, each packing panels from where `W` lives.

use onebit_pack::mm_block::MmBlock;

use super::precision::{Precision, pairs_of_panel, round_bf16};
use super::{KB, NB, PANEL};

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
pub(super) struct Rounded<'a>(pub(super) &'a dyn Weights);

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
