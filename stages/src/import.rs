//! The import graph: the stages that exist, wired from a repository source to the tables.
//!
//! ```text
//! model.q4nx + config.json ─▶ detect ─▶ layouts.json ─▶ dequant ─▶ tables/{tensors,tensor_stats,block_stats}.parquet
//!                                              └──(+ GGUF reference)──▶ verify ─▶ verification/{verification.parquet,verdict.json}
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use onebit_pipeline::{Graph, Input, Stage, StageContext, StageError};

use crate::dequant::{
    block_stats_table, tensor_stats, tensor_stats_table, tensors_table, write_parquet,
};
use crate::detect::{Reference, TensorLayout, detect_pack_with};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::gguf::GgufFile;
use crate::gguf::names::MapDims;
use crate::q4nx::Container;
use crate::verify::{PackVerdict, VerifyDims, VerifyRow, verify_pack};

/// Where a repository comes from, and what to verify it against.
#[derive(Clone, Debug)]
pub struct ImportSource {
    /// A local folder holding the repository's files.
    pub dir: PathBuf,
    /// A GGUF of the same model, the independent reference of the verify stage.
    pub reference: Option<PathBuf>,
    /// When the folder is a hub snapshot fetched before the graph: the fetch stage records it and
    /// every other stage runs after it.
    pub fetch: Option<crate::hub::stage::FetchInfo>,
}

impl ImportSource {
    /// The ref name of the pack: `local/<folder name>` for a folder.
    pub fn ref_name(&self) -> String {
        if let Some(f) = &self.fetch {
            return f.repo.clone();
        }
        format!(
            "local/{}",
            self.dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        )
    }
}

/// The tile-kind stage: decides each tensor's layout (see [`crate::detect`]).
pub struct DetectStage {
    extra: Vec<Input>,
    model: PathBuf,
    config: Option<PathBuf>,
    reference: Option<PathBuf>,
}

impl DetectStage {
    /// Bumped whenever the decisions written for the same input can change.
    /// v2: a GGUF reference decides readings no byte and no in-pack test can.
    pub const VERSION: u32 = 2;
}

impl Stage for DetectStage {
    fn name(&self) -> &str {
        "detect"
    }
    fn version(&self) -> u32 {
        Self::VERSION
    }
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![Input::external("model", &self.model)];
        if let Some(c) = &self.config {
            v.push(Input::external("config", c));
        }
        if let Some(r) = &self.reference {
            v.push(Input::external("reference", r));
        }
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["layouts.json".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let container = Container::open(ctx.input("model")?)?;
        let geometry = match &self.config {
            Some(_) => Some(Geometry::from_file(ctx.input("config")?)?),
            None => None,
        };
        let gguf = match &self.reference {
            Some(_) => Some(GgufFile::open(ctx.input("reference")?)?),
            None => None,
        };
        let reference = gguf.as_ref().map(|g| reference_of(g, geometry.as_ref()));
        let layouts = detect_pack_with(&container, geometry.as_ref(), reference.as_ref())?;
        for l in &layouts {
            tracing::debug!(tensor = %l.name, decision = %l.decision);
        }
        let out = serde_json::to_vec_pretty(&layouts)?;
        std::fs::write(ctx.output("layouts.json"), out)?;
        Ok(())
    }
}

/// The dequant stage: statistics tables of every tensor (see [`crate::dequant`]).
pub struct DequantStage {
    extra: Vec<Input>,
    model: PathBuf,
}

impl DequantStage {
    /// Bumped whenever the tables written for the same input can change.
    pub const VERSION: u32 = 1;
}

