//! Config semantics (semantics.md): what a pack's `config.json` (+ `tokenizer_config.json`,
//! `tokenizer.json`, `generation_config.json`) means, per model family, with the source of every
//! decision. Unknown families and math we do not implement are refused by name, never
//! approximated.

mod config;
mod derive;
mod family;
pub mod provenance;
pub mod rope;
mod tokens;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use config::{Cfg, Log};
pub use derive::derive;

pub use provenance::{Decision, Refusal};
pub use rope::{Rope, RopeScaling};

/// The families with semantics (semantics.md §4); the rules of each live in its own file under
/// `semantics/family/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// llama, llama3, SmolLM2, R1-Distill-Llama.
    Llama,
    /// Nanbeige (llama semantics, untied, FFN padded).
    Nanbeige,
    /// Granite (dense) with its four multipliers.
    Granite,
    /// Qwen2 / Qwen2.5 (+ VL text).
    Qwen2,
    /// Qwen3 (+ VL text).
    Qwen3,
    /// Qwen3.5 / 3.6 hybrids.
    Qwen3_5,
    /// Gemma 3.
    Gemma3,
    /// Gemma 4 (E2B/E4B).
    Gemma4,
    /// Hunyuan dense.
    Hunyuan,
    /// LFM2 / LFM2.5.
    Lfm2,
    /// Phi-3 / Phi-4-mini.
    Phi3,
    /// gpt-oss.
    GptOss,
}

/// The kind of one layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LayerKind {
    /// Causal softmax attention over the whole context.
    FullAttention,
    /// Softmax attention over the last `window` positions (including its own).
    SlidingAttention {
        /// W.
        window: u64,
    },
    /// Gated DeltaNet linear attention (Qwen3.5).
    LinearAttention,
    /// LFM2 short convolution.
    Conv,
}

impl LayerKind {
    /// Whether the layer has softmax attention (and so q/k gains when q/k norm is on).
    pub fn is_softmax(&self) -> bool {
        matches!(
            self,
            LayerKind::FullAttention | LayerKind::SlidingAttention { .. }
        )
    }

    /// The RoPE key of the kind: `full` or `sliding` (others have no RoPE).
    pub fn rope_key(&self) -> Option<&'static str> {
        match self {
            LayerKind::FullAttention => Some("full"),
            LayerKind::SlidingAttention { .. } => Some("sliding"),
            _ => None,
        }
    }

    /// The kind as the decision log prints it.
    fn name(&self) -> String {
        match self {
            LayerKind::FullAttention => "full".into(),
            LayerKind::SlidingAttention { window } => format!("sliding({window})"),
            LayerKind::LinearAttention => "linear".into(),
            LayerKind::Conv => "conv".into(),
        }
    }
}

/// Where q/k norm sits relative to RoPE: the pack's own type, so a decision reaches the pack's
/// model description unchanged.
pub use onebit_pack::spec::QkNorm;

/// The form norm weights are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormForm {
    /// `w`: apply `x/rms · w`.
    W,
    /// The pack already stores `1+w` (Gemma 2/3, Qwen3.5 norms): apply as stored, `x/rms · w`.
    StoredOnePlusW,
}

/// The MLP gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU with the tanh approximation.
    GeluTanh,
}

/// Granite's multipliers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Multipliers {
    /// Attention scores scale (replaces 1/√D).
    pub attention: f64,
    /// Embedding output scale.
    pub embedding: f64,
    /// Each residual branch scale.
    pub residual: f64,
    /// Logits divisor.
    pub logits_scaling: f64,
}

/// Qwen3.5 linear-attention geometry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinearDims {
    /// Key heads.
    pub key_heads: u64,
    /// Key head dim.
    pub key_head_dim: u64,
    /// Value heads.
    pub value_heads: u64,
    /// Value head dim.
    pub value_head_dim: u64,
    /// Conv kernel.
    pub conv_kernel: u64,
}

/// A mixture-of-experts block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Moe {
    /// Experts.
    pub experts: u64,
    /// Experts per token.
    pub per_token: u64,
}

