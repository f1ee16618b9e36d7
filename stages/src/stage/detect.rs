//! The detect stage: each tensor's tile kind, grid, padded K and signedness, with the evidence
//! ([`crate::layout::detect`]).

use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use super::RepoInputs;
use crate::format::gguf::GgufFile;
use crate::format::gguf::names::MapDims;
use crate::format::q4nx::Container;
use crate::layout::detect::{Reference, detect_pack_with};
use crate::layout::geometry::Geometry;

/// The tile-kind stage: decides each tensor's layout (see [`crate::layout::detect`]).
pub struct DetectStage {
    pub(crate) repo: RepoInputs,
}

impl DetectStage {
    /// The stage's name and version; the version is bumped whenever the decisions written for the
    /// same input can change.
    /// v2: a GGUF reference decides readings no byte and no in-pack test can.
    /// v3: LFM2's short-convolution layers (`conv_in_proj`/`conv_out_proj` geometry and names) and
    /// the family's auto-adjusted FFN width.
    /// v4: Qwen3.5's gated-DeltaNet layers (`linear_qkv_proj`, `linear_z_proj`,
    /// `linear_alpha_beta_proj`, `linear_out_proj` geometry from the `linear_*` config keys).
    pub const ID: StageId<'static> = StageId::new("detect", 4);
}

impl Stage for DetectStage {
    fn inputs(&self) -> Vec<Input> {
        self.repo.inputs(&[])
    }
    fn outputs(&self) -> Vec<String> {
        vec!["layouts.json".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let container = Container::open(ctx.input("model")?)?;
        let geometry = self.repo.geometry(ctx)?;
        let gguf = self.repo.gguf(ctx)?;
        let reference = gguf.as_ref().map(|g| reference_of(g, geometry.as_ref()));
        let layouts = detect_pack_with(&container, geometry.as_ref(), reference.as_ref())?;
        for l in &layouts {
            tracing::debug!(tensor = %l.name, decision = %l.decision);
        }
        let out = serde_json::to_vec_pretty(&layouts)?;
        fs_err::write(ctx.output("layouts.json"), out)?;
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}

/// The detect stage's view of a GGUF reference: its architecture and the name-map dimensions.
pub(crate) fn reference_of<'a>(g: &'a GgufFile, geometry: Option<&Geometry>) -> Reference<'a> {
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
