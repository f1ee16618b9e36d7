//! The tower stages: for each tower file a repository ships (`vision_weight.q4nx`, …), the
//! language file's detect, dequant and verify again, named `detect:FILE`, `dequant:FILE` and
//! `verify:FILE` ([`crate::tower`]). Their inputs are the tower file, config.json and the mmproj
//! GGUF, so a new mmproj re-runs only the tower's verify, and the language stages never re-run
//! for a tower.

use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use super::RepoInputs;
use super::dequant::write_dequant_tables;
use super::verify::write_verification;
use crate::format::q4nx::Container;
use crate::layout::TensorLayout;
use crate::tower::detect::detect_tower;
use crate::tower::verify::verify_tower;
use crate::tower::{TowerKind, stage_name};

/// Version of the tower's detect stage. v1: plain and MM-blocked bf16 tensors.
pub const DETECT_VERSION: u32 = 1;
/// Version of the tower's dequant stage. v1: the language file's tables.
pub const DEQUANT_VERSION: u32 = 1;
/// Version of the tower's verify stage. v1: every tensor against its mmproj twin; missing
/// tensors, transposes and block geometries named.
pub const VERIFY_VERSION: u32 = 1;

/// One tower file: what the three stages share.
#[derive(Clone)]
pub struct Tower {
    /// The file's inputs: `model` is the tower file, `reference` the mmproj GGUF.
    pub(crate) repo: RepoInputs,
    /// The file name in the repository.
    pub file: String,
    /// What it encodes.
    pub kind: TowerKind,
}

impl Tower {
    fn name(&self, stage: &str) -> String {
        stage_name(stage, &self.file)
    }
}

fn read_config(
    repo: &RepoInputs,
    ctx: &StageContext<'_>,
) -> Result<Option<serde_json::Value>, StageError> {
    Ok(match repo.config(ctx)? {
        Some(p) => Some(serde_json::from_slice(&fs_err::read(p)?)?),
        None => None,
    })
}

/// `detect:FILE`: each tower tensor's layout with its evidence.
pub struct TowerDetectStage {
    tower: Tower,
    name: String,
}

impl TowerDetectStage {
    /// The detect stage of `tower`.
    pub fn new(tower: Tower) -> Self {
        let name = tower.name("detect");
        TowerDetectStage { tower, name }
    }
}

impl Stage for TowerDetectStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "file": self.tower.file, "kind": self.tower.kind })
    }
    fn inputs(&self) -> Vec<Input> {
        self.tower.repo.inputs(&[])
    }
    fn outputs(&self) -> Vec<String> {
        vec!["layouts.json".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let container = Container::open(ctx.input("model")?)?;
        let config = read_config(&self.tower.repo, ctx)?;
        let gguf = self.tower.repo.gguf(ctx)?;
        let prefix = match self.tower.kind {
            TowerKind::Audio => "audio",
            _ => "vision",
        };
        let layouts = detect_tower(&container, config.as_ref(), prefix, gguf.as_ref())?;
        for l in &layouts {
            tracing::debug!(file = %self.tower.file, tensor = %l.name, decision = %l.decision);
        }
        fs_err::write(
            ctx.output("layouts.json"),
            serde_json::to_vec_pretty(&layouts)?,
        )?;
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        StageId::new(&self.name, DETECT_VERSION)
    }
}

/// `dequant:FILE`: the tower's `tensors`, `tensor_stats` and `block_stats` tables.
pub struct TowerDequantStage {
    tower: Tower,
    name: String,
    detect: String,
}

impl TowerDequantStage {
    /// The dequant stage of `tower`.
    pub fn new(tower: Tower) -> Self {
        let (name, detect) = (tower.name("dequant"), tower.name("detect"));
        TowerDequantStage {
            tower,
            name,
            detect,
        }
    }
}

impl Stage for TowerDequantStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "file": self.tower.file })
    }
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![
            Input::external("model", &self.tower.repo.model),
            Input::artifact("layouts", &self.detect, "layouts.json"),
        ];
        v.extend(self.tower.repo.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["tables".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        write_dequant_tables(ctx)
    }
    fn id(&self) -> StageId<'_> {
        StageId::new(&self.name, DEQUANT_VERSION)
    }
}

/// `verify:FILE`: the tower against the mmproj; the `verification` table and its verdict.
pub struct TowerVerifyStage {
    tower: Tower,
    name: String,
    detect: String,
}

impl TowerVerifyStage {
    /// The verify stage of `tower`.
    pub fn new(tower: Tower) -> Self {
        let (name, detect) = (tower.name("verify"), tower.name("detect"));
        TowerVerifyStage {
            tower,
            name,
            detect,
        }
    }
}

impl Stage for TowerVerifyStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "file": self.tower.file })
    }
    fn inputs(&self) -> Vec<Input> {
        self.tower
            .repo
            .inputs(&[Input::artifact("layouts", &self.detect, "layouts.json")])
    }
    fn outputs(&self) -> Vec<String> {
        vec!["verification".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let container = Container::open(ctx.input("model")?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&fs_err::read(ctx.input("layouts")?)?)?;
        let gguf = self.tower.repo.gguf(ctx)?;
        let (rows, verdict) = verify_tower(&container, &layouts, gguf.as_ref(), &self.tower.file)?;
        write_verification(&ctx.output("verification"), &rows, &verdict)?;
        tracing::info!(file = %self.tower.file, verdict = %verdict.summary);
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        StageId::new(&self.name, VERIFY_VERSION)
    }
}
