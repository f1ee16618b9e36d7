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
    /// Per-head RMSNorm, then RoPE (Qwen3, Gemma 3, LFM2).
    BeforeRope,
    /// RoPE, then per-head RMSNorm (Hunyuan, seed #2218).
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
    /// Qwen3.5's gated DeltaNet (`linear_attn.*`): `qkv_proj` gives q, k (`key_heads × key_dim`
    /// each) and v (`value_heads × value_dim`), a causal depthwise convolution of `kernel` taps
    /// and SiLU run over those channels, q and k are L2-normalised per head, and each value head
    /// keeps a `key_dim × value_dim` state updated by the delta rule with decay
    /// `exp(ssm_a·softplus(α + ssm_dt.bias))` and step `β = σ(beta)`; the output is RMS-normed
    /// per head, × `ssm_norm` × SiLU(z) (`self_attn.gate_proj`), then `ssm_out_proj`. Its state
    /// per sequence is the convolution's last `kernel − 1` inputs and every head's matrix.
    GatedDeltaNet {
        /// Query/key heads.
        key_heads: usize,
        /// Query/key head dim.
        key_dim: usize,
        /// Value heads (a multiple of `key_heads`).
        value_heads: usize,
        /// Value head dim.
        value_dim: usize,
        /// Taps of the convolution.
        kernel: usize,
        /// Which key head each value head reads.
        value_order: ValueHeadOrder,
    },
}

/// How a gated-DeltaNet layer's value heads map to its key heads when there are more of them
/// (semantics.md §4.6): every value-indexed weight (the v rows of `qkv_proj`, z, α, β, `ssm_a`,
/// `ssm_dt.bias`, the `ssm_out_proj` columns, the v channels of the convolution) is in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueHeadOrder {
    /// llama.cpp's order (GGUF-derived packs): value head j reads key head `j mod key_heads`.
    #[default]
    Tiled,
    /// transformers' order: value head j reads key head `j / (value_heads / key_heads)`.
    Grouped,
}

impl ValueHeadOrder {
    /// The key head value head `j` reads.
    pub fn key_head(self, j: usize, key_heads: usize, value_heads: usize) -> usize {
        match self {
            ValueHeadOrder::Tiled => j % key_heads.max(1),
            ValueHeadOrder::Grouped => j / (value_heads / key_heads.max(1)).max(1),
        }
    }
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
    /// `q_proj` holds a sigmoid output gate after the queries (`2·heads·head_dim` rows: all q,
    /// then all gates, Qwen3.5): attention's output × σ(gate) before `o_proj`.
    #[serde(default)]
    pub attn_output_gate: bool,
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
