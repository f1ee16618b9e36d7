//! The logical (rows, K) of each weight, from config.json (q4nx-format §1: the logical shape is not
//! stored; §4: family padding). This is the slice of the config semantics the tile reader needs;
//! every value records the key it came from.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Dimensions of a model, each with its source.
#[derive(Clone, Debug, Serialize)]
pub struct Geometry {
    /// `model_type` (after flattening `text_config`).
    pub model_type: String,
    /// Hidden width H.
    pub hidden: u64,
    /// FFN width I.
    pub intermediate: u64,
    /// Attention heads.
    pub heads: u64,
    /// KV heads.
    pub kv_heads: u64,
    /// Head dim D.
    pub head_dim: u64,
    /// Vocabulary size V.
    pub vocab: u64,
    /// Whether `q_proj` also holds the output gate (2·nH·D rows).
    pub q_gate: bool,
    /// FFN width padded to this multiple before tiling (1 = none).
    pub ffn_pad: u64,
    /// Gated-DeltaNet dims (Qwen3.5 `linear_num_key_heads` …): key heads, key dim, value heads,
    /// value dim.
    pub linear: Option<[u64; 4]>,
    /// One `name=value <- source` line per decision.
    pub decisions: Vec<String>,
}

/// The role of a weight, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Token embedding.
    Embedding,
    /// Output head.
    LmHead,
    /// Attention query (and gate).
    Q,
    /// Attention key.
    K,
    /// Attention value.
    V,
    /// Attention output.
    O,
    /// FFN gate.
    Gate,
    /// FFN up.
    Up,
    /// FFN down.
    Down,
    /// Gated-DeltaNet q/k/v projection (Qwen3.5 `linear_attn.qkv_proj`, `(2·KD + VD) × H`).
    LinearQkv,
    /// Gated-DeltaNet output gate z (Qwen3.5 `self_attn.gate_proj` on a linear layer, `VD × H`).
    LinearZ,
    /// Gated-DeltaNet decay or step input (`linear_attn.ssm_alpha_proj` / `ssm_beta_proj`,
    /// `nV × H`; FastFlowLM fills the rest of their 32-row tile with copies).
    LinearHead,
    /// Gated-DeltaNet output projection (`linear_attn.ssm_out_proj`, `H × VD`).
    LinearOut,
    /// Short-convolution input projection (LFM2 `shortconv.in_proj`: B, C and x, `3H × H`).
    ConvIn,
    /// Short-convolution output projection (LFM2 `shortconv.out_proj`, `H × H`).
    ConvOut,
    /// A norm weight.
    Norm,
    /// Anything else.
    Other,
}

impl Role {
    /// The role's name in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Embedding => "embedding",
            Role::LmHead => "lm_head",
            Role::Q => "q_proj",
            Role::K => "k_proj",
            Role::V => "v_proj",
            Role::O => "o_proj",
            Role::Gate => "gate_proj",
            Role::Up => "up_proj",
            Role::Down => "down_proj",
            Role::LinearQkv => "linear_qkv_proj",
            Role::LinearZ => "linear_z_proj",
            Role::LinearHead => "linear_alpha_beta_proj",
            Role::LinearOut => "linear_out_proj",
            Role::ConvIn => "conv_in_proj",
            Role::ConvOut => "conv_out_proj",
            Role::Norm => "norm",
            Role::Other => "other",
        }
    }
}

