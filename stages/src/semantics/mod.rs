//! Config semantics (semantics.md): what a pack's `config.json` (+ `tokenizer_config.json`,
//! `tokenizer.json`, `generation_config.json`) means, per model family, with the source of every
//! decision. Unknown families and math we do not implement are refused by name, never
//! approximated.

pub mod provenance;
pub mod rope;
mod tokens;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use provenance::{Decision, Refusal};
pub use rope::{Rope, RopeScaling};

/// The families with semantics (semantics.md §4).
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

    fn name(&self) -> String {
        match self {
            LayerKind::FullAttention => "full".into(),
            LayerKind::SlidingAttention { window } => format!("sliding({window})"),
            LayerKind::LinearAttention => "linear".into(),
            LayerKind::Conv => "conv".into(),
        }
    }
}

/// Where q/k norm sits relative to RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// No q/k norm.
    Off,
    /// Per-head RMSNorm, then RoPE (Qwen3, Gemma, LFM2).
    BeforeRope,
    /// RoPE, then per-head RMSNorm (Hunyuan, seed #2218).
    AfterRope,
}

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

/// Keys that never change the text model's math (semantics.md §1.2).
const IGNORED: &[&str] = &[
    "architectures",
    "attention_dropout",
    "initializer_range",
    "use_cache",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "auto_map",
    "vision_config",
    "audio_config",
    "_name_or_path",
    "pretraining_tp",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "_sliding_window_pattern",
    "hidden_dropout",
    "embedding_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attention_probs_dropout_prob",
    "hidden_dropout_prob",
    "quantization_config",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "vision_token_id",
    "image_token_index",
    "boi_token_index",
    "eoi_token_index",
    "mm_tokens_per_image",
    "audio_token_id",
    "video_token_index",
    "image_token_index",
    "model_type",
    "text_config",
    "is_encoder_decoder",
    "unsloth_fixed",
    "unsloth_version",
    "mtp_num_hidden_layers",
    "mtp_use_dedicated_embeddings",
    "use_return_dict",
    "chunk_size_feed_forward",
    "tie_encoder_decoder",
    "problem_type",
    "id2label",
    "label2id",
    "task_specific_params",
    "finetuning_task",
    "tokenizer_class",
    "prefix",
    "decoder_start_token_id",
    "sep_token_id",
    "max_length",
    "min_length",
    "do_sample",
    "num_beams",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "cross_attention_hidden_size",
    "add_cross_attention",
    "torchscript",
    "use_bfloat16",
    "tf_legacy_loss",
    "pruned_heads",
    "early_stopping",
    "diversity_penalty",
    "num_beam_groups",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "encoder_no_repeat_ngram_size",
    "encoder_hidden_size",
    "router_aux_loss_coef",
    "output_router_logits",
    "layer_norm_eps_unused",
    "use_mrope",
    "vision_start_token",
    "spatial_merge_size",
    "use_flash_attn",
    "initializer_factor",
    "model_name",
    "downsample_factor",
    "projector_hidden_act",
    "projector_bias",
    "projector_hidden_size",
    "vision_feature_layer",
    "image_token_index",
    "do_image_splitting",
    "min_tiles",
    "max_tiles",
    "use_thumbnail",
    "min_image_tokens",
    "max_image_tokens",
    "encoder_patch_size",
    "tile_size",
    "max_pixels_tolerance",
    "use_image_special_tokens",
    "projector_use_layernorm",
    "vision_soft_tokens_per_image",
    "audio_soft_tokens_per_image",
];

/// The parsed config with a record of the keys read, so unread keys can be listed.
struct Cfg<'a> {
    top: &'a Map<String, Value>,
    text: Option<&'a Map<String, Value>>,
    read: std::cell::RefCell<BTreeSet<String>>,
}

impl<'a> Cfg<'a> {
    /// Looks a text key up at the top level, then in `text_config`; JSON null is absent.
    fn get(&self, key: &str) -> Option<(&'a Value, String)> {
        self.read.borrow_mut().insert(key.to_string());
        if let Some(v) = self.top.get(key).filter(|v| !v.is_null()) {
            return Some((v, format!("config:{key}")));
        }
        self.text
            .and_then(|t| t.get(key))
            .filter(|v| !v.is_null())
            .map(|v| (v, format!("config:text_config.{key}")))
    }

    fn u64(&self, key: &str) -> Option<(u64, String)> {
        let (v, s) = self.get(key)?;
        v.as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| f as u64)
            })
            .map(|n| (n, s))
    }

    fn f64(&self, key: &str) -> Option<(f64, String)> {
        let (v, s) = self.get(key)?;
        v.as_f64().map(|n| (n, s))
    }

    fn bool(&self, key: &str) -> Option<(bool, String)> {
        let (v, s) = self.get(key)?;
        v.as_bool().map(|b| (b, s))
    }

    fn str(&self, key: &str) -> Option<(&'a str, String)> {
        let (v, s) = self.get(key)?;
        v.as_str().map(|b| (b, s))
    }
}

/// Accumulates decisions.
struct Log {
    decisions: Vec<Decision>,
}

impl Log {
    fn add(
        &mut self,
        name: &str,
        value: impl ToString,
        source: impl Into<String>,
        tag: Option<&str>,
    ) {
        self.decisions.push(Decision {
            name: name.to_string(),
            value: value.to_string(),
            source: source.into(),
            tag: tag.map(str::to_string),
            flag: None,
        });
    }

    fn flag(&mut self, flag: impl Into<String>) {
        if let Some(d) = self.decisions.last_mut() {
            d.flag = Some(flag.into());
        }
    }
}

