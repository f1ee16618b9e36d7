//! What the forward pass needs to know about a model, resolved once by the re-pack stage from the
//! config semantics: no family names are consulted at run time, only these flags and tables.

use serde::{Deserialize, Serialize};

/// Gate activation of the MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// x·σ(x) (Llama, Qwen).
    Silu,
    /// GELU, tanh approximation (Gemma).
    GeluTanh,
}

/// Where q/k RMSNorm sits relative to RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// No q/k norm.
    Off,
    /// Qwen3, Gemma 3: per-head RMSNorm, then RoPE.
    BeforeRope,
    /// Hunyuan: RoPE, then per-head RMSNorm.
    AfterRope,
}

/// One RoPE table: the inverse frequency of each rotated pair (rotate-half convention, on the
/// first `2·inv_freq.len()` dims of a head) and the attention factor scaling cos/sin (YaRN,
/// LongRoPE; 1 otherwise). Every scaling variant (linear, llama3, dynamic alpha, longrope, yarn,
/// per-layer-kind bases) reduces to such a table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeTable {
    /// θ_i, i < rotary_dim/2.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin.
    pub attention_factor: f32,
}

/// What mixes information across positions in a layer (the FFN after it is the same for all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Mixer {
    /// Softmax attention over the KV cache (`self_attn.{q,k,v,o}_proj`).
    #[default]
    Attention,
    /// LFM2's gated short convolution (`shortconv.{in_proj,conv,out_proj}`): `in_proj` gives
    /// B, C and x (H rows each, in that order), a causal depthwise convolution of `kernel` taps
    /// runs over B ⊙ x, and `out_proj` reads C ⊙ conv. Its state per sequence is the last
    /// `kernel − 1` convolution inputs.
    ShortConv {
        /// Taps of the convolution (`conv_L_cache`).
        kernel: usize,
    },
}

/// One decoder layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerSpec {
    /// Attention window in tokens (a token sees itself and the `window − 1` before it), or
    /// `None` for full attention.
    pub window: Option<usize>,
    /// Index into [`ModelSpec::ropes`].
    pub rope: usize,
    /// The layer's token mixer (packs written before it existed are attention throughout).
    #[serde(default)]
    pub mixer: Mixer,
}

/// The model as the host forward pass runs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Family name, for messages only.
    pub family: String,
    /// Hidden width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// KV heads (GQA).
    pub kv_heads: usize,
    /// Head dim.
    pub head_dim: usize,
    /// FFN width.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RMSNorm multiplies by `1 + w` (weights stored as w) rather than `w`.
    pub norm_add_one: bool,
    /// Gate activation.
    pub act: Act,
    /// Per layer.
    pub layers: Vec<LayerSpec>,
    /// RoPE tables.
    pub ropes: Vec<RopeTable>,
    /// q/k norm placement.
    pub qk_norm: QkNorm,
    /// Gemma's sandwich norms (post-attention and post-FFN norms on the branch outputs).
    pub sandwich_norms: bool,
    /// Multiplies q·k (1/√query_pre_attn_scalar, 1/√head_dim, or a family multiplier).
    pub attn_scale: f32,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// Multiplies the embedding row (1 when the pack stores it pre-scaled).
    pub embed_scale: f32,
    /// With no `lm_head.weight`, the head is the embedding divided by this (its pre-scale).
    pub tied_head_divisor: f32,
    /// The head is the embedding (tied), so the pack's bf16 embedding divided by
    /// `tied_head_divisor` is the exact head even where `lm_head.weight` is stored as tiles: the
    /// host re-scores the tiled head's best candidates against it (see `Model::set_head_rescore`).
    #[serde(default)]
    pub tied_head: bool,
    /// `cap·tanh(logits/cap)` on the final logits.
    pub final_softcap: Option<f32>,
    /// `cap·tanh(scores/cap)` on attention scores.
    pub attn_softcap: Option<f32>,
    /// BOS id and whether prompts start with it.
    pub bos: Option<u32>,
    /// Whether plain prompts get BOS prepended.
    pub add_bos: bool,
    /// Ids that end generation.
    pub eos: Vec<u32>,
    /// Context length the model was trained for.
    pub context: usize,
}

impl ModelSpec {
    /// Rows of the q projection.
    pub fn q_rows(&self) -> usize {
        self.heads * self.head_dim
    }
    /// Rows of each of the k and v projections.
    pub fn kv_rows(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}