/// The role and layer of a tensor name.
pub fn role_of(name: &str) -> (Role, Option<u32>) {
    let layer = name
        .split('.')
        .skip_while(|p| *p != "layers")
        .nth(1)
        .and_then(|n| n.parse().ok());
    let role = if name == "lm_head.weight" {
        Role::LmHead
    } else if name.ends_with("embed_tokens.weight") || name.ends_with("token_embd.weight") {
        Role::Embedding
    } else if name.ends_with("linear_attn.qkv_proj.weight") {
        Role::LinearQkv
    } else if name.ends_with("self_attn.gate_proj.weight") {
        Role::LinearZ
    } else if name.ends_with("linear_attn.ssm_alpha_proj.weight")
        || name.ends_with("linear_attn.ssm_beta_proj.weight")
    {
        Role::LinearHead
    } else if name.ends_with("linear_attn.ssm_out_proj.weight") {
        Role::LinearOut
    } else if name.ends_with("shortconv.in_proj.weight") {
        Role::ConvIn
    } else if name.ends_with("shortconv.out_proj.weight") {
        Role::ConvOut
    } else if name.ends_with("q_proj.weight") {
        Role::Q
    } else if name.ends_with("k_proj.weight") {
        Role::K
    } else if name.ends_with("v_proj.weight") {
        Role::V
    } else if name.ends_with("o_proj.weight") {
        Role::O
    } else if name.ends_with("gate_proj.weight") {
        Role::Gate
    } else if name.ends_with("up_proj.weight") {
        Role::Up
    } else if name.ends_with("down_proj.weight") {
        Role::Down
    } else if name.contains("norm") {
        Role::Norm
    } else {
        Role::Other
    };
    (role, layer)
}

