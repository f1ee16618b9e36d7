//! The dequant stage: every tensor streamed through the tile codecs into the `tensors`,
//! `tensor_stats` and `block_stats` tables (Parquet), a row block at a time
//! ([`crate::stats::tensor`]).
//!
//! The tables carry no pack name: an entry is content-addressed and may serve several packs. The
//! catalog adds the `pack` column from the refs that point at the entry.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_array::builder::{
    BooleanBuilder, Float32Builder, Float64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_schema::{DataType, Field};
use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use super::{batch, write_tables};
use crate::error::Result;
use crate::format::q4nx::Container;
use crate::layout::{Layout, TensorLayout};
use crate::stats::tensor::{TensorStat, tensor_stats};

/// The dequant stage: statistics tables of every tensor .
pub struct DequantStage {
    pub(crate) extra: Vec<Input>,
    pub(crate) model: PathBuf,
}

impl DequantStage {
    /// The stage's name and version; the version is bumped whenever the tables written for the same
    /// input can change.
    pub const ID: StageId<'static> = StageId::new("dequant", 1);
}

impl Stage for DequantStage {
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![
            Input::external("model", &self.model),
            Input::artifact("layouts", "detect", "layouts.json"),
        ];
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["tables".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        write_dequant_tables(ctx)
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}

/// The dequant tables of the container at input `model` with the layouts at input `layouts`,
/// into output `tables`: the language file's stage and each tower's run this.
pub(crate) fn write_dequant_tables(ctx: &mut StageContext<'_>) -> Result<(), StageError> {
    {
        let container = Container::open(ctx.input("model")?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&fs_err::read(ctx.input("layouts")?)?)?;
        let total: u64 = layouts.iter().map(|l| l.bytes).sum();
        let mut done = 0;
        let mut stats = Vec::with_capacity(layouts.len());
        for l in &layouts {
            stats.push(tensor_stats(&container, l)?);
            done += l.bytes;
            ctx.progress(done, total);
        }
        write_tables(
            &ctx.output("tables"),
            &[
                ("tensors", tensors_table(&layouts)?),
                ("tensor_stats", tensor_stats_table(&stats)?),
                ("block_stats", block_stats_table(&stats)?),
            ],
        )?;
        Ok(())
    }
}

/// The `tensors` table: one row per tensor with its detected layout and evidence.
pub fn tensors_table(layouts: &[TensorLayout]) -> Result<RecordBatch> {
    let mut name = StringBuilder::new();
    let mut layer = UInt32Builder::new();
    let mut role = StringBuilder::new();
    let mut dtype = StringBuilder::new();
    let mut shape = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut rows = UInt64Builder::new();
    let mut k = UInt64Builder::new();
    let mut padded_k = UInt64Builder::new();
    let mut tiles = UInt64Builder::new();
    let mut bytes = UInt64Builder::new();
    let mut signedness = StringBuilder::new();
    let mut evidence = StringBuilder::new();
    let mut flagged = BooleanBuilder::new();
    let mut flags = StringBuilder::new();
    for l in layouts {
        name.append_value(&l.name);
        layer.append_option(l.layer);
        role.append_value(&l.role);
        dtype.append_value(&l.dtype);
        shape.append_value(format!("{:?}", l.shape));
        match &l.layout {
            Layout::Plain => {
                kind.append_value("plain");
                padded_k.append_value(l.k);
                tiles.append_null();
            }
            Layout::Tiled {
                kind: kd,
                row_blocks,
                col_tiles,
                padded_k: pk,
                ..
            } => {
                kind.append_value(kd.name());
                padded_k.append_value(*pk);
                tiles.append_value(row_blocks * col_tiles);
            }
            Layout::MmBlock { padded_k: pk, .. } => {
                kind.append_value(l.reading());
                padded_k.append_value(*pk);
                tiles.append_null();
            }
        }
        rows.append_value(l.rows);
        k.append_value(l.k);
        bytes.append_value(l.bytes);
        signedness.append_option(l.codes.map(|c| {
            serde_json::to_value(c)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        }));
        evidence.append_value(&l.decision);
        flagged.append_value(!l.flags.is_empty());
        flags.append_option((!l.flags.is_empty()).then(|| l.flags.join("; ")));
    }
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    batch(
        "tensors",
        vec![
            f("name", DataType::Utf8, false),
            f("layer", DataType::UInt32, true),
            f("role", DataType::Utf8, false),
            f("dtype", DataType::Utf8, false),
            f("declared_shape", DataType::Utf8, false),
            f("kind", DataType::Utf8, false),
            f("rows", DataType::UInt64, false),
            f("k", DataType::UInt64, false),
            f("padded_k", DataType::UInt64, false),
            f("tiles", DataType::UInt64, true),
            f("bytes", DataType::UInt64, false),
            f("signedness", DataType::Utf8, true),
            f("evidence", DataType::Utf8, false),
            f("flagged", DataType::Boolean, false),
            f("flags", DataType::Utf8, true),
        ],
        vec![
            Arc::new(name.finish()),
            Arc::new(layer.finish()),
            Arc::new(role.finish()),
            Arc::new(dtype.finish()),
            Arc::new(shape.finish()),
            Arc::new(kind.finish()),
            Arc::new(rows.finish()),
            Arc::new(k.finish()),
            Arc::new(padded_k.finish()),
            Arc::new(tiles.finish()),
            Arc::new(bytes.finish()),
            Arc::new(signedness.finish()),
            Arc::new(evidence.finish()),
            Arc::new(flagged.finish()),
            Arc::new(flags.finish()),
        ],
    )
}

/// The `tensor_stats` table: one row per tensor.
pub fn tensor_stats_table(stats: &[TensorStat]) -> Result<RecordBatch> {
    let mut name = StringBuilder::new();
    let mut count = UInt64Builder::new();
    let (mut min, mut max, mut absmax) = (
        Float32Builder::new(),
        Float32Builder::new(),
        Float32Builder::new(),
    );
    let (mut mean, mut std, mut rms, mut zero_frac) = (
        Float64Builder::new(),
        Float64Builder::new(),
        Float64Builder::new(),
        Float64Builder::new(),
    );
    let (mut nan, mut inf) = (UInt64Builder::new(), UInt64Builder::new());
    let (mut pad_values, mut pad_nonzero) = (UInt64Builder::new(), UInt64Builder::new());
    let (mut s_min, mut s_max, mut s_mean) = (
        Float32Builder::new(),
        Float32Builder::new(),
        Float64Builder::new(),
    );
    let (mut z_min, mut z_max, mut z_mean) = (
        Float32Builder::new(),
        Float32Builder::new(),
        Float64Builder::new(),
    );
    let mut s_nonfinite = UInt64Builder::new();
    for s in stats {
        let v = &s.values;
        name.append_value(&s.name);
        count.append_value(v.count);
        min.append_option(v.some(v.min));
        max.append_option(v.some(v.max));
        absmax.append_option(v.some(v.absmax()));
        mean.append_option(v.some(v.mean()));
        std.append_option(v.some(v.std()));
        rms.append_option(v.some(v.rms()));
        zero_frac.append_option(v.some(v.zero_fraction()));
        nan.append_value(v.nan);
        inf.append_value(v.inf);
        pad_values.append_value(s.pad.count + s.pad.nan + s.pad.inf);
        pad_nonzero.append_value(s.pad.count - s.pad.zeros + s.pad.nan + s.pad.inf);
        s_min.append_option(s.scales.some(s.scales.min));
        s_max.append_option(s.scales.some(s.scales.max));
        s_mean.append_option(s.scales.some(s.scales.mean()));
        s_nonfinite.append_value(s.scales.nan + s.scales.inf + s.zeros.nan + s.zeros.inf);
        z_min.append_option(s.zeros.some(s.zeros.min));
        z_max.append_option(s.zeros.some(s.zeros.max));
        z_mean.append_option(s.zeros.some(s.zeros.mean()));
    }
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    use DataType::*;
    batch(
        "tensor_stats",
        vec![
            f("name", Utf8, false),
            f("count", UInt64, false),
            f("min", Float32, true),
            f("max", Float32, true),
            f("absmax", Float32, true),
            f("mean", Float64, true),
            f("std", Float64, true),
            f("rms", Float64, true),
            f("zero_fraction", Float64, true),
            f("nan_count", UInt64, false),
            f("inf_count", UInt64, false),
            f("pad_values", UInt64, false),
            f("pad_nonzero", UInt64, false),
            f("scale_min", Float32, true),
            f("scale_max", Float32, true),
            f("scale_mean", Float64, true),
            f("scale_zero_nonfinite", UInt64, false),
            f("zero_point_min", Float32, true),
            f("zero_point_max", Float32, true),
            f("zero_point_mean", Float64, true),
        ],
        vec![
            Arc::new(name.finish()),
            Arc::new(count.finish()),
            Arc::new(min.finish()),
            Arc::new(max.finish()),
            Arc::new(absmax.finish()),
            Arc::new(mean.finish()),
            Arc::new(std.finish()),
            Arc::new(rms.finish()),
            Arc::new(zero_frac.finish()),
            Arc::new(nan.finish()),
            Arc::new(inf.finish()),
            Arc::new(pad_values.finish()),
            Arc::new(pad_nonzero.finish()),
            Arc::new(s_min.finish()),
            Arc::new(s_max.finish()),
            Arc::new(s_mean.finish()),
            Arc::new(s_nonfinite.finish()),
            Arc::new(z_min.finish()),
            Arc::new(z_max.finish()),
            Arc::new(z_mean.finish()),
        ],
    )
}

/// The `block_stats` table: one row per (tensor, row block).
pub fn block_stats_table(stats: &[TensorStat]) -> Result<RecordBatch> {
    let mut name = StringBuilder::new();
    let (mut block, mut row0, mut rows, mut count) = (
        UInt64Builder::new(),
        UInt64Builder::new(),
        UInt64Builder::new(),
        UInt64Builder::new(),
    );
    let (mut min, mut max, mut absmax) = (
        Float32Builder::new(),
        Float32Builder::new(),
        Float32Builder::new(),
    );
    let (mut mean, mut rms) = (Float64Builder::new(), Float64Builder::new());
    let mut nonfinite = UInt64Builder::new();
    for s in stats {
        for b in &s.blocks {
            let v = &b.values;
            name.append_value(&s.name);
            block.append_value(b.block);
            row0.append_value(b.row0);
            rows.append_value(b.rows);
            count.append_value(v.count);
            min.append_option(v.some(v.min));
            max.append_option(v.some(v.max));
            absmax.append_option(v.some(v.absmax()));
            mean.append_option(v.some(v.mean()));
            rms.append_option(v.some(v.rms()));
            nonfinite.append_value(v.nan + v.inf);
        }
    }
    use DataType::*;
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    batch(
        "block_stats",
        vec![
            f("name", Utf8, false),
            f("block", UInt64, false),
            f("row0", UInt64, false),
            f("rows", UInt64, false),
            f("count", UInt64, false),
            f("min", Float32, true),
            f("max", Float32, true),
            f("absmax", Float32, true),
            f("mean", Float64, true),
            f("rms", Float64, true),
            f("nonfinite", UInt64, false),
        ],
        vec![
            Arc::new(name.finish()),
            Arc::new(block.finish()),
            Arc::new(row0.finish()),
            Arc::new(rows.finish()),
            Arc::new(count.finish()),
            Arc::new(min.finish()),
            Arc::new(max.finish()),
            Arc::new(absmax.finish()),
            Arc::new(mean.finish()),
            Arc::new(rms.finish()),
            Arc::new(nonfinite.finish()),
        ],
    )
}