/// Everything the forward pass, the tile reader and the verifier need to know about a pack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Semantics {
    /// The family.
    pub family: Family,
    /// The `model_type` read (after unwrapping multimodal wrappers).
    pub model_type: String,
    /// Hidden width H.
    pub hidden: u64,
    /// Layers L.
    pub layers: u64,
    /// Attention heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Head dim D.
    pub head_dim: u64,
    /// FFN width I.
    pub intermediate: u64,
    /// Vocabulary V.
    pub vocab: u64,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// MLP activation.
    pub activation: Activation,
    /// The kind of each layer.
    pub layer_kinds: Vec<LayerKind>,
    /// RoPE per layer kind (`full`, `sliding`).
    pub rope: BTreeMap<String, Rope>,
    /// q/k norm and its order.
    pub qk_norm: QkNorm,
    /// Norm weight form.
    pub norm_form: NormForm,
    /// Attention score scale.
    pub attn_scale: f64,
    /// Biases on q, k, v.
    pub qkv_bias: bool,
    /// Bias on o_proj.
    pub o_bias: bool,
    /// Biases on the MLP.
    pub mlp_bias: bool,
    /// Whether the head is the embedding.
    pub tied: bool,
    /// The embedding output scale the model applies (√H for Gemma), and whether the pack stores the
    /// embedding already scaled.
    pub embed_scale: Option<f64>,
    /// Whether the pack's embedding is stored pre-scaled (do not scale the input again).
    pub embed_prescaled: bool,
    /// Final logit softcap `c·tanh(x/c)`.
    pub final_softcap: Option<f64>,
    /// Attention logit softcap.
    pub attn_softcap: Option<f64>,
    /// Granite multipliers.
    pub multipliers: Option<Multipliers>,
    /// Fused attention tile order: `qkv` (Hunyuan) or `kqv`.
    pub tile_order: String,
    /// Qwen3.5: `q_proj` also holds a sigmoid output gate.
    pub attn_output_gate: bool,
    /// Qwen3.5 linear-attention dims.
    pub linear: Option<LinearDims>,
    /// Taps of the short convolution when any layer is a convolution (LFM2 `conv_L_cache`).
    #[serde(default)]
    pub conv_kernel: Option<u64>,
    /// MoE block.
    pub moe: Option<Moe>,
    /// Attention sinks (gpt-oss).
    pub attn_sinks: bool,
    /// BOS id.
    pub bos_id: Option<u64>,
    /// Whether to prepend BOS.
    pub add_bos: bool,
    /// EOS ids.
    pub eos_ids: Vec<u64>,
    /// PAD id.
    pub pad_id: Option<u64>,
    /// Where the chat template comes from.
    pub chat_template: String,
    /// `max_position_embeddings`.
    pub context: Option<u64>,
    /// Every decision with its source.
    pub decisions: Vec<Decision>,
    /// Keys known to be harmless.
    pub ignored: Vec<String>,
    /// Keys we did not read and cannot call harmless (each a FLAG).
    pub unknown: Vec<String>,
}

impl Semantics {
    /// The decision log, one `name=value <- source [tag]` line each, then ignored and unknown keys.
    pub fn log(&self) -> String {
        let mut s = String::new();
        for d in &self.decisions {
            s.push_str(&d.to_string());
            s.push('\n');
        }
        if !self.ignored.is_empty() {
            s.push_str(&format!("ignored: {}\n", self.ignored.join(", ")));
        }
        if !self.unknown.is_empty() {
            s.push_str(&format!("unknown (FLAG): {}\n", self.unknown.join(", ")));
        }
        s
    }

    /// Checks the semantics against a pack's tensor names: the layer count, and the q/k gains of
    /// every softmax-attention layer when q/k norm is on (seed #2218, scoped to attention layers).
    pub fn check_pack(&self, tensors: &BTreeSet<String>) -> Result<(), Refusal> {
        let fam = &self.model_type;
        let pack_layers = tensors
            .iter()
            .filter_map(|n| {
                n.strip_prefix("model.layers.")?
                    .split('.')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .map(|m| m + 1);
        if let Some(n) = pack_layers
            && n != self.layers
        {
            return Err(Refusal::new(
                fam,
                "num_hidden_layers",
                self.layers,
                format!(
                    "config.json num_hidden_layers ({}) does not match the {n} layers in model.q4nx",
                    self.layers
                ),
            ));
        }
        if self.qk_norm != QkNorm::Off {
            for (i, k) in self.layer_kinds.iter().enumerate() {
                let gain = format!("model.layers.{i}.self_attn.q_norm.weight");
                if k.is_softmax() && pack_layers.is_some() && !tensors.contains(&gain) {
                    return Err(Refusal::new(
                        fam,
                        &gain,
                        "absent",
                        format!(
                            "config.json says q and k are normalised per head (use_qk_norm when stated, else model_type/architectures) and layer {i} has no self_attn.q_norm.weight: normalising with an absent gain zeroes q, so this container would answer wrong text"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The other files of a repository the semantics read, when present.
#[derive(Clone, Debug, Default)]
pub struct SideFiles<'a> {
    /// `tokenizer_config.json`.
    pub tokenizer_config: Option<&'a Value>,
    /// `tokenizer.json`.
    pub tokenizer: Option<&'a Value>,
    /// `generation_config.json`.
    pub generation_config: Option<&'a Value>,
    /// Whether `chat_template.jinja` exists.
    pub chat_template_file: bool,
}

/// Layer counts above this are refused (no real model comes near it).
pub const MAX_LAYERS: u64 = 4096;