impl Stage for DequantStage {
    fn name(&self) -> &str {
        "dequant"
    }
    fn version(&self) -> u32 {
        Self::VERSION
    }
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
        let container = Container::open(ctx.input("model")?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&std::fs::read(ctx.input("layouts")?)?)?;
        let total: u64 = layouts.iter().map(|l| l.bytes).sum();
        let mut done = 0;
        let mut stats = Vec::with_capacity(layouts.len());
        for l in &layouts {
            stats.push(tensor_stats(&container, l)?);
            done += l.bytes;
            ctx.progress(done, total);
        }
        let dir = ctx.output("tables");
        std::fs::create_dir_all(&dir)?;
        write_parquet(
            &dir.join("tensors.parquet"),
            "tensors",
            &tensors_table(&layouts)?,
        )?;
        write_parquet(
            &dir.join("tensor_stats.parquet"),
            "tensor_stats",
            &tensor_stats_table(&stats)?,
        )?;
        write_parquet(
            &dir.join("block_stats.parquet"),
            "block_stats",
            &block_stats_table(&stats)?,
        )?;
        Ok(())
    }
}

/// The verify stage: every tensor against the GGUF reference and the tied head against the
/// embedding (see [`crate::verify`]).
pub struct VerifyStage {
    extra: Vec<Input>,
    model: PathBuf,
    config: Option<PathBuf>,
    reference: Option<PathBuf>,
    tie_rows: u64,
}

impl VerifyStage {
    /// Bumped whenever the table or verdict written for the same input can change.
    /// v2: "same source" needs codes the tile holds natively (requantized tensors are judged
    /// against the expected correlation of the two quantization noises).
    pub const VERSION: u32 = 2;
}

/// The GGUF architecture name of a config `model_type`, for the name map without a GGUF.
pub fn arch_of_model_type(model_type: &str) -> &str {
    match model_type {
        "gemma3" | "gemma3_text" => "gemma3",
        "gemma2" => "gemma2",
        "gemma4" | "gemma4_text" => "gemma4",
        "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" => "qwen35",
        "hunyuan_v1_dense" => "hunyuan-dense",
        other => other,
    }
}

impl Stage for VerifyStage {
    fn name(&self) -> &str {
        "verify"
    }
    fn version(&self) -> u32 {
        Self::VERSION
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "tie_rows": self.tie_rows })
    }
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![
            Input::external("model", &self.model),
            Input::artifact("layouts", "detect", "layouts.json"),
        ];
        if let Some(c) = &self.config {
            v.push(Input::external("config", c));
        }
        if let Some(r) = &self.reference {
            v.push(Input::external("reference", r));
        }
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["verification".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let container = Container::open(ctx.input("model")?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&std::fs::read(ctx.input("layouts")?)?)?;
        let geometry = match &self.config {
            Some(_) => Some(Geometry::from_file(ctx.input("config")?)?),
            None => None,
        };
        let gguf = match &self.reference {
            Some(_) => Some(GgufFile::open(ctx.input("reference")?)?),
            None => None,
        };
        let (rows, verdict) = run_verify(
            &container,
            &layouts,
            geometry.as_ref(),
            gguf.as_ref(),
            self.tie_rows,
        )?;
        let dir = ctx.output("verification");
        std::fs::create_dir_all(&dir)?;
        write_parquet(
            &dir.join("verification.parquet"),
            "verification",
            &verification_table(&rows)?,
        )?;
        std::fs::write(
            dir.join("verdict.json"),
            serde_json::to_vec_pretty(&verdict)?,
        )?;
        tracing::info!(verdict = %verdict.summary);
        Ok(())
    }
}

/// The detect stage's view of a GGUF reference: its architecture and the name-map dimensions.
fn reference_of<'a>(g: &'a GgufFile, geometry: Option<&Geometry>) -> Reference<'a> {
    let arch = g.architecture().unwrap_or_default().to_string();
    let meta = |key: &str| g.meta(&format!("{arch}.{key}")).and_then(|v| v.as_u64());
    let hidden = geometry
        .map(|x| x.hidden)
        .or_else(|| meta("embedding_length"))
        .unwrap_or(0);
    let heads = geometry
        .map(|x| x.heads)
        .or_else(|| meta("attention.head_count"))
        .unwrap_or(1);
    let head_dim = geometry
        .map(|x| x.head_dim)
        .or_else(|| meta("attention.key_length"))
        .unwrap_or(hidden / heads.max(1));
    Reference {
        gguf: g,
        dims: MapDims {
            hidden,
            heads,
            rope_dim: meta("rope.dimension_count").unwrap_or(head_dim),
            head_dim,
        },
        arch,
    }
}

