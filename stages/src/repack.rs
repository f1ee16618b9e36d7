//! The re-pack stage: semantics + tile layouts + verification verdict → a verified pack the runtime
//! maps ([`onebit_runtime::pack`]).
//!
//! The pack keeps `model.q4nx` byte for byte (hard-linked from the source when the filesystem
//! allows, else copied): the NPU backend needs exactly those tiles, and the host kernels compute
//! on them directly, so one copy serves both. What changes is everything around the bytes: the
//! [`ModelSpec`] resolved once from the config semantics (RoPE tables per layer kind, norm and
//! scale flags), the tile kind of every tensor as detection decided it, provenance and the verdict.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use onebit_pipeline::{Input, Stage, StageContext, StageError};
use onebit_runtime::Pack;
use onebit_runtime::kernels::{TileLayout, scan};
use onebit_runtime::pack::{
    FORMAT, HEAD_SCAN_FILE, HeadScan, Manifest, Provenance, TensorEntry, VERSION, Verification,
};
use onebit_runtime::spec::{self, Act, LayerSpec, ModelSpec, RopeTable};

use crate::detect::{Layout, TensorLayout};
use crate::error::{Error, Result};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Activation, Family, LayerKind, QkNorm, Semantics};
use crate::verify::PackVerdict;

/// Families the host forward pass runs.
pub const HOST_FAMILIES: [Family; 5] = [
    Family::Gemma3,
    Family::Llama,
    Family::Qwen2,
    Family::Qwen3,
    Family::Hunyuan,
];

fn refuse(file: &Path, what: &str, reason: impl Into<String>) -> Error {
    Error::Refused {
        file: file.to_path_buf(),
        tensor: what.to_string(),
        reason: reason.into(),
    }
}