fn fmt_f(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The family of a config, after unwrapping multimodal wrappers (semantics.md §2).
fn family_of(top: &Map<String, Value>) -> Result<(Family, String), Refusal> {
    let outer = top.get("model_type").and_then(Value::as_str).unwrap_or("");
    let inner = top
        .get("text_config")
        .and_then(|t| t.get("model_type"))
        .and_then(Value::as_str);
    let wrappers = [
        "gemma3",
        "gemma4",
        "qwen3_vl",
        "qwen2_5_vl",
        "qwen3_5",
        "lfm2_vl",
        "lfm2-vl",
    ];
    let mt = match inner {
        Some(i) if wrappers.contains(&outer) => i,
        _ => outer,
    };
    let fam = match mt {
        "" => {
            return Err(Refusal::new(
                "",
                "model_type",
                "absent",
                "config.json has no model_type",
            ));
        }
        "llama" => Family::Llama,
        "nanbeige" => Family::Nanbeige,
        "granite" => Family::Granite,
        "qwen2" | "qwen2_5_vl" | "qwen2_5_vl_text" => Family::Qwen2,
        "qwen3" | "qwen3_vl_text" | "qwen3_vl" => Family::Qwen3,
        "qwen3_5" | "qwen3_5_text" => Family::Qwen3_5,
        "gemma3" | "gemma3_text" => Family::Gemma3,
        "gemma4" | "gemma4_text" => Family::Gemma4,
        "hunyuan_v1_dense" => Family::Hunyuan,
        "lfm2" | "lfm2_vl" | "lfm2-vl" => Family::Lfm2,
        "phi3" => Family::Phi3,
        "gpt_oss" => Family::GptOss,
        "gemma2" => {
            return Err(Refusal::new(
                mt,
                "model_type",
                mt,
                "model_type \"gemma2\": known to answer garbage although its head fits (scale 0.992, rel 1.07x its 4-bit floor); refused until a pack verifies end to end",
            ));
        }
        "qwen3_next" => {
            return Err(Refusal::new(
                mt,
                "model_type",
                mt,
                "model_type \"qwen3_next\" (Qwen3NextForCausalLM) has no semantics table; it is not treated as qwen3_5",
            ));
        }
        "granitemoehybrid" => {
            return Err(Refusal::new(
                mt,
                "layer_types",
                "mamba",
                "model_type \"granitemoehybrid\": layer_types contains \"mamba\" (no mamba layer kind)",
            ));
        }
        "lfm2_moe" => {
            let n = top.get("num_experts").and_then(Value::as_u64).unwrap_or(0);
            return Err(Refusal::new(
                mt,
                "model_type",
                mt,
                format!("model_type \"lfm2_moe\" (num_experts {n}): no MoE route for this family"),
            ));
        }
        other => {
            return Err(Refusal::new(
                other,
                "model_type",
                other,
                format!("model_type \"{other}\" has no semantics table"),
            ));
        }
    };
    Ok((fam, mt.to_string()))
}

/// Derives the semantics of a config. Never panics on any JSON: anything unusable is a refusal.
pub fn derive(config: &Value, side: &SideFiles<'_>) -> Result<Semantics, Refusal> {
    let top = config.as_object().ok_or_else(|| {
        Refusal::new(
            "",
            "config.json",
            "not an object",
            "config.json is not a JSON object",
        )
    })?;
    let (family, model_type) = family_of(top)?;
    let cfg = Cfg {
        top,
        text: top.get("text_config").and_then(Value::as_object),
        read: Default::default(),
    };
    let mut log = Log {
        decisions: Vec::new(),
    };
    let mt = model_type.as_str();
    let fam_name = serde_json::to_value(family)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    log.add("family", fam_name, format!("config:model_type {mt}"), None);
    let fam_default = |k: &str| format!("default ({mt}): config omits {k}");
    let need = |k: &str, v: Option<(u64, String)>| -> Result<(u64, String), Refusal> {
        v.filter(|(n, _)| *n > 0).ok_or_else(|| {
            Refusal::new(
                mt,
                k,
                "absent",
                format!("config.json has no usable {k} and {mt} has no default for it"),
            )
        })
    };
    let gemma3 = family == Family::Gemma3;
    let gemma = matches!(family, Family::Gemma3 | Family::Gemma4);

    // Dimensions first (semantics.md §2, §3).
    let hidden = need(
        "hidden_size",
        cfg.u64("hidden_size").or_else(|| cfg.u64("block_dim")),
    )?;
    log.add("hidden", hidden.0, hidden.1, None);
    let layers = need("num_hidden_layers", cfg.u64("num_hidden_layers"))?;
    log.add("layers", layers.0, layers.1, None);
    if layers.0 > MAX_LAYERS {
        return Err(Refusal::new(
            mt,
            "num_hidden_layers",
            layers.0,
            format!("num_hidden_layers {} exceeds {MAX_LAYERS}", layers.0),
        ));
    }
    let heads = match cfg
        .u64("num_attention_heads")
        .or_else(|| cfg.u64("num_heads"))
    {
        Some(h) if h.0 > 0 => h,
        _ if gemma3 => (8, fam_default("num_attention_heads")),
        _ => need("num_attention_heads", None)?,
    };
    let tag_default = |src: &str| {
        if src.starts_with("default") {
            Some("hf")
        } else {
            None
        }
    };
    log.add("heads", heads.0, heads.1.clone(), tag_default(&heads.1));
    let kv = match cfg.u64("num_key_value_heads") {
        Some(k) if k.0 > 0 => k,
        _ if gemma3 => (4, fam_default("num_key_value_heads")),
        _ => (
            heads.0,
            "config:num_attention_heads (num_key_value_heads absent: MHA)".to_string(),
        ),
    };
    log.add("kv_heads", kv.0, kv.1, None);
    if heads.0 % kv.0 != 0 {
        return Err(Refusal::new(
            mt,
            "num_key_value_heads",
            kv.0,
            format!(
                "config.json has {} attention heads and {} key/value heads; the key/value heads must divide the attention heads",
                heads.0, kv.0
            ),
        ));
    }
    let head_dim = match (cfg.u64("head_dim"), cfg.u64("attention_head_dim")) {
        (Some(a), Some(b)) if a.0 != b.0 => {
            return Err(Refusal::new(
                mt,
                "head_dim",
                a.0,
                format!("head_dim {} but attention_head_dim {} ({mt})", a.0, b.0),
            ));
        }
        (Some(a), _) if a.0 > 0 => a,
        (_, Some(b)) if b.0 > 0 => b,
        _ => match family {
            Family::Qwen3 => (128, fam_default("head_dim")),
            Family::Qwen3_5 | Family::Gemma3 | Family::Gemma4 => (256, fam_default("head_dim")),
            _ => (
                hidden.0 / heads.0,
                format!(
                    "config:hidden_size / num_attention_heads ({} / {})",
                    hidden.0, heads.0
                ),
            ),
        },
    };
    log.add("head_dim", head_dim.0, head_dim.1, None);
    let d = head_dim.0;
    let vocab = match cfg.u64("vocab_size") {
        Some(v) if v.0 > 0 => v,
        _ if gemma3 => (262208, fam_default("vocab_size")),
        _ => need("vocab_size", None)?,
    };
    log.add("vocab", vocab.0, vocab.1, None);

    // FFN width (LFM2 auto-adjust, MoE per-expert width).
    let mut intermediate = cfg
        .u64("intermediate_size")
        .or_else(|| cfg.u64("block_ff_dim"))
        .filter(|v| v.0 > 0)
        .ok_or_else(|| {
            Refusal::new(
                mt,
                "intermediate_size",
                "absent",
                "config.json has no intermediate_size",
            )
        })?;
    if family == Family::Lfm2
        && cfg.bool("block_auto_adjust_ff_dim").is_some_and(|b| b.0)
        && let (Some(mult), Some(m)) = (
            cfg.f64("block_ffn_dim_multiplier"),
            cfg.u64("block_multiple_of"),
        )
    {
        let base = cfg.u64("block_ff_dim").map_or(intermediate.0, |b| b.0);
        let inner = (mult.0 * ((2 * base) / 3) as f64) as u64;
        let adjusted = m.0.saturating_mul(inner.div_ceil(m.0.max(1)));
        intermediate = (
            adjusted,
            format!(
                "config:block_ff_dim {base} auto-adjusted ({} · ceil(int({} · int(2·{base}/3)) / {})); the gate_proj tile count confirms",
                m.0,
                fmt_f(mult.0),
                m.0
            ),
        );
    }
    log.add("intermediate", intermediate.0, intermediate.1, None);

    // Layer kinds.
    let n_layers = layers.0 as usize;
    let window = cfg.u64("sliding_window").map(|w| w.0).filter(|w| *w > 0);
    let use_window = cfg.bool("use_sliding_window");
    let window_on = window.is_some() && use_window.as_ref().is_none_or(|b| b.0);
    if window.is_some() && !window_on {
        log.add(
            "sliding_window",
            "off",
            "config:use_sliding_window false (sliding_window and max_window_layers have no effect)",
            Some("hf"),
        );
        let _ = cfg.get("max_window_layers");
    }
    // Aliases and keys made moot by others: read so they are not reported as unknown.
    for k in [
        "block_dim",
        "num_heads",
        "block_norm_eps",
        "full_attention_interval",
        "sliding_window_pattern",
    ] {
        let _ = cfg.get(k);
    }
    if family == Family::Lfm2 {
        if let Some((l, s)) = cfg.u64("conv_L_cache") {
            log.add("conv_kernel", l, s, Some("inferred"));
        }
        if let Some((b, s)) = cfg.bool("conv_bias") {
            if b {
                return Err(Refusal::new(
                    mt,
                    "conv_bias",
                    true,
                    "lfm2 conv_bias true is not implemented",
                ));
            }
            log.add("conv_bias", 0, s, Some("inferred"));
        }
    }
    let mut kinds = vec![LayerKind::FullAttention; n_layers];
    let mut kind_source = format!("family:{mt} (every layer full attention)");
    if let Some((Value::Array(types), src)) = cfg.get("layer_types") {
        if types.len() != n_layers {
            return Err(Refusal::new(
                mt,
                "layer_types",
                types.len(),
                format!(
                    "layer_types has {} entries for {n_layers} layers",
                    types.len()
                ),
            ));
        }
        for (i, t) in types.iter().enumerate() {
            kinds[i] = match t.as_str().unwrap_or("") {
                "full_attention" | "attention" => LayerKind::FullAttention,
                "sliding_attention" => LayerKind::SlidingAttention {
                    window: window.unwrap_or(0),
                },
                "linear_attention" if family == Family::Qwen3_5 => LayerKind::LinearAttention,
                "conv" if family == Family::Lfm2 => LayerKind::Conv,
                other => {
                    return Err(Refusal::new(
                        mt,
                        &format!("layer_types[{i}]"),
                        other,
                        format!(
                            "layer_types[{i}] is \"{other}\", a layer kind {mt} has no implementation for"
                        ),
                    ));
                }
            };
        }
        kind_source = src;
    } else {
        match family {
            Family::Gemma3 => {
                let (p, s) = cfg
                    .u64("sliding_window_pattern")
                    .unwrap_or((6, fam_default("sliding_window_pattern")));
                let w = window.unwrap_or(512);
                for (i, k) in kinds.iter_mut().enumerate() {
                    if (i + 1) % p.max(1) as usize != 0 {
                        *k = LayerKind::SlidingAttention { window: w };
                    }
                }
                kind_source = format!("{s}: layer i full iff (i+1) % {p} == 0 [seed #2248]");
            }
            Family::Gemma4 => {
                let w = window.unwrap_or(512);
                for (i, k) in kinds.iter_mut().enumerate() {
                    if (i + 1) % 6 != 0 && i + 1 != n_layers {
                        *k = LayerKind::SlidingAttention { window: w };
                    }
                }
                kind_source = "default (gemma4): 5:1 pattern, last layer full [hf]".into();
            }
            Family::Qwen3_5 => {
                let (n, s) = cfg
                    .u64("full_attention_interval")
                    .unwrap_or((4, fam_default("full_attention_interval")));
                for (i, k) in kinds.iter_mut().enumerate() {
                    if i as u64 % n.max(1) != n.max(1) - 1 {
                        *k = LayerKind::LinearAttention;
                    }
                }
                kind_source = format!("{s}: layer i full iff i % {n} == {}", n.max(1) - 1);
            }
            Family::Lfm2 => {
                if let Some((Value::Array(idx), s)) = cfg.get("full_attn_idxs") {
                    let set: BTreeSet<u64> = idx.iter().filter_map(Value::as_u64).collect();
                    for (i, k) in kinds.iter_mut().enumerate() {
                        if !set.contains(&(i as u64)) {
                            *k = LayerKind::Conv;
                        }
                    }
                    kind_source = format!("{s} (the rest conv)");
                }
            }
            Family::GptOss => {
                let w = window.unwrap_or(128);
                for (i, k) in kinds.iter_mut().enumerate() {
                    if i % 2 == 0 {
                        *k = LayerKind::SlidingAttention { window: w };
                    }
                }
                kind_source = "family:gpt_oss alternating, sliding first".into();
            }
            Family::Qwen2 if window_on => {
                let (m, s) = cfg
                    .u64("max_window_layers")
                    .unwrap_or((0, "default".into()));
                for (i, k) in kinds.iter_mut().enumerate() {
                    if i as u64 >= m {
                        *k = LayerKind::SlidingAttention {
                            window: window.unwrap_or(0),
                        };
                    }
                }
                kind_source = format!("config:use_sliding_window; {s}: layers ≥ {m} sliding");
            }
            Family::Qwen3 if window_on => {
                return Err(Refusal::new(
                    mt,
                    "use_sliding_window",
                    true,
                    "qwen3 use_sliding_window true is not implemented (no NPU2 pack uses it)",
                ));
            }
            _ => {}
        }
    }
    if family == Family::Gemma4 && kinds.last() != Some(&LayerKind::FullAttention) {
        kinds[n_layers - 1] = LayerKind::FullAttention;
        log.add(
            "layer_kind_last",
            "full",
            "family:gemma4 forces the last layer full",
            Some("hf"),
        );
        log.flag("layer_types states the last layer otherwise");
    }
    // Sliding layers need a window.
    if kinds
        .iter()
        .any(|k| matches!(k, LayerKind::SlidingAttention { window: 0 }))
    {
        return Err(Refusal::new(
            mt,
            "sliding_window",
            "absent",
            "sliding_attention layers but no sliding_window",
        ));
    }
    let mix: BTreeMap<String, usize> = kinds.iter().fold(BTreeMap::new(), |mut m, k| {
        *m.entry(k.name()).or_default() += 1;
        m
    });
    log.add(
        "layer_mix",
        mix.iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(" "),
        kind_source,
        None,
    );
    for (i, k) in kinds.iter().enumerate() {
        if !matches!(k, LayerKind::FullAttention) || mix.len() > 1 {
            log.add(&format!("layer_kind[{i}]"), k.name(), "layer mix", None);
        }
    }

    // Linear attention geometry (Qwen3.5).
    let mut linear = None;
    if kinds.contains(&LayerKind::LinearAttention) {
        let n_lin = kinds
            .iter()
            .filter(|k| **k == LayerKind::LinearAttention)
            .count();
        let g = |k: &str| cfg.u64(k).map(|v| v.0).filter(|v| *v > 0);
        match (
            g("linear_num_key_heads"),
            g("linear_key_head_dim"),
            g("linear_num_value_heads"),
            g("linear_value_head_dim"),
        ) {
            (Some(kh), Some(kd), Some(vh), Some(vd)) => {
                let conv = g("linear_conv_kernel_dim").unwrap_or(4);
                log.add(
                    "linear",
                    format!(
                        "key {kh}x{kd}, value {vh}x{vd}, conv channels {}, kernel {conv}",
                        kh.saturating_mul(kd).saturating_mul(2).saturating_add(vh.saturating_mul(vd))
                    ),
                    "config:linear_num_key_heads, linear_key_head_dim, linear_num_value_heads, linear_value_head_dim, linear_conv_kernel_dim",
                    Some("inferred·ref"),
                );
                linear = Some(LinearDims {
                    key_heads: kh,
                    key_head_dim: kd,
                    value_heads: vh,
                    value_head_dim: vd,
                    conv_kernel: conv,
                });
            }
            _ => {
                return Err(Refusal::new(
                    mt,
                    "linear_num_key_heads",
                    "absent",
                    format!(
                        "{n_lin} layer(s) are linear_attention but the config has no usable linear_num_*/linear_*_head_dim dims"
                    ),
                ));
            }
        }
    }

    // RoPE.
    let rope = derive_rope(&cfg, &mut log, family, mt, d, &kinds)?;

    // q/k norm.
    let qk_norm = match family {
        Family::Qwen3 | Family::Qwen3_5 | Family::Gemma3 | Family::Gemma4 | Family::Lfm2 => {
            log.add(
                "qk_norm",
                "before_rope",
                format!("family:{mt} (per-head RMSNorm, then RoPE)"),
                Some("inferred·ref"),
            );
            QkNorm::BeforeRope
        }
        Family::Hunyuan => {
            match cfg.bool("use_qk_norm") {
                Some((false, s)) => {
                    log.add("qk_norm", "after_rope", format!("{s} false, but transformers applies the norm whenever the weights exist"), Some("hf"));
                    log.flag(
                        "use_qk_norm false: the pack's q_norm/k_norm weights decide (check_pack)",
                    );
                    QkNorm::AfterRope
                }
                Some((true, s)) => {
                    log.add(
                        "qk_norm",
                        "after_rope",
                        format!("{s}; order: RoPE, then norm (family:hunyuan_v1_dense)"),
                        Some("seed #2218"),
                    );
                    QkNorm::AfterRope
                }
                None => {
                    log.add(
                        "qk_norm",
                        "after_rope",
                        "default (hunyuan_v1_dense): use_qk_norm absent; order: RoPE, then norm",
                        Some("hf"),
                    );
                    QkNorm::AfterRope
                }
            }
        }
        _ => {
            log.add("qk_norm", "off", format!("family:{mt}"), None);
            QkNorm::Off
        }
    };

    // Norm form.
    let norm_form = match family {
        Family::Gemma3 => {
            log.add(
                "norm_form",
                "stored_1+w (apply as stored)",
                "family:gemma3 (the pack stores 1+w)",
                Some("seed #2248"),
            );
            NormForm::StoredOnePlusW
        }
        Family::Qwen3_5 => {
            log.add(
                "norm_form",
                "stored_w+1 (apply as stored, ssm_norm plain)",
                "family:qwen3_5 (llama.cpp convention)",
                Some("inferred"),
            );
            NormForm::StoredOnePlusW
        }
        _ => {
            log.add("norm_form", "w", format!("family:{mt}"), None);
            NormForm::W
        }
    };

    // eps.
    let eps = match cfg
        .f64("rms_norm_eps")
        .or_else(|| cfg.f64("norm_eps"))
        .or_else(|| cfg.f64("block_norm_eps"))
    {
        Some(e) => e,
        None if gemma3 => (1e-6, fam_default("rms_norm_eps")),
        None => {
            log.add("eps", "0.000001", "default", None);
            log.flag("no rms_norm_eps/norm_eps/block_norm_eps");
            (1e-6, String::new())
        }
    };
    if !eps.1.is_empty() {
        log.add("eps", format!("{:e}", eps.0), eps.1.clone(), None);
    }

    // Activation.
    let act_key = if gemma {
        "hidden_activation"
    } else {
        "hidden_act"
    };
    let (act_name, act_src) = match cfg.str(act_key) {
        Some((a, s)) => (a.to_string(), s),
        None if gemma => (
            "gelu_pytorch_tanh".to_string(),
            fam_default("hidden_activation"),
        ),
        None => (
            "silu".to_string(),
            format!("default ({mt}): {act_key} absent"),
        ),
    };
    let activation = match act_name.as_str() {
        "silu" | "swish" => Activation::Silu,
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
        other => {
            return Err(Refusal::new(
                mt,
                act_key,
                other,
                format!("{act_key} \"{other}\" is not implemented (silu, gelu_pytorch_tanh)"),
            ));
        }
    };
    log.add(
        "activation",
        &act_name,
        act_src,
        if gemma { Some("hf") } else { None },
    );

    // Attention scale, softcaps, multipliers.
    let mut multipliers = None;
    let attn_scale = match family {
        Family::Gemma3 => {
            let (q, s) = cfg
                .f64("query_pre_attn_scalar")
                .unwrap_or((256.0, fam_default("query_pre_attn_scalar")));
            log.add(
                "attn_scale",
                fmt_f(q.powf(-0.5)),
                format!("{s} {}^-1/2", fmt_f(q)),
                Some("seed #2248"),
            );
            q.powf(-0.5)
        }
        Family::Gemma4 => {
            log.add("attn_scale", "1", "family:gemma4", Some("inferred·ref"));
            1.0
        }
        Family::Granite => {
            let get = |k: &str| cfg.f64(k).map(|v| v.0);
            let (a, e, r, l) = (
                get("attention_multiplier"),
                get("embedding_multiplier"),
                get("residual_multiplier"),
                get("logits_scaling"),
            );
            let m = Multipliers {
                attention: a.unwrap_or(1.0 / (d as f64).sqrt()),
                embedding: e.unwrap_or(1.0),
                residual: r.unwrap_or(1.0),
                logits_scaling: l.unwrap_or(1.0),
            };
            log.add(
                "multipliers",
                format!("attention {}, embedding {}, residual {}, logits ÷ {}", fmt_f(m.attention), fmt_f(m.embedding), fmt_f(m.residual), fmt_f(m.logits_scaling)),
                "config:attention_multiplier, embedding_multiplier, residual_multiplier, logits_scaling",
                Some("inferred"),
            );
            log.flag("granite_folded undecided: decide by data (GGUF q scale ratio or tie ratio); never apply twice");
            let s = m.attention;
            multipliers = Some(m);
            s
        }
        _ => {
            let s = 1.0 / (d as f64).sqrt();
            log.add(
                "attn_scale",
                fmt_f(s),
                format!("1/√head_dim (family:{mt})"),
                None,
            );
            s
        }
    };
    let final_softcap = cfg.f64("final_logit_softcapping").map(|v| v.0);
    let attn_softcap = cfg.f64("attn_logit_softcapping").map(|v| v.0);
    if gemma3 && (final_softcap.is_some() || attn_softcap.is_some()) {
        return Err(Refusal::new(
            mt,
            "final_logit_softcapping",
            final_softcap.or(attn_softcap).unwrap_or(0.0),
            "gemma3 with a logit softcap is not implemented",
        ));
    }
    if let Some(c) = final_softcap {
        log.add(
            "final_softcap",
            fmt_f(c),
            "config:final_logit_softcapping",
            None,
        );
    }
    if let Some(c) = attn_softcap {
        log.add(
            "attn_softcap",
            fmt_f(c),
            "config:attn_logit_softcapping",
            None,
        );
    }

    // Biases.
    let (mut qkv_bias, mut o_bias) = (false, false);
    if family == Family::Qwen2 {
        qkv_bias = true;
        log.add(
            "qkv_bias",
            1,
            "family:qwen2 (q/k/v biases always, none on o_proj)",
            Some("inferred"),
        );
    }
    if let Some((b, s)) = cfg.bool("attention_bias") {
        if b && family == Family::Hunyuan {
            return Err(Refusal::new(
                mt,
                "attention_bias",
                true,
                "hunyuan_v1_dense attention_bias true is not implemented",
            ));
        }
        if b {
            qkv_bias = true;
            o_bias = true;
        }
        log.add("attention_bias", b as u8, s, Some("hf"));
    }
    let mlp_bias = match cfg.bool("mlp_bias") {
        Some((true, _)) if family == Family::Hunyuan => {
            return Err(Refusal::new(
                mt,
                "mlp_bias",
                true,
                "hunyuan_v1_dense mlp_bias true is not implemented",
            ));
        }
        Some((b, s)) => {
            log.add("mlp_bias", b as u8, s, Some("hf"));
            b
        }
        None => false,
    };

    // Hunyuan refusals.
    if family == Family::Hunyuan {
        if cfg.bool("use_cla").is_some_and(|b| b.0) {
            return Err(Refusal::new(
                mt,
                "use_cla",
                true,
                "hunyuan_v1_dense use_cla true (cross-layer attention) is not implemented",
            ));
        }
        if let Some((n, _)) = cfg.str("norm_type")
            && n != "rms"
        {
            return Err(Refusal::new(
                mt,
                "norm_type",
                n,
                format!("hunyuan_v1_dense norm_type \"{n}\" is not implemented (rms)"),
            ));
        }
        for k in ["num_experts", "moe_topk"] {
            if cfg.get(k).is_some() {
                return Err(Refusal::new(
                    mt,
                    k,
                    "present",
                    format!("hunyuan_v1_dense {k}: MoE is not implemented"),
                ));
            }
        }
    }

    // Gemma bidirectional attention and gemma4 specifics.
    if let Some((v, _)) = cfg.get("use_bidirectional_attention") {
        let all = v.as_bool() == Some(true) || v.as_str() == Some("all");
        if all {
            return Err(Refusal::new(
                mt,
                "use_bidirectional_attention",
                v,
                format!("{mt} use_bidirectional_attention {v}: attention is not causal"),
            ));
        }
    }
    if family == Family::Gemma4 {
        for k in ["attention_k_eq_v", "enable_moe_block"] {
            if cfg.bool(k).is_some_and(|b| b.0) {
                return Err(Refusal::new(
                    mt,
                    k,
                    true,
                    format!("gemma4 {k} true: no pack and no implementation"),
                ));
            }
        }
        for k in [
            "global_head_dim",
            "hidden_size_per_layer_input",
            "num_kv_shared_layers",
        ] {
            if let Some((v, s)) = cfg.u64(k) {
                log.add(k, v, s, Some("hf"));
            }
        }
        if let Some((b, s)) = cfg.bool("use_double_wide_mlp") {
            log.add("use_double_wide_mlp", b as u8, s, Some("hf"));
        }
    }

    // MoE.
    let mut moe = None;
    if family == Family::GptOss {
        let e = cfg.u64("num_local_experts").map(|v| v.0).unwrap_or(0);
        let k = cfg
            .u64("num_experts_per_tok")
            .or_else(|| cfg.u64("experts_per_token"))
            .map(|v| v.0)
            .unwrap_or(0);
        log.add(
            "moe",
            format!("{e} experts, {k} per token"),
            "config:num_local_experts, num_experts_per_tok",
            Some("inferred"),
        );
        moe = Some(Moe {
            experts: e,
            per_token: k,
        });
        log.add(
            "attn_sinks",
            1,
            "family:gpt_oss (self_attn.sinks)",
            Some("inferred"),
        );
        if let Some((l, s)) = cfg.f64("swiglu_limit") {
            log.add("swiglu_limit", fmt_f(l), s, Some("inferred"));
        }
    } else {
        for k in ["num_experts", "num_local_experts", "moe_intermediate_size"] {
            if cfg.get(k).and_then(|v| v.0.as_u64()).is_some_and(|n| n > 0)
                && family != Family::Hunyuan
            {
                return Err(Refusal::new(
                    mt,
                    k,
                    "present",
                    format!("{mt} {k}: no MoE route for this family"),
                ));
            }
        }
    }

    // Tie.
    let tie_default = matches!(family, Family::Gemma3 | Family::Gemma4 | Family::Lfm2);
    let tied = match cfg
        .bool("tie_word_embeddings")
        .or_else(|| cfg.bool("tie_embedding"))
    {
        Some((t, s)) => {
            log.add("tied", t as u8, format!("{s}; the tie test confirms"), None);
            t
        }
        None => {
            log.add(
                "tied",
                tie_default as u8,
                format!("default ({mt}): tie_word_embeddings absent; the tie test confirms"),
                Some("hf"),
            );
            tie_default
        }
    };
    if family == Family::Nanbeige && tied {
        log.flag("nanbeige heads are untied in every known pack");
    }

    // Embedding scale.
    let (embed_scale, embed_prescaled) = match family {
        Family::Gemma3 => {
            let s = (hidden.0 as f64).sqrt();
            log.add("embed_scale", fmt_f(s), "family:gemma3 √hidden; the pack stores the embedding pre-scaled: do not scale the input again", Some("golden"));
            (Some(s), true)
        }
        Family::Gemma4 => {
            let s = (hidden.0 as f64).sqrt();
            log.add(
                "embed_scale",
                fmt_f(s),
                "family:gemma4 √hidden (rounded to the weight dtype)",
                Some("hf"),
            );
            log.flag("whether the pack stores it pre-scaled is decided by data");
            (Some(s), false)
        }
        Family::Granite => (multipliers.as_ref().map(|m| m.embedding), false),
        _ => (None, false),
    };

    let attn_output_gate = match cfg.bool("attn_output_gate") {
        Some((g, s)) => {
            log.add("attn_output_gate", g as u8, s, Some("golden"));
            g
        }
        None if family == Family::Qwen3_5 => {
            log.add(
                "attn_output_gate",
                1,
                fam_default("attn_output_gate"),
                Some("inferred"),
            );
            true
        }
        None => false,
    };
    let tile_order = if family == Family::Hunyuan {
        "qkv"
    } else {
        "kqv"
    };
    log.add(
        "tile_order",
        tile_order,
        format!(
            "family:{mt}{}",
            if family == Family::Hunyuan {
                " (fused payloads store q, k, v)"
            } else {
                ""
            }
        ),
        if family == Family::Hunyuan {
            Some("seed #2218")
        } else {
            None
        },
    );
    let context = cfg.u64("max_position_embeddings").map(|v| v.0);
    if let Some(c) = context {
        log.add("context", c, "config:max_position_embeddings", None);
    }

    // Tokens.
    let toks = tokens::derive(&cfg, side, &mut log);

    // Ignored and unknown keys.
    let read = cfg.read.borrow().clone();
    let mut ignored = Vec::new();
    let mut unknown = Vec::new();
    let mut seen = BTreeSet::new();
    for map in std::iter::once(top).chain(cfg.text) {
        for k in map.keys() {
            if !seen.insert(k.clone()) || read.contains(k) {
                continue;
            }
            if IGNORED.contains(&k.as_str()) || k.ends_with("_dropout") || k.ends_with("_pdrop") {
                ignored.push(k.clone());
            } else if !tokens::TOKEN_KEYS.contains(&k.as_str()) {
                unknown.push(k.clone());
            }
        }
    }

    Ok(Semantics {
        family,
        model_type: mt.to_string(),
        hidden: hidden.0,
        layers: layers.0,
        heads: heads.0,
        kv_heads: kv.0,
        head_dim: d,
        intermediate: intermediate.0,
        vocab: vocab.0,
        eps: eps.0,
        activation,
        layer_kinds: kinds,
        rope,
        qk_norm,
        norm_form,
        attn_scale,
        qkv_bias,
        o_bias,
        mlp_bias,
        tied,
        embed_scale,
        embed_prescaled,
        final_softcap,
        attn_softcap,
        multipliers,
        tile_order: tile_order.into(),
        attn_output_gate,
        linear,
        moe,
        attn_sinks: family == Family::GptOss,
        bos_id: toks.bos_id,
        add_bos: toks.add_bos,
        eos_ids: toks.eos_ids,
        pad_id: toks.pad_id,
        chat_template: toks.chat_template,
        context,
        decisions: log.decisions,
        ignored,
        unknown,
    })
}

/// One RoPE block normalised from the v4 or v5 spelling.
struct RopeBlock<'a> {
    theta: Option<(f64, String)>,
    ty: String,
    params: Option<&'a Map<String, Value>>,
    src: String,
}

