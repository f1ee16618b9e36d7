//! The import graph: the stages that exist, wired from a repository source to the tables.
//!
//! ```text
//! hub ─▶ fetch ─▶ snapshot (+ files table)
//! config.json + tokenizer files ─▶ semantics ─▶ semantics.json, semantics / layers tables
//! model.q4nx + config.json ─▶ detect ─▶ layouts.json ─▶ dequant ─▶ tables/{tensors,tensor_stats,block_stats}.parquet
//!                                              └──(+ GGUF reference)──▶ verify ─▶ verification/{verification.parquet,verdict.json}
//! semantics + layouts + verdict + tokenizer ─▶ repack ─▶ pack/ ─▶ kernels ─▶ kernels.json, kernels table
//! each tower file (vision_weight.q4nx, …) ─▶ detect:FILE ─▶ dequant:FILE, verify:FILE (+ mmproj) ─▶ repack
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use onebit_pack::host::HostRuntime;
use onebit_pipeline::{Graph, Input, Stage};

use crate::error::{Error, Result};
use crate::stage::RepoInputs;
use crate::stage::dequant::DequantStage;
use crate::stage::detect::DetectStage;
use crate::stage::fetch::{FetchInfo, FetchStage};
use crate::stage::kernels::KernelSetStage;
use crate::stage::repack::RepackStage;
use crate::stage::repair::RepairStage;
use crate::stage::semantics::SemanticsStage;
use crate::stage::tower::{Tower, TowerDequantStage, TowerDetectStage, TowerVerifyStage};
use crate::stage::verify::VerifyStage;
use crate::tower::TOWER_FILES;

/// Where a repository comes from, and what to verify it against.
#[derive(Clone, Debug)]
pub struct ImportSource {
    /// A local folder holding the repository's files.
    pub dir: PathBuf,
    /// A GGUF of the same model, the independent reference of the verify stage.
    pub reference: Option<PathBuf>,
    /// llama.cpp's mmproj GGUF of the same model, the reference of the towers' verify stages.
    pub mmproj: Option<PathBuf>,
    /// When the folder is a hub snapshot fetched before the graph: the fetch stage records it and
    /// every other stage runs after it.
    pub fetch: Option<FetchInfo>,
    /// Rebuild what verification finds broken by a known converter defect (the repair stage),
    /// and pack the repaired bytes.
    pub repair: bool,
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

/// Environment variable naming a directory of NPU kernel artifacts (`*.xclbin`) besides the
/// repository's own.
pub const KERNEL_DIR_ENV: &str = "ONEBIT_KERNEL_DIR";

/// Prefill batch the kernel set's GEMM shapes are sized for (the server's default `--batch`).
pub const PREFILL_BATCH: u64 = 256;

/// The current version of every import stage, for `status` (each tower file's stages by name).
pub fn stage_versions() -> BTreeMap<String, u32> {
    [
        DetectStage::ID,
        DequantStage::ID,
        VerifyStage::ID,
        FetchStage::ID,
        RepackStage::ID,
        RepairStage::ID,
        KernelSetStage::ID,
        SemanticsStage::ID,
    ]
    .into_iter()
    .map(|id| (id.name.to_string(), id.version))
    .chain(TOWER_FILES.iter().flat_map(|(file, _)| {
        use crate::stage::tower::{DEQUANT_VERSION, DETECT_VERSION, VERIFY_VERSION};
        [
            ("detect", DETECT_VERSION),
            ("dequant", DEQUANT_VERSION),
            ("verify", VERIFY_VERSION),
        ]
        .map(|(stage, v)| (crate::tower::stage_name(stage, file), v))
    }))
    .collect()
}

/// Builds the import graph for `source`, refusing a folder without `model.q4nx`. `host` is the
/// runtime the kernels stage self-checks the pack on (`onebit_runtime::HostKernels`).
pub fn import_graph(source: &ImportSource, host: Arc<dyn HostRuntime>) -> Result<Graph> {
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
    for (given, what) in [(&source.reference, "reference"), (&source.mmproj, "mmproj")] {
        if let Some(r) = given
            && !r.is_file()
        {
            return Err(Error::Refused {
                file: r.clone(),
                tensor: what.into(),
                reason: format!("the GGUF {what} does not exist"),
            });
        }
    }
    let mut stages: Vec<Arc<dyn Stage>> = Vec::new();
    let mut extra = Vec::new();
    if let Some(f) = &source.fetch {
        stages.push(Arc::new(FetchStage {
            info: f.clone(),
            snapshot: dir.clone(),
        }));
        extra.push(Input::artifact("fetched", "fetch", "manifest.json"));
    }
    if config.is_some() {
        stages.push(Arc::new(SemanticsStage {
            dir: dir.clone(),
            extra: extra.clone(),
        }));
    }
    let repo = || RepoInputs {
        extra: extra.clone(),
        model: model.clone(),
        config: config.clone(),
        reference: source.reference.clone(),
    };
    stages.push(Arc::new(DetectStage { repo: repo() }));
    stages.push(Arc::new(DequantStage {
        extra: extra.clone(),
        model: model.clone(),
    }));
    stages.push(Arc::new(VerifyStage {
        repo: repo(),
        tie_rows: 4096,
    }));
    // Each tower file: its own detect, dequant and verify, against the mmproj.
    let towers: Vec<Tower> = TOWER_FILES
        .iter()
        .filter(|(file, _)| has(file))
        .map(|&(file, kind)| Tower {
            repo: RepoInputs {
                extra: extra.clone(),
                model: dir.join(file),
                config: config.clone(),
                reference: source.mmproj.clone(),
            },
            file: file.to_string(),
            kind,
        })
        .collect();
    for t in &towers {
        stages.push(Arc::new(TowerDetectStage::new(t.clone())));
        stages.push(Arc::new(TowerDequantStage::new(t.clone())));
        stages.push(Arc::new(TowerVerifyStage::new(t.clone())));
    }
    if source.repair {
        stages.push(Arc::new(RepairStage {
            repo: repo(),
            tie_rows: 4096,
        }));
    }
    // The runtime pack needs the semantics (config.json) and a tokenizer.
    if config.is_some() && has("tokenizer.json") {
        stages.push(Arc::new(RepackStage {
            extra: extra.clone(),
            dir: dir.clone(),
            source: source.ref_name(),
            revision: source.fetch.as_ref().map(|f| f.commit.clone()),
            reference: source.reference.clone(),
            repaired: source.repair,
            towers: towers.iter().map(|t| (t.file.clone(), t.kind)).collect(),
        }));
        // The kernel set: the repository's xclbins plus a configured kernel directory.
        let mut dirs = vec![dir.clone()];
        if let Some(k) = std::env::var_os(KERNEL_DIR_ENV) {
            dirs.push(PathBuf::from(k));
        }
        stages.push(Arc::new(KernelSetStage {
            extra,
            xclbins: KernelSetStage::find_xclbins(&dirs),
            batch: PREFILL_BATCH,
            host,
        }));
    }
    Graph::new(stages).map_err(|e| Error::Internal(e.to_string()))
}
