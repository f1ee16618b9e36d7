//! The repack stage: semantics + tile layouts + verification verdict → a verified pack the runtime
//! maps ([`onebit_pack::manifest`]), with the model description of [`crate::model_spec`].
//!
//! The pack keeps `model.q4nx` byte for byte (hard-linked from the source when the filesystem
//! allows, else copied): the NPU backend needs exactly those tiles, and the host kernels compute
//! on them directly, so one copy serves both. What changes is everything around the bytes: the
//! [`ModelSpec`] resolved once from the config semantics (RoPE tables per layer kind, norm and
//! scale flags), the tile kind of every tensor as detection decided it, provenance and the verdict.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use onebit_pack::manifest::{
    EMBEDDING_NAMES, FORMAT, HEAD_SCAN_FILE, HeadScan, Manifest, Provenance, Tower, VERSION,
    Verification, VisionSpec,
};
use onebit_pack::{TileLayout, scan};
use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};

use crate::error::{Error, Result};
use crate::format::q4nx::{Container, Dtype};
use crate::layout::TensorLayout;
use crate::model_spec::{model_spec, tensor_entries};
use crate::semantics::Semantics;
use crate::tower::names::TowerFamily;
use crate::tower::spec::{SpecSources, vision_spec};
use crate::tower::{TowerKind, not_served, stage_name};
use crate::verify::PackVerdict;

/// The re-pack stage.
pub struct RepackStage {
    /// Inputs every stage of the graph shares (the fetch record).
    pub extra: Vec<Input>,
    /// The repository folder.
    pub dir: PathBuf,
    /// The pack's source name (`ORG/NAME` or `local/…`) and revision.
    pub source: String,
    /// Revision, when fetched.
    pub revision: Option<String>,
    /// The GGUF reference, when verification had one.
    pub reference: Option<PathBuf>,
    /// Pack the repair stage's bytes, layouts and verdict instead of the repository's.
    pub repaired: bool,
    /// The tower files the repository ships, each verified by its own `verify:FILE` stage.
    pub towers: Vec<(String, TowerKind)>,
}

impl RepackStage {
    /// The stage's name and version; the version is bumped whenever the pack written for the same
    /// input can change.
    /// v2: a tied head stored as tiles gets the host's 2-bit scan head (`head-scan.bin`).
    /// v3: the scan head removed (it ranked right but ran compute-bound); v4 restored it, with
    /// the scan kernels that made it pay.
    /// v5: the model spec's FFN width is the family's padded width (qwen2: a multiple of 512), as
    /// the pack's tensors hold it.
    /// v6: a repaired pack's manifest lists what the repair stage rebuilt (verification and
    /// decisions), and the pack holds the repaired bytes when the graph repairs.
    /// v7: LFM2 packs: the model spec's short-convolution layers beside attention.
    /// v8: Qwen3.5 packs: the model spec's gated-DeltaNet layers.
    /// v9: a vision tower's runtime spec (`towers[].vision`: geometry, preprocessing, image
    /// tokens, from config.json, tokenizer.json and preprocessor_config.json), and it is served
    /// when it verifies.
    pub const ID: StageId<'static> = StageId::new("repack", 9);
}

