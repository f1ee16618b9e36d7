//! The import graph: the stages that exist, wired from a repository source to the tables.
//!
//! ```text
//! model.q4nx + config.json ─▶ detect ─▶ layouts.json ─▶ dequant ─▶ tables/{tensors,tensor_stats,block_stats}.parquet
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use onebit_pipeline::{Graph, Input, Stage, StageContext, StageError};

use crate::dequant::{
    block_stats_table, tensor_stats, tensor_stats_table, tensors_table, write_parquet,
};
use crate::detect::{TensorLayout, detect_pack};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::q4nx::Container;

/// Where a repository comes from.
#[derive(Clone, Debug)]
pub enum ImportSource {
    /// A local folder holding the repository's files.
    LocalDir(PathBuf),
}

impl ImportSource {
    /// The ref name of the pack: `local/<folder name>` for a folder.
    pub fn ref_name(&self) -> String {
        match self {
            ImportSource::LocalDir(d) => format!(
                "local/{}",
                d.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
        }
    }
}

/// The tile-kind stage: decides each tensor's layout (see [`crate::detect`]).
pub struct DetectStage {
    model: PathBuf,
    config: Option<PathBuf>,
}

impl DetectStage {
    /// Bumped whenever the decisions written for the same input can change.
    pub const VERSION: u32 = 1;
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
        let layouts = detect_pack(&container, geometry.as_ref())?;
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
        vec![
            Input::external("model", &self.model),
            Input::artifact("layouts", "detect", "layouts.json"),
        ]
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

/// The current version of every import stage, for `status`.
pub fn stage_versions() -> BTreeMap<String, u32> {
    BTreeMap::from([
        ("detect".to_string(), DetectStage::VERSION),
        ("dequant".to_string(), DequantStage::VERSION),
    ])
}

/// Builds the import graph for `source`, refusing a folder without `model.q4nx`.
pub fn import_graph(source: &ImportSource) -> Result<Graph> {
    let ImportSource::LocalDir(dir) = source;
    let model = dir.join("model.q4nx");
    if !model.is_file() {
        return Err(Error::Refused {
            file: dir.clone(),
            tensor: "model.q4nx".into(),
            reason: "the repository folder has no model.q4nx".into(),
        });
    }
    let config = Some(dir.join("config.json")).filter(|c| c.is_file());
    let stages: Vec<Arc<dyn Stage>> = vec![
        Arc::new(DetectStage {
            model: model.clone(),
            config,
        }),
        Arc::new(DequantStage { model }),
    ];
    Graph::new(stages).map_err(|e| Error::Internal(e.to_string()))
}
