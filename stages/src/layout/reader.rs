//! On-demand decoding of one tensor: a row block at a time, through the tile codecs, never the
//! whole tensor as f32. The dequant stage, the detector's data tests and the catalog's
//! `tensor_values` all read through here.

use half::{bf16, f16};

use super::{Layout, TensorLayout};
use crate::error::{Error, Result};
use crate::format::q4nx::Container;
use crate::format::tiles::{TileCodec, TileKind};

/// Decodes row blocks of one tiled tensor.
#[derive(Clone, Copy)]
pub struct TiledReader<'a> {
    data: &'a [u8],
    kind: TileKind,
    row_blocks: usize,
    col_tiles: usize,
}

impl<'a> TiledReader<'a> {
    /// A reader over `data` laid out as a `row_blocks × col_tiles` grid of `kind` tiles.
    pub fn new(
        data: &'a [u8],
        kind: TileKind,
        row_blocks: usize,
        col_tiles: usize,
    ) -> Result<Self> {
        let need = row_blocks * col_tiles * kind.bytes();
        if data.len() != need {
            return Err(Error::Internal(format!(
                "{kind} grid {row_blocks}x{col_tiles} needs {need} bytes, tensor has {}",
                data.len()
            )));
        }
        Ok(TiledReader {
            data,
            kind,
            row_blocks,
            col_tiles,
        })
    }

    /// The tile kind.
    pub fn kind(&self) -> TileKind {
        self.kind
    }

    /// Number of row blocks.
    pub fn row_blocks(&self) -> usize {
        self.row_blocks
    }

    /// Number of column tiles.
    pub fn col_tiles(&self) -> usize {
        self.col_tiles
    }

    /// Padded row width: column tiles × tile columns.
    pub fn padded_k(&self) -> usize {
        self.col_tiles * self.kind.cols()
    }

    /// The bytes of tile (rb, cb): tile number `rb·CT + cb` (q4nx-format §4).
    pub fn tile(&self, rb: usize, cb: usize) -> &'a [u8] {
        let w = self.kind.bytes();
        let i = rb * self.col_tiles + cb;
        &self.data[i * w..(i + 1) * w]
    }

    /// Decodes row block `rb` into `out` as `R × padded_k` row-major values. `scratch` holds one
    /// tile's output and is reused.
    pub fn decode_row_block(&self, rb: usize, out: &mut Vec<f32>, scratch: &mut Vec<f32>) {
        let (r_, c_) = (self.kind.rows(), self.kind.cols());
        let kp = self.padded_k();
        out.resize(r_ * kp, 0.0);
        scratch.resize(r_ * c_, 0.0);
        for cb in 0..self.col_tiles {
            self.kind.decode(self.tile(rb, cb), scratch);
            for r in 0..r_ {
                out[r * kp + cb * c_..r * kp + (cb + 1) * c_]
                    .copy_from_slice(&scratch[r * c_..(r + 1) * c_]);
            }
        }
    }
}

/// Yields the logical rows of any tensor (plain or tiled) in blocks, cropped to (rows, K).
pub struct TensorRows<'a> {
    layout: &'a TensorLayout,
    data: &'a [u8],
}

impl<'a> TensorRows<'a> {
    /// A row reader for `layout` over the container's bytes.
    pub fn new(container: &'a Container, layout: &'a TensorLayout) -> Result<Self> {
        let info = container
            .tensor(&layout.name)
            .ok_or_else(|| Error::Internal(format!("no tensor {}", layout.name)))?;
        Ok(TensorRows {
            layout,
            data: container.data(info),
        })
    }

    /// Rows per block (the tile height, or 32 for plain tensors).
    pub fn block_rows(&self) -> usize {
        match &self.layout.layout {
            Layout::Tiled { kind, .. } => kind.rows(),
            Layout::Plain => 32,
            Layout::MmBlock { block, .. } => block.mm_n as usize,
        }
    }

    /// Number of row blocks.
    pub fn blocks(&self) -> usize {
        (self.layout.rows as usize).div_ceil(self.block_rows())
    }

