//! `config.json` in Hugging Face form from a GGUF's metadata. Each value records where it came
//! from; values the GGUF does not carry are the family's fixed choices as llama.cpp makes them
//! (Gemma 3's sliding pattern of 6, local RoPE base 10,000 and attention scale), and say so.

use serde_json::{Value, json};

use super::Dims;
use onebit_stages::error::Result;
use onebit_stages::format::gguf::GgufFile;

/// The config and the decisions behind it.
pub struct ConfigOut {
    /// The `config.json` object.
    pub json: Value,
    /// `key=value <- source` for every derived value.
    pub decisions: Vec<String>,
}

/// Builds `config.json` for `g`.
pub fn config_json(g: &GgufFile, d: &Dims) -> Result<ConfigOut> {
    let a = &d.arch;
    let mut dec = Vec::new();
    let u = |k: &str| g.meta(&format!("{a}.{k}")).and_then(|v| v.as_u64());
    let f = |k: &str| g.meta(&format!("{a}.{k}")).and_then(|v| v.as_f64());
    let vocab = g
        .meta("tokenizer.ggml.tokens")
        .and_then(|v| match v {
            onebit_stages::format::gguf::MetaValue::Array(a) => Some(a.len() as u64),
            _ => None,
        })
        .or_else(|| g.tensor("token_embd.weight").map(|t| t.rows()))
        .unwrap_or(0);
    let tied = g.tensor("output.weight").is_none();
    dec.push(format!(
        "tie_word_embeddings={tied} <- {}",
        if tied {
            "no output.weight in the GGUF"
        } else {
            "output.weight present"
        }
    ));
    let ffn = u("feed_forward_length").unwrap_or(0);
    let eps = f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6);
    let ctx = u("context_length").unwrap_or(2048);
    let bos = g
        .meta("tokenizer.ggml.bos_token_id")
        .and_then(|v| v.as_u64());
    let eos = g
        .meta("tokenizer.ggml.eos_token_id")
        .and_then(|v| v.as_u64());
    let theta = f("rope.freq_base").unwrap_or(10_000.0);
    if f("rope.freq_base").is_none() {
        dec.push(format!(
            "rope_theta=10000 <- default ({a}.rope.freq_base absent)"
        ));
    }
    let mut c = json!({
        "vocab_size": vocab,
        "hidden_size": d.hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "max_position_embeddings": ctx,
        "tie_word_embeddings": tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    });
    let set = |c: &mut Value, k: &str, v: Value| {
        if let Some(o) = c.as_object_mut() {
            o.insert(k.to_string(), v);
        }
    };
    let scaling = g
        .meta(&format!("{a}.rope.scaling.type"))
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let factor = f("rope.scaling.factor");
    match (scaling.as_deref(), factor) {
        (Some("linear"), Some(fac)) => {
            set(
                &mut c,
                "rope_scaling",
                json!({"rope_type": "linear", "factor": fac}),
            );
            dec.push(format!(
                "rope_scaling=linear×{fac} <- {a}.rope.scaling.type/factor"
            ));
        }
        (None, _) | (Some("none"), _) => set(&mut c, "rope_scaling", Value::Null),
        (Some(other), _) => {
            return Err(super::refuse(
                g.path(),
                &format!("{a}.rope.scaling.type"),
                format!("RoPE scaling {other:?} is not converted (linear is)"),
            ));
        }
    }
    if g.tensor("rope_freqs.weight").is_some() {
        return Err(super::refuse(
            g.path(),
            "rope_freqs.weight",
            "llama3-style frequency factors are stored as a tensor; their scaling parameters \
             cannot be recovered exactly for config.json",
        ));
    }
    match a.as_str() {
        "llama" => {
            set(&mut c, "model_type", json!("llama"));
            set(&mut c, "architectures", json!(["LlamaForCausalLM"]));
            set(&mut c, "hidden_act", json!("silu"));
            set(&mut c, "attention_bias", json!(false));
        }
        "qwen2" => {
            set(&mut c, "model_type", json!("qwen2"));
            set(&mut c, "architectures", json!(["Qwen2ForCausalLM"]));
            set(&mut c, "hidden_act", json!("silu"));
            set(&mut c, "use_sliding_window", json!(false));
        }
        "qwen3" => {
            set(&mut c, "model_type", json!("qwen3"));
            set(&mut c, "architectures", json!(["Qwen3ForCausalLM"]));
            set(&mut c, "hidden_act", json!("silu"));
            set(&mut c, "attention_bias", json!(false));
        }
        "gemma3" => {
            set(&mut c, "model_type", json!("gemma3_text"));
            set(&mut c, "architectures", json!(["Gemma3ForCausalLM"]));
            set(&mut c, "hidden_activation", json!("gelu_pytorch_tanh"));
            let window = u("attention.sliding_window").unwrap_or(512);
            set(&mut c, "sliding_window", json!(window));
            // llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA3): swa pattern 6, local base 10000,
            // attention scale 1/√head_dim except the 27B model (1/√(hidden/heads)).
            let pattern = 6u64;
            set(&mut c, "_sliding_window_pattern", json!(pattern));
            let types: Vec<&str> = (0..d.layers)
                .map(|l| {
                    if (l + 1) % pattern == 0 {
                        "full_attention"
                    } else {
                        "sliding_attention"
                    }
                })
                .collect();
            set(&mut c, "layer_types", json!(types));
            set(&mut c, "rope_local_base_freq", json!(10_000.0));
            let is_27b = d.layers == 62;
            let scalar = if is_27b {
                d.hidden / d.heads
            } else {
                d.head_dim
            };
            set(&mut c, "query_pre_attn_scalar", json!(scalar));
            set(&mut c, "final_logit_softcapping", Value::Null);
            set(&mut c, "attn_logit_softcapping", Value::Null);
            set(&mut c, "sliding_window_pattern", json!(pattern));
            dec.push(format!(
                "sliding_window={window} <- gemma3.attention.sliding_window"
            ));
            dec.push(
                "layer_types=every 6th full <- llama.cpp's fixed gemma3 swa pattern (6)".into(),
            );
            dec.push("rope_local_base_freq=10000 <- llama.cpp's fixed gemma3 local base".into());
            dec.push(format!(
                "query_pre_attn_scalar={scalar} <- {} (llama.cpp's gemma3 attention scale)",
                if is_27b {
                    "hidden/heads (27B)"
                } else {
                    "head_dim"
                }
            ));
        }
        "hunyuan-dense" => {
            set(&mut c, "model_type", json!("hunyuan_v1_dense"));
            set(
                &mut c,
                "architectures",
                json!(["HunYuanDenseV1ForCausalLM"]),
            );
            set(&mut c, "hidden_act", json!("silu"));
            set(&mut c, "attention_bias", json!(false));
            set(&mut c, "mlp_bias", json!(false));
            set(&mut c, "norm_type", json!("rms"));
            set(&mut c, "use_cla", json!(false));
            set(&mut c, "attention_head_dim", json!(d.head_dim));
            let qk_norm = g.tensor("blk.0.attn_q_norm.weight").is_some();
            set(&mut c, "use_qk_norm", json!(qk_norm));
            dec.push(format!(
                "use_qk_norm={qk_norm} <- blk.0.attn_q_norm.weight {}",
                if qk_norm { "present" } else { "absent" }
            ));
            let base = f("rope.freq_base").unwrap_or(10_000.0);
            match hunyuan_alpha(base, d.head_dim) {
                Some(alpha) => {
                    set(&mut c, "rope_theta", json!(HUNYUAN_THETA));
                    set(
                        &mut c,
                        "rope_scaling",
                        json!({"type": "dynamic", "alpha": alpha, "factor": 1.0}),
                    );
                    dec.push(format!(
                        "rope_scaling=dynamic alpha {alpha}, rope_theta={HUNYUAN_THETA} <- {a}.rope.freq_base {base} = {HUNYUAN_THETA}·{alpha}^({}/{}) exactly in f32 (llama.cpp folds α into the base)",
                        d.head_dim,
                        d.head_dim.saturating_sub(2)
                    ));
                }
                None if base == HUNYUAN_THETA => {
                    dec.push(format!(
                        "rope_theta={HUNYUAN_THETA}, no rope_scaling <- {a}.rope.freq_base {base} (no α folded in)"
                    ));
                }
                None => dec.push(format!(
                    "rope_theta={base}, no rope_scaling <- {a}.rope.freq_base: no α with a short decimal form reproduces it from θ {HUNYUAN_THETA}, so the folded base is written (same frequencies)"
                )),
            }
        }
        _ => {}
    }
    if let Some(p) = g
        .meta("tokenizer.ggml.padding_token_id")
        .and_then(|v| v.as_u64())
    {
        set(&mut c, "pad_token_id", json!(p));
    }
    Ok(ConfigOut {
        json: c,
        decisions: dec,
    })
}