/// Runs verification with dimensions from the config (and the GGUF's RoPE dimension when stated).
pub fn run_verify(
    container: &Container,
    layouts: &[TensorLayout],
    geometry: Option<&Geometry>,
    gguf: Option<&GgufFile>,
    tie_rows: u64,
) -> Result<(Vec<VerifyRow>, PackVerdict)> {
    let arch = gguf
        .and_then(|g| g.architecture().map(str::to_string))
        .or_else(|| geometry.map(|g| arch_of_model_type(&g.model_type).to_string()))
        .unwrap_or_default();
    let meta = |key: &str| {
        gguf.and_then(|g| g.meta(&format!("{arch}.{key}")))
            .and_then(|v| v.as_u64())
    };
    let hidden = geometry
        .map(|g| g.hidden)
        .or_else(|| meta("embedding_length"))
        .unwrap_or(0);
    let heads = geometry
        .map(|g| g.heads)
        .or_else(|| meta("attention.head_count"))
        .unwrap_or(1);
    let head_dim = geometry
        .map(|g| g.head_dim)
        .or_else(|| meta("attention.key_length"))
        .unwrap_or(hidden / heads.max(1));
    let rope_dim = meta("rope.dimension_count").unwrap_or(head_dim);
    let dims = VerifyDims {
        map: MapDims {
            hidden,
            heads,
            rope_dim,
            head_dim,
        },
    };
    verify_pack(container, layouts, gguf, &arch, dims, tie_rows)
}

/// The `verification` table.
pub fn verification_table(rows: &[VerifyRow]) -> Result<arrow_array::RecordBatch> {
    use arrow_array::builder::{Float64Builder, StringBuilder, UInt64Builder};
    use arrow_schema::{DataType, Field, Schema};
    let mut tensor = StringBuilder::new();
    let mut reference = StringBuilder::new();
    let mut reading = StringBuilder::new();
    let mut compared = UInt64Builder::new();
    let mut f: Vec<Float64Builder> = (0..9).map(|_| Float64Builder::new()).collect();
    let mut verdict = StringBuilder::new();
    let mut reason = StringBuilder::new();
    for r in rows {
        tensor.append_value(&r.tensor);
        reference.append_value(&r.reference);
        reading.append_value(&r.reading);
        compared.append_value(r.compared);
        for (b, v) in f.iter_mut().zip([
            r.corr,
            r.rel_l1,
            r.rel_l2,
            r.max_err,
            r.exact_fraction,
            r.scale,
            r.rms_ratio,
            r.floor,
            r.expected,
        ]) {
            b.append_option(v);
        }
        verdict.append_value(r.verdict.as_str());
        reason.append_value(&r.reason);
    }
    let names = [
        "corr",
        "rel_l1",
        "rel_l2",
        "max_err",
        "exact_fraction",
        "scale",
        "rms_ratio",
        "floor",
        "expected",
    ];
    let mut fields = vec![
        Field::new("tensor", DataType::Utf8, false),
        Field::new("reference", DataType::Utf8, false),
        Field::new("reading", DataType::Utf8, false),
        Field::new("compared", DataType::UInt64, false),
    ];
    fields.extend(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Float64, true)),
    );
    fields.push(Field::new("verdict", DataType::Utf8, false));
    fields.push(Field::new("reason", DataType::Utf8, false));
    let mut cols: Vec<arrow_array::ArrayRef> = vec![
        std::sync::Arc::new(tensor.finish()),
        std::sync::Arc::new(reference.finish()),
        std::sync::Arc::new(reading.finish()),
        std::sync::Arc::new(compared.finish()),
    ];
    cols.extend(
        f.iter_mut()
            .map(|b| std::sync::Arc::new(b.finish()) as arrow_array::ArrayRef),
    );
    cols.push(std::sync::Arc::new(verdict.finish()));
    cols.push(std::sync::Arc::new(reason.finish()));
    arrow_array::RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), cols).map_err(|e| {
        Error::Table {
            table: "verification",
            reason: e.to_string(),
        }
    })
}