fn rope_block<'a>(cfg: &Cfg<'a>, kind: Option<&str>) -> RopeBlock<'a> {
    let top_theta = cfg.f64("rope_theta");
    if let Some((Value::Object(p), src)) = cfg.get("rope_parameters") {
        let block = match kind.and_then(|k| p.get(k)).and_then(Value::as_object) {
            Some(b) => b,
            None => p,
        };
        let bsrc = match kind {
            Some(k) if p.contains_key(k) => format!("{src}.{k}"),
            _ => src,
        };
        let theta = block
            .get("rope_theta")
            .and_then(Value::as_f64)
            .map(|t| (t, format!("{bsrc}.rope_theta")))
            .or(top_theta);
        let ty = block
            .get("rope_type")
            .or_else(|| block.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        return RopeBlock {
            theta,
            ty: ty.to_string(),
            params: Some(block),
            src: bsrc,
        };
    }
    match cfg.get("rope_scaling") {
        Some((Value::Object(s), src)) => {
            let ty = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            RopeBlock {
                theta: top_theta,
                ty: ty.to_string(),
                params: Some(s),
                src,
            }
        }
        _ => RopeBlock {
            theta: top_theta,
            ty: "default".into(),
            params: None,
            src: "config".into(),
        },
    }
}

fn pf(p: Option<&Map<String, Value>>, k: &str) -> Option<f64> {
    p.and_then(|m| m.get(k)).and_then(Value::as_f64)
}