/// The declared RoPE base of every Hunyuan dense model (llama.cpp's converter asserts it before
/// folding α in).
const HUNYUAN_THETA: f64 = 10_000.0;

/// The α that llama.cpp folded into `base` (`θ·α^(D/(D−2))`, stored as f32), when one with at most
/// three decimals reproduces the stored base exactly; `None` for an unscaled base or no exact α.
fn hunyuan_alpha(base: f64, head_dim: u64) -> Option<f64> {
    if head_dim <= 2 || base <= HUNYUAN_THETA {
        return None;
    }
    let d = head_dim as f64;
    let raw = (base / HUNYUAN_THETA).powf((d - 2.0) / d);
    let stored = base as f32;
    [1.0, 10.0, 100.0, 1000.0]
        .into_iter()
        .map(|s| (raw * s).round() / s)
        .find(|&alpha| (HUNYUAN_THETA * alpha.powf(d / (d - 2.0))) as f32 == stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hunyuan_alpha_comes_back_from_the_folded_f32_base() {
        for (alpha, d) in [
            (1000.0, 128u64),
            (1000.0, 32),
            (50.0, 128),
            (100000.0, 128),
            (2.5, 64),
        ] {
            let folded = (HUNYUAN_THETA * f64::powf(alpha, d as f64 / (d as f64 - 2.0))) as f32;
            assert_eq!(
                hunyuan_alpha(folded as f64, d),
                Some(alpha),
                "alpha {alpha}, D {d}"
            );
        }
        assert_eq!(hunyuan_alpha(HUNYUAN_THETA, 128), None);
        // A base no short α reproduces is written as the folded base.
        assert_eq!(hunyuan_alpha(12_345_678.9, 128), None);
    }
}
