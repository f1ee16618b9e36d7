//! `manifest.json` of a verified pack: the folder the re-pack stage writes and the runtime maps.
//!
//! ```text
//! manifest.json        format, version, ModelSpec, tensor table, provenance, verification verdict
//! model.q4nx           the NPU tiles, byte for byte as fetched (the host kernels read them too)
//! tokenizer.json       Hugging Face tokenizer
//! chat_template.jinja  the chat template (when the repository has one)
//! head-scan.bin        the host's 2-bit scan head of a tied head stored as tiles ([`crate::scan`])
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::ModelSpec;

/// `format` of a manifest.
pub const FORMAT: &str = "onebit-pack";
/// The manifest version this runtime reads.
pub const VERSION: u32 = 1;

/// One tensor as the manifest describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// Tile kind (`Q41_1280`, …) or plain dtype (`BF16`, `F32`).
    pub kind: String,
    /// Logical rows (1 for vectors).
    pub rows: u64,
    /// Logical columns.
    pub k: u64,
}

/// Where the pack came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// `ORG/NAME` or `local/<folder>`.
    pub source: String,
    /// Hub revision (commit), when fetched.
    pub revision: Option<String>,
    /// blake3 of each source file.
    pub files: BTreeMap<String, String>,
    /// Store key of every stage that produced an input.
    pub stage_keys: BTreeMap<String, String>,
    /// The GGUF the pack was verified against.
    pub reference: Option<String>,
}

/// The verification verdict carried into the pack.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// Whether every tensor passed.
    pub verified: bool,
    /// One line: what passed, what failed and why.
    pub summary: String,
    /// Tensors the repair stage rebuilt, each `name <- source` (empty when none was).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repaired: Vec<String>,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Manifest version.
    pub version: u32,
    /// The model as the forward pass runs it; `None` when the host runtime cannot run this
    /// model (see `host_refusal`).
    pub model: Option<ModelSpec>,
    /// Why the host runtime cannot run the model, when it cannot.
    pub host_refusal: Option<String>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// Provenance.
    pub provenance: Provenance,
    /// Verification verdict.
    pub verification: Verification,
    /// The chat template text (inline), if the repository has one.
    pub chat_template: Option<String>,
    /// Every derived decision with its source.
    pub decisions: Vec<String>,
    /// The host's 2-bit scan copy of a tied head stored as tiles ([`crate::scan`]), when the
    /// repack stage wrote one.
    #[serde(default)]
    pub head_scan: Option<HeadScan>,
    /// The tower files the pack carries beside the language model (a vision or audio encoder),
    /// each with its own verdict: a tower that fails leaves the language model usable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub towers: Vec<Tower>,
}

/// A tower file of the pack (`vision_weight.q4nx`, …), kept byte for byte beside `model.q4nx`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tower {
    /// The file name, in the repository and in the pack.
    pub file: String,
    /// What it encodes: `vision`, `audio` or `image_audio`.
    pub kind: String,
    /// Whether every tensor passed against the mmproj GGUF.
    pub verified: bool,
    /// One line: what passed, what failed and why, or that there was no mmproj to compare with.
    pub summary: String,
    /// Whether the runtime uses it (images or audio accepted).
    pub served: bool,
    /// Why it is not served, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_served: Option<String>,
    /// Tensors in the file.
    pub tensors: usize,
    /// blake3 of the file.
    pub blake3: String,
    /// How the runtime encodes images with it (a Gemma 3 vision tower whose geometry and image
    /// tokens the repository's config and tokenizer give); absent where images are not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionSpec>,
}

/// A vision tower as the runtime runs it: the encoder's geometry, the preprocessing, and the
/// tokens an image becomes in the prompt. Every value was read from the repository's files, each
/// with its source in `decisions` (`tokens_per_image=256 <- config.json mm_tokens_per_image`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VisionSpec {
    /// The encoder and projector: `gemma3` (SigLIP, average pooling, soft-embedding norm).
    pub family: String,
    /// The encoder's width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Image side in pixels (the processor resizes to this square).
    pub image_size: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// LayerNorm and soft-embedding norm epsilon.
    pub eps: f32,
    /// Tokens one image becomes (a square number).
    pub tokens_per_image: usize,
    /// The language model's width, which the projector writes.
    pub text_hidden: usize,
    /// Per-channel mean the processor subtracts after rescaling to [0, 1].
    pub mean: [f32; 3],
    /// Per-channel deviation it divides by.
    pub std: [f32; 3],
    /// The token that opens an image in the prompt (`<start_of_image>`).
    pub start_token: u32,
    /// Its text, which a prompt or chat template writes where an image goes.
    pub start_text: String,
    /// The token that closes it (`<end_of_image>`).
    pub end_token: u32,
    /// Its text.
    pub end_text: String,
    /// The token whose embeddings the image's features replace (`<image_soft_token>`).
    pub image_token: u32,
    /// Its text.
    pub image_text: String,
    /// Where each value came from.
    pub decisions: Vec<String>,
}

impl Manifest {
    /// A verified manifest for `model` with no provenance, for packs made from synthetic weights
    /// (the runtime's tests and benchmarks).
    pub fn synthetic(model: ModelSpec, tensors: BTreeMap<String, TensorEntry>) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            model: Some(model),
            host_refusal: None,
            tensors,
            provenance: Provenance::default(),
            verification: Verification {
                verified: true,
                summary: "synthetic".into(),
                repaired: Vec::new(),
            },
            chat_template: None,
            decisions: Vec::new(),
            head_scan: None,
            towers: Vec::new(),
        }
    }
}

/// The names a pack's token embedding goes by: transformers' and, for LFM2, FastFlowLM's after
/// the GGUF (q4nx-format §5).
pub const EMBEDDING_NAMES: [&str; 2] = ["model.embed_tokens.weight", "model.token_embd.weight"];

/// The scan head's file in the pack folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadScan {
    /// File name inside the pack folder.
    pub file: String,
    /// Rows (the vocabulary).
    pub rows: u64,
    /// Columns (hidden size).
    pub k: u64,
    /// blake3 of the file.
    pub blake3: String,
}

/// The file name the repack stage gives the scan head.
pub const HEAD_SCAN_FILE: &str = "head-scan.bin";