fn derive_rope(
    cfg: &Cfg<'_>,
    log: &mut Log,
    family: Family,
    mt: &str,
    d: u64,
    kinds: &[LayerKind],
) -> Result<BTreeMap<String, Rope>, Refusal> {
    let mut out = BTreeMap::new();
    let wanted: BTreeSet<&str> = kinds.iter().filter_map(LayerKind::rope_key).collect();
    for kind in wanted {
        let v5_key = if kind == "full" {
            "full_attention"
        } else {
            "sliding_attention"
        };
        let b = rope_block(cfg, Some(v5_key));
        let default_theta = match family {
            Family::Gemma3 if kind == "full" => 1e6,
            Family::Lfm2 => 1e6,
            Family::GptOss => 1.5e5,
            Family::Gemma4 if kind == "full" => 1e6,
            _ => 1e4,
        };
        let (mut theta, mut theta_src) = b
            .theta
            .clone()
            .unwrap_or((default_theta, format!("default ({mt}): rope_theta absent")));
        let partial = pf(b.params, "partial_rotary_factor")
            .map(|p| (p, format!("{}.partial_rotary_factor", b.src)))
            .or_else(|| cfg.f64("partial_rotary_factor"))
            .or(match family {
                Family::Qwen3_5 => Some((
                    0.25,
                    format!("default ({mt}): partial_rotary_factor absent"),
                )),
                _ => None,
            });
        let mut rotary_dim = d;
        if let Some((p, s)) = &partial {
            rotary_dim = (*p * d as f64).round() as u64;
            log.add(
                &format!("rotary_dim[{kind}]"),
                rotary_dim,
                format!("{s} {} × head_dim {d}", fmt_f(*p)),
                None,
            );
        }
        let scaling = if family == Family::Gemma3 && kind == "sliding" {
            let (t, s) = cfg
                .f64("rope_local_base_freq")
                .unwrap_or((1e4, format!("default ({mt}): rope_local_base_freq absent")));
            theta = t;
            theta_src = format!("{s}; sliding layers are never scaled");
            RopeScaling::None
        } else {
            match (family, b.ty.as_str()) {
                (_, "default") => RopeScaling::None,
                (
                    Family::Qwen2 | Family::Qwen3 | Family::Qwen3_5,
                    "mrope" | "mrope_interleaved",
                ) => {
                    log.add(
                        &format!("rope_mrope[{kind}]"),
                        "plain for text",
                        format!("{} {}", b.src, b.ty),
                        Some("inferred·ref"),
                    );
                    RopeScaling::None
                }
                (_, t)
                    if (family == Family::Qwen2
                        || family == Family::Qwen3
                        || family == Family::Qwen3_5)
                        && b.params.is_some_and(|p| p.contains_key("mrope_section"))
                        && t != "default" =>
                {
                    return Err(Refusal::new(
                        mt,
                        "rope_scaling.rope_type",
                        t,
                        format!("{mt} rope_type \"{t}\" is not implemented"),
                    ));
                }
                (Family::Llama | Family::Nanbeige, "llama3") => RopeScaling::Llama3 {
                    factor: pf(b.params, "factor").unwrap_or(1.0),
                    low_freq_factor: pf(b.params, "low_freq_factor").unwrap_or(1.0),
                    high_freq_factor: pf(b.params, "high_freq_factor").unwrap_or(4.0),
                    original: pf(b.params, "original_max_position_embeddings").unwrap_or(8192.0),
                },
                (Family::Gemma3, "linear") => {
                    let f = pf(b.params, "factor").unwrap_or(1.0);
                    if cfg.get("rope_local_base_freq").is_none() {
                        log.add(
                            "rope_scale_variant",
                            "seed: every layer",
                            "config has no rope_local_base_freq",
                            Some("seed #2248"),
                        );
                        log.flag("the seed variant scales sliding layers too; this reader follows transformers and llama.cpp (full layers only)");
                    }
                    RopeScaling::Linear { factor: f }
                }
                (Family::Hunyuan, "dynamic") => {
                    let Some(alpha) = pf(b.params, "alpha") else {
                        return Err(Refusal::new(
                            mt,
                            "rope_scaling.type",
                            "dynamic",
                            "hunyuan_v1_dense rope_scaling.type \"dynamic\" has no alpha: length-dependent dynamic NTK is not implemented",
                        ));
                    };
                    for k in ["factor", "mscale", "mscale_all_dim"] {
                        if let Some(v) = pf(b.params, k)
                            && v != 1.0
                        {
                            log.add(
                                &format!("rope_scaling.{k}"),
                                fmt_f(v),
                                b.src.clone(),
                                Some("hf"),
                            );
                            log.flag("ignored with alpha (transformers), but not 1");
                        }
                    }
                    let declared = theta;
                    theta = declared * alpha.powf(d as f64 / (d as f64 - 2.0));
                    theta_src = format!(
                        "{theta_src} {} * {}.alpha {} ^ ({d}/{})",
                        fmt_f(declared),
                        b.src,
                        fmt_f(alpha),
                        d.saturating_sub(2)
                    );
                    RopeScaling::DynamicAlpha {
                        alpha,
                        theta: declared,
                    }
                }
                (Family::Phi3, "longrope") => {
                    let arr = |k: &str| -> Vec<f64> {
                        b.params
                            .and_then(|p| p.get(k))
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_f64).collect())
                            .unwrap_or_default()
                    };
                    let (short, long) = (arr("short_factor"), arr("long_factor"));
                    if short.len() as u64 != rotary_dim / 2 || long.len() as u64 != rotary_dim / 2 {
                        return Err(Refusal::new(
                            mt,
                            "rope_scaling.short_factor",
                            short.len(),
                            format!(
                                "longrope factors have {}/{} entries for {} frequencies",
                                short.len(),
                                long.len(),
                                rotary_dim / 2
                            ),
                        ));
                    }
                    let original = cfg
                        .f64("original_max_position_embeddings")
                        .map(|v| v.0)
                        .or(pf(b.params, "original_max_position_embeddings"))
                        .unwrap_or(4096.0);
                    let max = cfg
                        .f64("max_position_embeddings")
                        .map(|v| v.0)
                        .unwrap_or(original);
                    let mscale = if max > original {
                        (1.0 + (max / original).ln() / original.ln()).sqrt()
                    } else {
                        1.0
                    };
                    log.add(
                        "rope_longrope",
                        format!(
                            "original {}, max {}, mscale {:.5}",
                            fmt_f(original),
                            fmt_f(max),
                            mscale
                        ),
                        b.src.clone(),
                        Some("inferred·ref"),
                    );
                    RopeScaling::LongRope {
                        short,
                        long,
                        original,
                        max,
                        mscale,
                    }
                }
                (Family::GptOss, "yarn") => RopeScaling::Yarn {
                    factor: pf(b.params, "factor").unwrap_or(1.0),
                    beta_fast: pf(b.params, "beta_fast").unwrap_or(32.0),
                    beta_slow: pf(b.params, "beta_slow").unwrap_or(1.0),
                    original: pf(b.params, "original_max_position_embeddings").unwrap_or(4096.0),
                    truncate: b
                        .params
                        .and_then(|p| p.get("truncate"))
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                },
                (Family::Gemma4, "proportional") => RopeScaling::Proportional,
                (_, t) => {
                    return Err(Refusal::new(
                        mt,
                        &format!("{}.rope_type", b.src),
                        t,
                        format!("{mt} rope_type \"{t}\" is not implemented"),
                    ));
                }
            }
        };
        log.add(&format!("rope_base[{kind}]"), fmt_f(theta), theta_src, None);
        let name = match &scaling {
            RopeScaling::None => "none".to_string(),
            RopeScaling::Linear { factor } => format!("linear ÷{}", fmt_f(*factor)),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original,
            } => format!(
                "llama3 factor {} low {} high {} original {}",
                fmt_f(*factor),
                fmt_f(*low_freq_factor),
                fmt_f(*high_freq_factor),
                fmt_f(*original)
            ),
            RopeScaling::DynamicAlpha { alpha, .. } => {
                format!("dynamic alpha {} (applied to the base)", fmt_f(*alpha))
            }
            RopeScaling::LongRope { .. } => "longrope (short ≤ original, long above)".into(),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original,
                truncate,
            } => format!(
                "yarn factor {} beta_fast {} beta_slow {} original {} truncate {truncate}",
                fmt_f(*factor),
                fmt_f(*beta_fast),
                fmt_f(*beta_slow),
                fmt_f(*original)
            ),
            RopeScaling::Proportional => "proportional".into(),
        };
        let src = if family == Family::Gemma3 && kind == "sliding" {
            "family:gemma3 (sliding layers are never scaled)".to_string()
        } else if b.ty == "default" {
            format!("{} (no scaling)", b.src)
        } else {
            format!("{}.rope_type {}", b.src, b.ty)
        };
        log.add(&format!("rope_scaling[{kind}]"), name, src, None);
        out.insert(
            kind.to_string(),
            Rope {
                base: theta,
                rotary_dim,
                scaling,
            },
        );
    }
    Ok(out)
}