/// The runtime's model description from the semantics; `has` says whether the pack holds a
/// tensor. Returns the decisions it made, each with its source.
pub fn model_spec(
    sem: &Semantics,
    has: impl Fn(&str) -> bool,
    file: &Path,
) -> Result<(ModelSpec, Vec<String>)> {
    let mut dec = Vec::new();
    if !HOST_FAMILIES.contains(&sem.family) {
        return Err(refuse(
            file,
            "model_type",
            format!(
                "the host runtime does not run family {:?} ({}) yet; it runs gemma3, llama, qwen2, qwen3, hunyuan_v1_dense",
                sem.family, sem.model_type
            ),
        ));
    }
    let unsupported = [
        (sem.moe.is_some(), "mixture-of-experts layers"),
        (sem.linear.is_some(), "linear-attention layers"),
        (sem.attn_output_gate, "a gated attention output"),
        (sem.attn_sinks, "attention sinks"),
        (sem.multipliers.is_some(), "granite multipliers"),
        (sem.o_bias || sem.mlp_bias, "output/MLP biases"),
    ];
    for (on, what) in unsupported {
        if on {
            return Err(refuse(
                file,
                "semantics",
                format!("the host runtime does not implement {what}"),
            ));
        }
    }
    let mut ropes: Vec<RopeTable> = Vec::new();
    let mut rope_index: BTreeMap<String, usize> = BTreeMap::new();
    let mut layers = Vec::new();
    for (i, kind) in sem.layer_kinds.iter().enumerate() {
        let window = match kind {
            LayerKind::FullAttention => None,
            LayerKind::SlidingAttention { window } => Some(*window as usize),
            other => {
                return Err(refuse(
                    file,
                    &format!("layer_kind[{i}]"),
                    format!("the host runtime does not run {other:?} layers"),
                ));
            }
        };
        let key = kind.rope_key().unwrap_or("full");
        let rope = sem
            .rope
            .get(key)
            .or_else(|| sem.rope.get("full"))
            .ok_or_else(|| refuse(file, &format!("rope[{key}]"), "no RoPE for this layer kind"))?;
        let idx = match rope_index.get(key) {
            Some(&i) => i,
            None => {
                let half = (rope.rotary_dim / 2) as usize;
                let inv_freq = (0..half).map(|j| rope.inv_freq(j) as f32).collect();
                let attention_factor = match &rope.scaling {
                    RopeScaling::Yarn { factor, .. } => (0.1 * factor.ln() + 1.0) as f32,
                    RopeScaling::LongRope { mscale, .. } => *mscale as f32,
                    _ => 1.0,
                };
                dec.push(format!(
                    "rope[{key}]=base {} rotary {} {:?} <- semantics",
                    rope.base, rope.rotary_dim, rope.scaling
                ));
                ropes.push(RopeTable {
                    inv_freq,
                    attention_factor,
                });
                rope_index.insert(key.to_string(), ropes.len() - 1);
                ropes.len() - 1
            }
        };
        layers.push(LayerSpec { window, rope: idx });
    }
    let sandwich = has("model.layers.0.pre_feedforward_layernorm.weight")
        && has("model.layers.0.post_feedforward_layernorm.weight");
    dec.push(format!(
        "sandwich_norms={sandwich} <- pre/post_feedforward_layernorm {} in the pack",
        if sandwich { "present" } else { "absent" }
    ));
    let (embed_scale, tied_div) = match (sem.embed_scale, sem.embed_prescaled) {
        (Some(s), true) => (1.0, s as f32),
        (Some(s), false) => (s as f32, 1.0),
        (None, _) => (1.0, 1.0),
    };
    dec.push(format!(
        "embed_scale={embed_scale} tied_head_divisor={tied_div} <- semantics embed_scale {:?}, prescaled {}",
        sem.embed_scale, sem.embed_prescaled
    ));
    dec.push(format!(
        "tied_head={} <- semantics tied (tie_word_embeddings and the tie test)",
        sem.tied
    ));
    dec.push(format!(
        "norm_add_one=false <- semantics norm_form {:?} (the pack's norm weights are used as stored)",
        sem.norm_form
    ));
    let spec = ModelSpec {
        family: sem.model_type.clone(),
        hidden: sem.hidden as usize,
        heads: sem.heads as usize,
        kv_heads: sem.kv_heads as usize,
        head_dim: sem.head_dim as usize,
        ffn: sem.intermediate as usize,
        vocab: sem.vocab as usize,
        eps: sem.eps as f32,
        norm_add_one: false,
        act: match sem.activation {
            Activation::Silu => Act::Silu,
            Activation::GeluTanh => Act::GeluTanh,
        },
        layers,
        ropes,
        qk_norm: match sem.qk_norm {
            QkNorm::Off => spec::QkNorm::Off,
            QkNorm::BeforeRope => spec::QkNorm::BeforeRope,
            QkNorm::AfterRope => spec::QkNorm::AfterRope,
        },
        sandwich_norms: sandwich,
        attn_scale: sem.attn_scale as f32,
        qkv_bias: sem.qkv_bias,
        embed_scale,
        tied_head_divisor: tied_div,
        tied_head: sem.tied,
        final_softcap: sem.final_softcap.map(|v| v as f32),
        attn_softcap: sem.attn_softcap.map(|v| v as f32),
        bos: sem.bos_id.map(|v| v as u32),
        add_bos: sem.add_bos,
        eos: sem.eos_ids.iter().map(|&v| v as u32).collect(),
        context: sem.context.unwrap_or(4096) as usize,
    };
    Ok((spec, dec))
}

/// The tensor table from the detected layouts.
pub fn tensor_entries(layouts: &[TensorLayout]) -> BTreeMap<String, TensorEntry> {
    layouts
        .iter()
        .map(|l| {
            let kind = match &l.layout {
                Layout::Tiled { kind, .. } => kind.name().to_string(),
                Layout::Plain => l.dtype.clone(),
            };
            (
                l.name.clone(),
                TensorEntry {
                    kind,
                    rows: l.rows,
                    k: l.k,
                },
            )
        })
        .collect()
}

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
}

