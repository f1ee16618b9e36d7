//! Where each tensor's numbers are in the bytes: the config geometry ([`geometry`]), tile-kind
//! detection with evidence ([`detect`]), and the on-demand row reader ([`reader`]). The types
//! both detection and reading use live here, so the two never import each other.

pub mod detect;
pub mod geometry;
pub mod reader;

/// The towers' MM-block layout, from the pack crate (the runtime reads it too).
pub use onebit_pack::mm_block;

use serde::{Deserialize, Serialize};

use crate::format::tiles::{Codes, TileKind};
use mm_block::MmBlock;

/// How a tensor's bytes are laid out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "layout", rename_all = "snake_case")]
pub enum Layout {
    /// Row-major BF16/F16/F32 with the declared shape.
    Plain,
    /// A grid of tiles, row-block major.
    Tiled {
        /// The tile kind.
        kind: TileKind,
        /// Row blocks (RB).
        row_blocks: u64,
        /// Column tiles (CT).
        col_tiles: u64,
        /// RB × R.
        padded_rows: u64,
        /// CT × C.
        padded_k: u64,
    },
    /// A tower's bf16 projection in MM blocks ([`mm_block`]), zero-padded.
    MmBlock {
        /// The block geometry.
        block: MmBlock,
        /// Rows with the padding (N').
        padded_rows: u64,
        /// Row width with the padding (K').
        padded_k: u64,
    },
}

/// One reading weighed by a data test.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// The kind read.
    pub kind: TileKind,
    /// The test (e.g. "tie test vs model.embed_tokens.weight, 4 row blocks").
    pub test: String,
    /// Its correlation with the reference.
    pub corr: f64,
}

/// The detector's decision for one tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorLayout {
    /// Tensor name.
    pub name: String,
    /// Declared dtype.
    pub dtype: String,
    /// Declared shape.
    pub shape: Vec<u64>,
    /// Bytes of data.
    pub bytes: u64,
    /// Layer index, for layer weights.
    pub layer: Option<u32>,
    /// Role from the name (`q_proj`, `lm_head`, ...).
    pub role: String,
    /// The layout decided.
    pub layout: Layout,
    /// Logical rows.
    pub rows: u64,
    /// Logical K (row width).
    pub k: u64,
    /// How codes become numbers, for tiled tensors.
    pub codes: Option<Codes>,
    /// `kind=... <- ...` with the reasons.
    pub decision: String,
    /// Readings weighed by data tests, when any.
    pub readings: Vec<Reading>,
    /// Conditions that verification must flag (e.g. the broken-conversion signature).
    pub flags: Vec<String>,
}

impl TensorLayout {
    /// What the `tensors` table and the verification call the reading: the tile kind, `plain`, or
    /// `mm_block_256x64`.
    pub fn reading(&self) -> String {
        match self.layout {
            Layout::Tiled { kind, .. } => kind.name().to_string(),
            Layout::Plain => "plain".into(),
            Layout::MmBlock { block, .. } => format!("mm_block_{}", block.name()),
        }
    }

    /// The tile kind, for tiled tensors.
    pub fn kind(&self) -> Option<TileKind> {
        match self.layout {
            Layout::Tiled { kind, .. } => Some(kind),
            Layout::Plain | Layout::MmBlock { .. } => None,
        }
    }
}