/// Environment variable naming a directory of NPU kernel artifacts (`*.xclbin`) besides the
/// repository's own.
pub const KERNEL_DIR_ENV: &str = "ONEBIT_KERNEL_DIR";

/// Prefill batch the kernel set's GEMM shapes are sized for (the server's default `--batch`).
pub const PREFILL_BATCH: u64 = 256;

/// The current version of every import stage, for `status`.
pub fn stage_versions() -> BTreeMap<String, u32> {
    BTreeMap::from([
        ("detect".to_string(), DetectStage::VERSION),
        ("dequant".to_string(), DequantStage::VERSION),
        ("verify".to_string(), VerifyStage::VERSION),
        ("fetch".to_string(), crate::hub::stage::FetchStage::VERSION),
        ("repack".to_string(), crate::repack::RepackStage::VERSION),
        (
            "kernels".to_string(),
            crate::kernel_set::KernelSetStage::VERSION,
        ),
        (
            "semantics".to_string(),
            crate::semantics_stage::SemanticsStage::VERSION,
        ),
    ])
}

/// Builds the import graph for `source`, refusing a folder without `model.q4nx`.
pub fn import_graph(source: &ImportSource) -> Result<Graph> {
    let dir = &source.dir;
    let model = dir.join("model.q4nx");
    // A fetched snapshot is checked against its listing (the files arrive before the graph runs).
    let has = |name: &str| match &source.fetch {
        Some(f) => f.files.iter().any(|(p, ..)| p == name),
        None => dir.join(name).is_file(),
    };
    if !has("model.q4nx") {
        return Err(Error::Refused {
            file: dir.clone(),
            tensor: "model.q4nx".into(),
            reason: "the repository folder has no model.q4nx".into(),
        });
    }
    let config = Some(dir.join("config.json")).filter(|_| has("config.json"));
    if let Some(r) = &source.reference
        && !r.is_file()
    {
        return Err(Error::Refused {
            file: r.clone(),
            tensor: "reference".into(),
            reason: "the GGUF reference does not exist".into(),
        });
    }
    let mut stages: Vec<Arc<dyn Stage>> = Vec::new();
    let mut extra = Vec::new();
    if let Some(f) = &source.fetch {
        stages.push(Arc::new(crate::hub::stage::FetchStage {
            info: f.clone(),
            snapshot: dir.clone(),
        }));
        extra.push(Input::artifact("fetched", "fetch", "manifest.json"));
    }
    if config.is_some() {
        stages.push(Arc::new(crate::semantics_stage::SemanticsStage {
            dir: dir.clone(),
            extra: extra.clone(),
        }));
    }
    stages.push(Arc::new(DetectStage {
        extra: extra.clone(),
        model: model.clone(),
        config: config.clone(),
        reference: source.reference.clone(),
    }));
    stages.push(Arc::new(DequantStage {
        extra: extra.clone(),
        model: model.clone(),
    }));
    stages.push(Arc::new(VerifyStage {
        extra: extra.clone(),
        model,
        config: config.clone(),
        reference: source.reference.clone(),
        tie_rows: 4096,
    }));
    // The runtime pack needs the semantics (config.json) and a tokenizer.
    if config.is_some() && has("tokenizer.json") {
        stages.push(Arc::new(crate::repack::RepackStage {
            extra: extra.clone(),
            dir: dir.clone(),
            source: source.ref_name(),
            revision: source.fetch.as_ref().map(|f| f.commit.clone()),
            reference: source.reference.clone(),
        }));
        // The kernel set: the repository's xclbins plus a configured kernel directory.
        let mut dirs = vec![dir.clone()];
        if let Some(k) = std::env::var_os(KERNEL_DIR_ENV) {
            dirs.push(PathBuf::from(k));
        }
        stages.push(Arc::new(crate::kernel_set::KernelSetStage {
            extra,
            xclbins: crate::kernel_set::KernelSetStage::find_xclbins(&dirs),
            batch: PREFILL_BATCH,
        }));
    }
    Graph::new(stages).map_err(|e| Error::Internal(e.to_string()))
}