impl Stage for RepackStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "format": FORMAT, "version": VERSION })
    }
    fn inputs(&self) -> Vec<Input> {
        let mut v = if self.repaired {
            vec![
                Input::artifact("model", "repair", "model.q4nx"),
                Input::artifact("layouts", "repair", "layouts.json"),
                Input::artifact("verification", "repair", "verification"),
            ]
        } else {
            vec![
                Input::external("model", self.dir.join("model.q4nx")),
                Input::artifact("layouts", "detect", "layouts.json"),
                Input::artifact("verification", "verify", "verification"),
            ]
        };
        v.push(Input::external(
            "tokenizer",
            self.dir.join("tokenizer.json"),
        ));
        v.push(Input::artifact("semantics", "semantics", "semantics.json"));
        if !self.towers.is_empty() {
            // Where the runtime reads a vision tower's geometry, tokens and preprocessing.
            for (name, file) in [
                ("config", "config.json"),
                ("preprocessor_config", "preprocessor_config.json"),
            ] {
                if self.dir.join(file).is_file() {
                    v.push(Input::external(name, self.dir.join(file)));
                }
            }
        }
        for (file, _) in &self.towers {
            v.push(Input::external(
                &format!("tower:{file}"),
                self.dir.join(file),
            ));
            v.push(Input::artifact(
                &format!("tower-verification:{file}"),
                &stage_name("verify", file),
                "verification",
            ));
        }
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["pack".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let model = ctx.input("model")?.to_path_buf();
        let sem: Semantics = serde_json::from_slice(&fs_err::read(ctx.input("semantics")?)?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&fs_err::read(ctx.input("layouts")?)?)?;
        let verdict: PackVerdict = serde_json::from_slice(&fs_err::read(
            ctx.input("verification")?.join("verdict.json"),
        )?)?;
        let names: std::collections::BTreeSet<&str> =
            layouts.iter().map(|l| l.name.as_str()).collect();
        // A model the host cannot run still gets its pack (the NPU tiles, the verdict); the
        // manifest says why the host refuses it.
        let (spec, decisions, host_refusal) = match model_spec(&sem, |n| names.contains(n), &model)
        {
            Ok((s, d)) => (Some(s), d, None),
            Err(Error::Refused { tensor, reason, .. }) => {
                (None, Vec::new(), Some(format!("{tensor}: {reason}")))
            }
            Err(e) => return Err(e.into()),
        };
        let out = ctx.output("pack");
        fs_err::create_dir_all(&out)?;
        let target = out.join("model.q4nx");
        // A fetched snapshot's files are relative symlinks into the blob store: link the blob
        // itself (linking the symlink would leave a dangling one in the pack).
        let real = fs_err::canonicalize(&model)?;
        if fs_err::hard_link(&real, &target).is_err() {
            fs_err::copy(&real, &target)?;
        }
        fs_err::copy(ctx.input("tokenizer")?, out.join("tokenizer.json"))?;
        let mut files = BTreeMap::new();
        for (name, path) in [
            ("model.q4nx", model.clone()),
            ("tokenizer.json", ctx.input("tokenizer")?.to_path_buf()),
        ] {
            let mut h = blake3::Hasher::new();
            h.update_mmap_rayon(&path)?;
            files.insert(name.to_string(), h.finalize().to_hex().to_string());
        }
        // The template the semantics stage found: the file wins over tokenizer_config.json.
        let chat_template = match sem.chat_template.as_str() {
            "file:chat_template.jinja" => {
                fs_err::read_to_string(self.dir.join("chat_template.jinja")).ok()
            }
            "tokenizer_config:chat_template" => read_template_from_config(&self.dir),
            _ => None,
        };
        let mut all_decisions: Vec<String> = sem.decisions.iter().map(|d| d.to_string()).collect();
        all_decisions.extend(decisions);
        all_decisions.extend(verdict.repaired.iter().map(|r| format!("repaired {r}")));
        let towers = self.pack_towers(ctx, &out, spec.as_ref().map(|s| s.hidden))?;
        let mut manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            model: spec,
            host_refusal,
            tensors: tensor_entries(&layouts),
            provenance: Provenance {
                source: self.source.clone(),
                revision: self.revision.clone(),
                files,
                stage_keys: BTreeMap::new(),
                reference: self.reference.as_ref().map(|p| p.display().to_string()),
            },
            verification: Verification {
                verified: verdict.verified,
                summary: verdict.summary.clone(),
                repaired: verdict.repaired.clone(),
            },
            chat_template,
            decisions: all_decisions,
            head_scan: None,
            towers,
        };
        fs_err::write(
            out.join("manifest.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        // The scan head is encoded from the pack as the runtime maps it, so it comes after the
        // first manifest; the manifest is then rewritten with its entry.
        if let Some((scan, decision)) = head_scan(&out, &manifest)? {
            manifest.head_scan = Some(scan);
            manifest.decisions.push(decision);
            fs_err::write(
                out.join("manifest.json"),
                serde_json::to_vec_pretty(&manifest)?,
            )?;
        }
        tracing::info!(pack = %out.display(), verified = verdict.verified, "re-packed");
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}

/// Writes the host's 2-bit scan head ([`onebit_pack::scan`]) into the pack folder `out`
/// when the head is tied and stored as tiles: the host then scans it and re-scores the best
/// candidates against the bf16 embedding. Returns its manifest entry and the decision.
impl RepackStage {
    /// Links each tower file into the pack beside `model.q4nx` and records its verdict and, for
    /// a verified vision tower, how the runtime runs it (or why it cannot).
    fn pack_towers(
        &self,
        ctx: &StageContext<'_>,
        out: &Path,
        text_hidden: Option<usize>,
    ) -> Result<Vec<Tower>, StageError> {
        let mut towers = Vec::new();
        for (file, kind) in &self.towers {
            let source = fs_err::canonicalize(ctx.input(&format!("tower:{file}"))?)?;
            let target = out.join(file);
            if fs_err::hard_link(&source, &target).is_err() {
                fs_err::copy(&source, &target)?;
            }
            let verdict: PackVerdict = serde_json::from_slice(&fs_err::read(
                ctx.input(&format!("tower-verification:{file}"))?
                    .join("verdict.json"),
            )?)?;
            let mut h = blake3::Hasher::new();
            h.update_mmap_rayon(&source)?;
            let (vision, note) = match not_served(*kind) {
                Some(why) => (None, Some(why.to_string())),
                None if !verdict.verified => (
                    None,
                    Some("the tower did not verify against an mmproj GGUF (run with --mmproj GGUF): images are refused".to_string()),
                ),
                None => match self.vision_spec(ctx, &source, text_hidden) {
                    Ok(s) => (Some(s), None),
                    Err(why) => (None, Some(why)),
                },
            };
            towers.push(Tower {
                file: file.clone(),
                kind: kind.as_str().to_string(),
                verified: verdict.verified,
                tensors: Container::open(&source)?.tensors().len(),
                summary: verdict.summary,
                served: vision.is_some(),
                not_served: note,
                blake3: h.finalize().to_hex().to_string(),
                vision,
            });
        }
        Ok(towers)
    }

    /// The vision tower's runtime spec from the repository's config, tokenizer and processor
    /// settings, or why images cannot be served from it.
    fn vision_spec(
        &self,
        ctx: &StageContext<'_>,
        tower: &Path,
        text_hidden: Option<usize>,
    ) -> Result<VisionSpec, String> {
        let json = |name: &str| -> Result<Option<serde_json::Value>, String> {
            let Ok(path) = ctx.input(name) else {
                return Ok(None);
            };
            let bytes = fs_err::read(path).map_err(|e| e.to_string())?;
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        let text_hidden = text_hidden
            .ok_or("the host cannot run the language model, so it encodes no images for it")?;
        let config = json("config")?.ok_or("the repository has no config.json")?;
        let tokenizer = json("tokenizer")?.ok_or("the repository has no tokenizer.json")?;
        let preprocessor = json("preprocessor_config")?;
        let family = Container::open(tower)
            .map_err(|e| e.to_string())?
            .tensors()
            .iter()
            .find_map(|t| TowerFamily::of_tensor(&t.name));
        vision_spec(&SpecSources {
            family,
            config: &config,
            tokenizer: &tokenizer,
            preprocessor: preprocessor.as_ref(),
            text_hidden,
        })
    }
}

fn head_scan(out: &Path, manifest: &Manifest) -> Result<Option<(HeadScan, String)>, StageError> {
    let Some(spec) = &manifest.model else {
        return Ok(None);
    };
    let head_kind = manifest
        .tensors
        .get("lm_head.weight")
        .map(|t| t.kind.as_str());
    let tiled = head_kind.is_some_and(|k| TileLayout::by_name(k).is_some());
    if !spec.tied_head || !tiled {
        return Ok(None);
    }
    let weights = Container::open(&out.join("model.q4nx"))?;
    let Some(emb) = EMBEDDING_NAMES
        .into_iter()
        .find_map(|n| weights.tensor(n))
        .filter(|t| t.dtype == Dtype::BF16)
    else {
        return Ok(None);
    };
    let (rows, k) = (spec.vocab, spec.hidden);
    if emb.nbytes() as usize != rows * k * 2 {
        return Ok(None);
    }
    let bytes = scan::encode_bf16(weights.data(emb), rows, k, 1.0 / spec.tied_head_divisor);
    let path = out.join(HEAD_SCAN_FILE);
    fs_err::write(&path, &bytes)?;
    let entry = HeadScan {
        file: HEAD_SCAN_FILE.into(),
        rows: rows as u64,
        k: k as u64,
        blake3: blake3::hash(&bytes).to_hex().to_string(),
    };
    let decision = format!(
        "head_scan={HEAD_SCAN_FILE} (2-bit, {}-column groups, {:.1} MB) <- tied head stored as {} \
         tiles: the host scans it and re-scores the best candidates against the bf16 embedding",
        scan::GROUP,
        bytes.len() as f64 / 1e6,
        head_kind.unwrap_or_default()
    );
    Ok(Some((entry, decision)))
}

fn read_template_from_config(dir: &Path) -> Option<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&fs_err::read(dir.join("tokenizer_config.json")).ok()?).ok()?;
    v.get("chat_template")
        .and_then(|t| t.as_str())
        .map(str::to_string)
}