    /// Decodes block `b`: returns the logical rows it covers (≤ block_rows) as `n × K` values in
    /// `out`, and the padded values (pad columns and pad rows) in `pad`.
    pub fn block(
        &self,
        b: usize,
        out: &mut Vec<f32>,
        pad: &mut Vec<f32>,
        scratch: &mut Vec<f32>,
    ) -> usize {
        let rows = self.layout.rows as usize;
        let k = self.layout.k as usize;
        let br = self.block_rows();
        let r0 = b * br;
        let n = br.min(rows.saturating_sub(r0));
        out.clear();
        pad.clear();
        match &self.layout.layout {
            Layout::Tiled {
                kind,
                row_blocks,
                col_tiles,
                ..
            } => {
                let reader = match TiledReader::new(
                    self.data,
                    *kind,
                    *row_blocks as usize,
                    *col_tiles as usize,
                ) {
                    Ok(r) => r,
                    Err(_) => return 0,
                };
                let mut full = Vec::new();
                reader.decode_row_block(b, &mut full, scratch);
                let kp = reader.padded_k();
                for r in 0..br {
                    let row = &full[r * kp..(r + 1) * kp];
                    if r < n {
                        out.extend_from_slice(&row[..k]);
                        pad.extend_from_slice(&row[k..]);
                    } else {
                        pad.extend_from_slice(row);
                    }
                }
            }
            Layout::Plain => self.plain_rows(r0, r0 + n, out),
            Layout::MmBlock {
                block, padded_k, ..
            } => {
                let blocks_k = padded_k / block.mm_k;
                let mut row = Vec::new();
                for r in r0..r0 + br {
                    block.read_row(self.data, blocks_k, r as u64, &mut row);
                    if r < r0 + n {
                        out.extend_from_slice(&row[..k.min(row.len())]);
                        pad.extend_from_slice(&row[k.min(row.len())..]);
                    } else {
                        pad.extend_from_slice(&row);
                    }
                }
            }
        }
        n
    }

    /// Appends the logical rows `[r0, r1)` of a plain tensor (BF16, F16 or F32) to `out`;
    /// nothing for a tiled one or rows past the end.
    pub fn plain_rows(&self, r0: usize, r1: usize, out: &mut Vec<f32>) {
        if self.layout.layout != Layout::Plain || r1 > self.layout.rows as usize || r0 > r1 {
            return;
        }
        let k = self.layout.k as usize;
        let dtype = self.layout.dtype.as_str();
        let size = match dtype {
            "F32" => 4,
            _ => 2,
        };
        let Some(bytes) = self.data.get(r0 * k * size..r1 * k * size) else {
            return;
        };
        out.extend(bytes.chunks_exact(size).map(|ch| match dtype {
            "F32" => f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]),
            "F16" => f16::from_le_bytes([ch[0], ch[1]]).to_f32(),
            _ => bf16::from_le_bytes([ch[0], ch[1]]).to_f32(),
        }));
    }
}

impl TensorRows<'_> {
    /// Like [`TensorRows::block`], but the values of the block come in no particular order (tile
    /// by tile, column-major): the fast path for order-free consumers such as statistics. Returns
    /// the number of logical rows in the block.
    pub fn block_unordered(
        &self,
        b: usize,
        out: &mut Vec<f32>,
        pad: &mut Vec<f32>,
        scratch: &mut Vec<f32>,
    ) -> usize {
        let Layout::Tiled {
            kind,
            row_blocks,
            col_tiles,
            ..
        } = self.layout.layout
        else {
            return self.block(b, out, pad, scratch);
        };
        let Ok(reader) = TiledReader::new(self.data, kind, row_blocks as usize, col_tiles as usize)
        else {
            return 0;
        };
        let (r_, c_) = (kind.rows(), kind.cols());
        let rows = self.layout.rows as usize;
        let k = self.layout.k as usize;
        let n = r_.min(rows.saturating_sub(b * r_));
        out.clear();
        pad.clear();
        scratch.resize(r_ * c_, 0.0);
        for cb in 0..col_tiles as usize {
            kind.decode_cols(reader.tile(b, cb), scratch);
            let live_cols = k.saturating_sub(cb * c_).min(c_);
            for c in 0..c_ {
                let col = &scratch[c * r_..(c + 1) * r_];
                if c < live_cols {
                    out.extend_from_slice(&col[..n]);
                    pad.extend_from_slice(&col[n..]);
                } else {
                    pad.extend_from_slice(col);
                }
            }
        }
        n
    }
}