fn flatten(config: &Value) -> Map<String, Value> {
    let mut top = config.as_object().cloned().unwrap_or_default();
    if let Some(Value::Object(text)) = config.get("text_config") {
        for (k, v) in text {
            top.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    top
}

impl Geometry {
    /// Reads the geometry from a config.json file.
    pub fn from_file(path: &Path) -> Result<Geometry> {
        let bytes = fs_err::read(path)?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| Error::Config {
            file: path.to_path_buf(),
            reason: format!("not JSON: {e}"),
        })?;
        Geometry::from_config(&v).map_err(|reason| Error::Config {
            file: path.to_path_buf(),
            reason,
        })
    }

    /// Reads the geometry from a parsed config (text_config flattened first).
    pub fn from_config(config: &Value) -> std::result::Result<Geometry, String> {
        let c = flatten(config);
        let mut decisions = Vec::new();
        let model_type = c
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or("config.json has no model_type")?
            .to_string();
        let num = |key: &str, decisions: &mut Vec<String>| -> std::result::Result<u64, String> {
            let v = c
                .get(key)
                .and_then(Value::as_u64)
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("config.json has no positive integer {key}"))?;
            decisions.push(format!("{key}={v} <- {key}"));
            Ok(v)
        };
        let hidden = num("hidden_size", &mut decisions)?;
        let mut intermediate = num("intermediate_size", &mut decisions)?;
        if model_type == "lfm2"
            && c.get("block_auto_adjust_ff_dim").and_then(Value::as_bool) == Some(true)
            && let (Some(mult), Some(m)) = (
                c.get("block_ffn_dim_multiplier").and_then(Value::as_f64),
                c.get("block_multiple_of").and_then(Value::as_u64),
            )
        {
            let base = c
                .get("block_ff_dim")
                .and_then(Value::as_u64)
                .unwrap_or(intermediate);
            intermediate = lfm2_ffn_width(base, mult, m);
            decisions.push(format!(
                "intermediate={intermediate} <- block_ff_dim {base} auto-adjusted (block_auto_adjust_ff_dim, block_ffn_dim_multiplier, block_multiple_of {m})"
            ));
        }
        let heads = num("num_attention_heads", &mut decisions)?;
        let vocab = num("vocab_size", &mut decisions)?;
        let kv_heads = match c.get("num_key_value_heads").and_then(Value::as_u64) {
            Some(v) if v > 0 => {
                decisions.push(format!("num_key_value_heads={v} <- num_key_value_heads"));
                v
            }
            _ => {
                decisions.push(format!(
                    "num_key_value_heads={heads} <- num_attention_heads (default)"
                ));
                heads
            }
        };
        let head_dim = match (
            c.get("head_dim").and_then(Value::as_u64),
            c.get("attention_head_dim").and_then(Value::as_u64),
        ) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "head_dim {a} but attention_head_dim {b} ({model_type})"
                ));
            }
            (Some(d), _) => {
                decisions.push(format!("head_dim={d} <- head_dim"));
                d
            }
            (None, Some(d)) => {
                decisions.push(format!("head_dim={d} <- attention_head_dim"));
                d
            }
            (None, None) => {
                let d = match model_type.as_str() {
                    "qwen3" | "qwen3_moe" => 128,
                    "qwen3_5" | "qwen3_5_text" | "gemma2" | "gemma3" | "gemma3_text" | "gemma4"
                    | "gemma4_text" => 256,
                    _ => hidden / heads,
                };
                decisions.push(format!("head_dim={d} <- model_type {model_type} (default)"));
                d
            }
        };
        let q_gate = match c.get("attn_output_gate").and_then(Value::as_bool) {
            Some(g) => {
                decisions.push(format!("q_gate={} <- attn_output_gate", g as u8));
                g
            }
            None => false,
        };
        let linear_keys = [
            "linear_num_key_heads",
            "linear_key_head_dim",
            "linear_num_value_heads",
            "linear_value_head_dim",
        ];
        let linear = match linear_keys.map(|k| c.get(k).and_then(Value::as_u64)) {
            [Some(a), Some(b), Some(v), Some(d)] => {
                decisions.push(format!(
                    "linear={a}x{b} keys, {v}x{d} values <- {}",
                    linear_keys.join(", ")
                ));
                Some([a, b, v, d])
            }
            _ => None,
        };
        let ffn_pad = ffn_pad_of(&model_type);
        if ffn_pad > 1 {
            decisions.push(format!(
                "ffn_pad={ffn_pad} <- model_type {model_type} (q4nx-format §4)"
            ));
        }
        Ok(Geometry {
            model_type,
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            vocab,
            q_gate,
            ffn_pad,
            linear,
            decisions,
        })
    }

    /// The logical (rows, K) of a weight by role, and the padded FFN width where it applies.
    pub fn shape_of(&self, role: Role) -> Option<(u64, u64)> {
        // Absurd configs overflow to None rather than wrapping: the caller refuses the tensor.
        let ffn = self
            .intermediate
            .div_ceil(self.ffn_pad)
            .checked_mul(self.ffn_pad)?;
        let attn = self.heads.checked_mul(self.head_dim)?;
        let q_rows = attn.checked_mul(if self.q_gate { 2 } else { 1 })?;
        let kv = self.kv_heads.checked_mul(self.head_dim)?;
        Some(match role {
            Role::Embedding | Role::LmHead => (self.vocab, self.hidden),
            Role::Q => (q_rows, self.hidden),
            Role::K | Role::V => (kv, self.hidden),
            Role::O => (self.hidden, attn),
            Role::Gate | Role::Up => (ffn, self.hidden),
            Role::Down => (self.hidden, ffn),
            Role::LinearQkv | Role::LinearZ | Role::LinearHead | Role::LinearOut => {
                let [nk, dk, nv, dv] = self.linear?;
                let vd = nv.checked_mul(dv)?;
                match role {
                    Role::LinearQkv => (nk.checked_mul(dk)?.checked_mul(2)? + vd, self.hidden),
                    Role::LinearZ => (vd, self.hidden),
                    Role::LinearHead => (nv, self.hidden),
                    _ => (self.hidden, vd),
                }
            }
            Role::ConvIn => (self.hidden.checked_mul(3)?, self.hidden),
            Role::ConvOut => (self.hidden, self.hidden),
            Role::Norm | Role::Other => return None,
        })
    }
}

/// LFM2's FFN width with `block_auto_adjust_ff_dim` (transformers' `Lfm2MLP`, llama.cpp's
/// converter): `multiple_of · ceil(int(multiplier · int(2·block_ff_dim/3)) / multiple_of)`;
/// LFM2-1.2B: 12288 → 8192.
pub fn lfm2_ffn_width(block_ff_dim: u64, multiplier: f64, multiple_of: u64) -> u64 {
    let inner = (multiplier * ((2 * block_ff_dim) / 3) as f64) as u64;
    let m = multiple_of.max(1);
    m.saturating_mul(inner.div_ceil(m))
}

/// The multiple a family pads its FFN width to before tiling (q4nx-format §4: `gate/up_proj` rows
/// and `down_proj` columns), 1 for none; by config `model_type` or GGUF architecture. The reader
/// expects it and the converter writes it.
pub fn ffn_pad_of(model_type: &str) -> u64 {
    match model_type {
        "qwen2" | "qwen2_vl" | "nanbeige" => 512,
        _ => 1,
    }
}
