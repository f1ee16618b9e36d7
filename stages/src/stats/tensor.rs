//! Statistics of one tensor as the dequant stage tables them: moments of its values, of the pad
//! (which must be zero), of the scales and zero-points, and per row block. Tensors are streamed a
//! row block at a time (rayon across blocks); values are never materialized whole.

use rayon::prelude::*;

use super::Moments;
use crate::error::{Error, Result};
use crate::format::q4nx::Container;
use crate::layout::reader::{TensorRows, TiledReader};
use crate::layout::{Layout, TensorLayout};

/// Statistics of one row block.
#[derive(Clone, Debug)]
pub struct BlockStat {
    /// Block index.
    pub block: u64,
    /// First logical row.
    pub row0: u64,
    /// Logical rows in the block.
    pub rows: u64,
    /// Moments of its values.
    pub values: Moments,
}

/// Statistics of one tensor.
#[derive(Clone, Debug)]
pub struct TensorStat {
    /// Tensor name.
    pub name: String,
    /// Moments of the logical values.
    pub values: Moments,
    /// Moments of the pad values (pad columns and pad rows; all must be 0).
    pub pad: Moments,
    /// Moments of the scales `d` of the logical (row, group) slots.
    pub scales: Moments,
    /// Moments of the zero-points `m`, for kinds with one.
    pub zeros: Moments,
    /// Per-block statistics.
    pub blocks: Vec<BlockStat>,
}

/// Computes the statistics of one tensor.
pub fn tensor_stats(container: &Container, layout: &TensorLayout) -> Result<TensorStat> {
    let rows = TensorRows::new(container, layout)?;
    let per_block: Vec<(BlockStat, Moments)> = (0..rows.blocks())
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(out, pad, scratch), b| {
                let n = rows.block_unordered(b, out, pad, scratch);
                let mut m = Moments::default();
                m.extend(out);
                let mut p = Moments::default();
                p.extend(pad);
                (
                    BlockStat {
                        block: b as u64,
                        row0: (b * rows.block_rows()) as u64,
                        rows: n as u64,
                        values: m,
                    },
                    p,
                )
            },
        )
        .collect();
    let mut values = Moments::default();
    let mut pad = Moments::default();
    let mut blocks = Vec::with_capacity(per_block.len());
    for (b, p) in per_block {
        values.merge(&b.values);
        pad.merge(&p);
        blocks.push(b);
    }
    let (mut scales, mut zeros) = (Moments::default(), Moments::default());
    if let Layout::Tiled {
        kind,
        row_blocks,
        col_tiles,
        ..
    } = layout.layout
    {
        let info = container
            .tensor(&layout.name)
            .ok_or_else(|| Error::Internal(format!("no tensor {}", layout.name)))?;
        let reader = TiledReader::new(
            container.data(info),
            kind,
            row_blocks as usize,
            col_tiles as usize,
        )?;
        let groups_k = (layout.k as usize).div_ceil(32);
        for rb in 0..row_blocks as usize {
            for cb in 0..col_tiles as usize {
                let tile = reader.tile(rb, cb);
                for g in 0..kind.cols() / 32 {
                    if cb * kind.cols() / 32 + g >= groups_k {
                        break;
                    }
                    for r in 0..kind.rows() {
                        if (rb * kind.rows() + r) as u64 >= layout.rows {
                            break;
                        }
                        let (d, m) = kind.layout().scale_and_zero(tile, r, g);
                        scales.push(d);
                        if let Some(m) = m {
                            zeros.push(m);
                        }
                    }
                }
            }
        }
    }
    Ok(TensorStat {
        name: layout.name.clone(),
        values,
        pad,
        scales,
        zeros,
        blocks,
    })
}