impl RepackStage {
    /// Bumped whenever the pack written for the same input can change.
    pub const VERSION: u32 = 4;
}

impl Stage for RepackStage {
    fn name(&self) -> &str {
        "repack"
    }
    fn version(&self) -> u32 {
        Self::VERSION
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "format": FORMAT, "version": VERSION })
    }
    fn inputs(&self) -> Vec<Input> {
        let mut v = vec![
            Input::external("model", self.dir.join("model.q4nx")),
            Input::external("tokenizer", self.dir.join("tokenizer.json")),
            Input::artifact("semantics", "semantics", "semantics.json"),
            Input::artifact("layouts", "detect", "layouts.json"),
            Input::artifact("verification", "verify", "verification"),
        ];
        v.extend(self.extra.iter().cloned());
        v
    }
    fn outputs(&self) -> Vec<String> {
        vec!["pack".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let model = ctx.input("model")?.to_path_buf();
        let sem: Semantics = serde_json::from_slice(&std::fs::read(ctx.input("semantics")?)?)?;
        let layouts: Vec<TensorLayout> =
            serde_json::from_slice(&std::fs::read(ctx.input("layouts")?)?)?;
        let verdict: PackVerdict = serde_json::from_slice(&std::fs::read(
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
        std::fs::create_dir_all(&out)?;
        let target = out.join("model.q4nx");
        // A fetched snapshot's files are relative symlinks into the blob store: link the blob
        // itself (linking the symlink would leave a dangling one in the pack).
        let real = std::fs::canonicalize(&model)?;
        if std::fs::hard_link(&real, &target).is_err() {
            std::fs::copy(&real, &target)?;
        }
        std::fs::copy(ctx.input("tokenizer")?, out.join("tokenizer.json"))?;
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
                std::fs::read_to_string(self.dir.join("chat_template.jinja")).ok()
            }
            "tokenizer_config:chat_template" => read_template_from_config(&self.dir),
            _ => None,
        };
        let mut all_decisions: Vec<String> = sem.decisions.iter().map(|d| d.to_string()).collect();
        all_decisions.extend(decisions);
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
            },
            chat_template,
            decisions: all_decisions,
            head_scan: None,
        };
        std::fs::write(
            out.join("manifest.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        // The scan head is encoded from the pack as the runtime maps it, so it comes after the
        // first manifest; the manifest is then rewritten with its entry.
        if let Some((scan, decision)) = head_scan(&out, &manifest)? {
            manifest.head_scan = Some(scan);
            manifest.decisions.push(decision);
            std::fs::write(
                out.join("manifest.json"),
                serde_json::to_vec_pretty(&manifest)?,
            )?;
        }
        tracing::info!(pack = %out.display(), verified = verdict.verified, "re-packed");
        Ok(())
    }
}

/// Writes the host's 2-bit scan head (`onebit_runtime::kernels::scan`) into the pack folder `out`
/// when the head is tied and stored as tiles: the host then scans it and re-scores the best
/// candidates against the bf16 embedding. Returns its manifest entry and the decision.
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
    let pack = Pack::open(out, true)?;
    let name = "model.embed_tokens.weight";
    let Some(emb) = pack.stored(name).filter(|s| s.dtype == "BF16") else {
        return Ok(None);
    };
    let (rows, k) = (spec.vocab, spec.hidden);
    if emb.range.len() != rows * k * 2 {
        return Ok(None);
    }
    let bytes = scan::encode_bf16(
        &pack.map()[emb.range.clone()],
        rows,
        k,
        1.0 / spec.tied_head_divisor,
    );
    let path = out.join(HEAD_SCAN_FILE);
    std::fs::write(&path, &bytes)?;
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
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).ok()?).ok()?;
    v.get("chat_template")
        .and_then(|t| t.as_str())
        .map(str::to_string)
}
