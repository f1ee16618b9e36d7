//! `config.json` in Hugging Face form from a GGUF's metadata. Each value records where it came
//! from; values the GGUF does not carry are the family's fixed choices as llama.cpp makes them
//! (Gemma 3's sliding pattern of 6, local RoPE base 10,000 and attention scale), and say so.

use serde_json::{Value, json};

use super::Dims;
use onebit_stages::error::Result;
use onebit_stages::format::gguf::{GgufFile, MetaValue};

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
    rope_scaling(g, d, &mut c, &mut dec)?;
    match a.as_str() {
        "llama" => plain_family(
            &mut c,
            "llama",
            "LlamaForCausalLM",
            ("attention_bias", false),
        ),
        "qwen2" => plain_family(
            &mut c,
            "qwen2",
            "Qwen2ForCausalLM",
            ("use_sliding_window", false),
        ),
        "qwen3" => plain_family(
            &mut c,
            "qwen3",
            "Qwen3ForCausalLM",
            ("attention_bias", false),
        ),
        "gemma3" => gemma3(g, d, &mut c, &mut dec),
        "hunyuan-dense" => hunyuan(g, d, &mut c, &mut dec),
        "lfm2" => lfm2(g, d, &mut c, &mut dec, eps, ffn),
        "qwen35" => qwen35(g, d, &mut c, &mut dec)?,
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

/// Sets `k` of the config object `c`.
fn set(c: &mut Value, k: &str, v: Value) {
    if let Some(o) = c.as_object_mut() {
        o.insert(k.to_string(), v);
    }
}

/// `rope_scaling`: linear from the GGUF's scaling type and factor, llama3's recovered from
/// `rope_freqs.weight`, none otherwise; another scaling type is refused.
fn rope_scaling(g: &GgufFile, d: &Dims, c: &mut Value, dec: &mut Vec<String>) -> Result<()> {
    let a = &d.arch;
    let f = |k: &str| g.meta(&format!("{a}.{k}")).and_then(|v| v.as_f64());
    let scaling = g
        .meta(&format!("{a}.rope.scaling.type"))
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let factor = f("rope.scaling.factor");
    match (scaling.as_deref(), factor) {
        (Some("linear"), Some(fac)) => {
            set(
                c,
                "rope_scaling",
                json!({"rope_type": "linear", "factor": fac}),
            );
            dec.push(format!(
                "rope_scaling=linear×{fac} <- {a}.rope.scaling.type/factor"
            ));
        }
        (None, _) | (Some("none"), _) => set(c, "rope_scaling", Value::Null),
        (Some(other), _) => {
            return Err(super::refuse(
                g.path(),
                &format!("{a}.rope.scaling.type"),
                format!("RoPE scaling {other:?} is not converted (linear is)"),
            ));
        }
    }
    if let Some(t) = g.tensor("rope_freqs.weight") {
        let mut stored = Vec::new();
        g.rows_f32(t, 0, t.rows(), &mut stored)?;
        let base = f("rope.freq_base").unwrap_or(10_000.0);
        match llama3_scaling(&stored, base, d.rope_dim) {
            Ok(Llama3Fit { params: None, .. }) => {
                dec.push("rope_scaling=none <- rope_freqs.weight: every factor is 1".into())
            }
            Ok(Llama3Fit {
                params: Some(p),
                others,
            }) => {
                set(
                    c,
                    "rope_scaling",
                    json!({
                        "rope_type": "llama3",
                        "factor": p.factor,
                        "low_freq_factor": p.low,
                        "high_freq_factor": p.high,
                        "original_max_position_embeddings": p.original,
                    }),
                );
                dec.push(format!(
                    "rope_scaling=llama3 factor {} low {} high {} original {} <- rope_freqs.weight: all {} factors reproduced by llama3's formula (within {ULPS} f32 ulps){}",
                    p.factor,
                    p.low,
                    p.high,
                    p.original,
                    stored.len(),
                    if others > 0 {
                        format!("; {others} other parameter sets give the same factors at this head size, the first in llama3's defaults order is written")
                    } else {
                        String::new()
                    }
                ));
            }
            Err(why) => return Err(super::refuse(g.path(), "rope_freqs.weight", why)),
        }
    }
    Ok(())
}

/// The keys of a family llama.cpp converts with no choices of its own: its model type, class,
/// SiLU and one bias or window switch off.
fn plain_family(c: &mut Value, model_type: &str, class: &str, off: (&str, bool)) {
    set(c, "model_type", json!(model_type));
    set(c, "architectures", json!([class]));
    set(c, "hidden_act", json!("silu"));
    set(c, off.0, json!(off.1));
}

/// Gemma 3's keys: the sliding window from the GGUF, the rest llama.cpp's fixed choices.
fn gemma3(g: &GgufFile, d: &Dims, c: &mut Value, dec: &mut Vec<String>) {
    let a = &d.arch;
    let u = |k: &str| g.meta(&format!("{a}.{k}")).and_then(|v| v.as_u64());
    set(c, "model_type", json!("gemma3_text"));
    set(c, "architectures", json!(["Gemma3ForCausalLM"]));
    set(c, "hidden_activation", json!("gelu_pytorch_tanh"));
    let window = u("attention.sliding_window").unwrap_or(512);
    set(c, "sliding_window", json!(window));
    // llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA3): swa pattern 6, local base 10000,
    // attention scale 1/√head_dim except the 27B model (1/√(hidden/heads)).
    let pattern = 6u64;
    set(c, "_sliding_window_pattern", json!(pattern));
    let types: Vec<&str> = (0..d.layers)
        .map(|l| {
            if (l + 1) % pattern == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    set(c, "layer_types", json!(types));
    set(c, "rope_local_base_freq", json!(10_000.0));
    let is_27b = d.layers == 62;
    let scalar = if is_27b {
        d.hidden / d.heads
    } else {
        d.head_dim
    };
    set(c, "query_pre_attn_scalar", json!(scalar));
    set(c, "final_logit_softcapping", Value::Null);
    set(c, "attn_logit_softcapping", Value::Null);
    set(c, "sliding_window_pattern", json!(pattern));
    dec.push(format!(
        "sliding_window={window} <- gemma3.attention.sliding_window"
    ));
    dec.push("layer_types=every 6th full <- llama.cpp's fixed gemma3 swa pattern (6)".into());
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

/// Hunyuan dense's keys, with α recovered from the base llama.cpp folded it into.
fn hunyuan(g: &GgufFile, d: &Dims, c: &mut Value, dec: &mut Vec<String>) {
    let a = &d.arch;
    let f = |k: &str| g.meta(&format!("{a}.{k}")).and_then(|v| v.as_f64());
    set(c, "model_type", json!("hunyuan_v1_dense"));
    set(c, "architectures", json!(["HunYuanDenseV1ForCausalLM"]));
    set(c, "hidden_act", json!("silu"));
    set(c, "attention_bias", json!(false));
    set(c, "mlp_bias", json!(false));
    set(c, "norm_type", json!("rms"));
    set(c, "use_cla", json!(false));
    set(c, "attention_head_dim", json!(d.head_dim));
    let qk_norm = g.tensor("blk.0.attn_q_norm.weight").is_some();
    set(c, "use_qk_norm", json!(qk_norm));
    dec.push(format!(
        "use_qk_norm={qk_norm} <- blk.0.attn_q_norm.weight {}",
        if qk_norm { "present" } else { "absent" }
    ));
    let base = f("rope.freq_base").unwrap_or(10_000.0);
    match hunyuan_alpha(base, d.head_dim) {
            Some(alpha) => {
                set(c, "rope_theta", json!(HUNYUAN_THETA));
                set(
                    c,
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

/// LFM2's keys: the layer kinds from the key/value head counts, the convolution's taps.
fn lfm2(g: &GgufFile, d: &Dims, c: &mut Value, dec: &mut Vec<String>, eps: f64, ffn: u64) {
    let a = &d.arch;
    let u = |k: &str| g.meta(&format!("{a}.{k}")).and_then(|v| v.as_u64());
    set(c, "model_type", json!("lfm2"));
    set(c, "architectures", json!(["Lfm2ForCausalLM"]));
    // LFM2 reads norm_eps; its MLP is always SwiGLU.
    if let Some(o) = c.as_object_mut() {
        o.remove("rms_norm_eps");
    }
    set(c, "norm_eps", json!(eps));
    let types: Vec<&str> = d
        .attention_layers
        .iter()
        .map(|&a| if a { "full_attention" } else { "conv" })
        .collect();
    dec.push(format!(
            "layer_types={} conv, {} full_attention <- {a}.attention.head_count_kv (0 on convolution layers)",
            types.iter().filter(|t| **t == "conv").count(),
            types.iter().filter(|t| **t == "full_attention").count()
        ));
    set(c, "layer_types", json!(types));
    let l_cache = u("shortconv.l_cache").unwrap_or(3);
    dec.push(format!(
        "conv_L_cache={l_cache} <- {}",
        if u("shortconv.l_cache").is_some() {
            format!("{a}.shortconv.l_cache")
        } else {
            format!("default ({a}.shortconv.l_cache absent)")
        }
    ));
    set(c, "conv_L_cache", json!(l_cache));
    set(c, "conv_bias", json!(false));
    // The GGUF's feed_forward_length is the width after LFM2's auto-adjustment.
    set(c, "block_auto_adjust_ff_dim", json!(false));
    dec.push(format!(
            "intermediate_size={ffn}, block_auto_adjust_ff_dim=false <- {a}.feed_forward_length (llama.cpp writes the adjusted width)"
        ));
}

/// Qwen3.5's text config (`Qwen3_5TextConfig` keys) from the GGUF's `qwen35.*` metadata.
fn qwen35(g: &GgufFile, d: &Dims, c: &mut Value, dec: &mut Vec<String>) -> Result<()> {
    let a = &d.arch;
    let need = |k: &str| -> Result<u64> {
        g.meta(&format!("{a}.{k}"))
            .and_then(|v| v.as_u64())
            .ok_or_else(|| super::refuse(g.path(), &format!("{a}.{k}"), "missing metadata key"))
    };
    let o = c
        .as_object_mut()
        .ok_or_else(|| onebit_stages::Error::Internal("config is not an object".into()))?;
    o.insert("model_type".into(), json!("qwen3_5_text"));
    o.insert("architectures".into(), json!(["Qwen3_5ForCausalLM"]));
    o.insert("hidden_act".into(), json!("silu"));
    o.insert("attention_bias".into(), json!(false));
    // The gate rides in q_proj: its GGUF twin has 2·heads·head_dim rows.
    let q_rows = (0..d.layers)
        .find_map(|l| g.tensor(&format!("blk.{l}.attn_q.weight")))
        .map(|t| t.rows());
    let gate = q_rows == Some(2 * d.heads * d.head_dim);
    o.insert("attn_output_gate".into(), json!(gate));
    dec.push(format!(
        "attn_output_gate={gate} <- attn_q rows {q_rows:?} vs heads·head_dim {}",
        d.heads * d.head_dim
    ));
    let recurrent: Vec<bool> = match g.meta(&format!("{a}.attention.recurrent_layers")) {
        Some(MetaValue::Array(v)) => v
            .iter()
            .map(|x| matches!(x, MetaValue::Bool(true)))
            .collect(),
        _ => Vec::new(),
    };
    let interval = need("full_attention_interval").unwrap_or(4);
    let types: Vec<&str> = (0..d.layers as usize)
        .map(|l| {
            let linear = match recurrent.get(l) {
                Some(&r) => r,
                None => l as u64 % interval != interval - 1,
            };
            if linear {
                "linear_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    dec.push(format!(
        "layer_types={} linear_attention, {} full_attention <- {}",
        types.iter().filter(|t| **t == "linear_attention").count(),
        types.iter().filter(|t| **t == "full_attention").count(),
        if recurrent.len() == d.layers as usize {
            format!("{a}.attention.recurrent_layers")
        } else {
            format!("{a}.full_attention_interval {interval}")
        }
    ));
    let any_linear = types.contains(&"linear_attention");
    o.insert("layer_types".into(), json!(types));
    o.insert("full_attention_interval".into(), json!(interval));
    if any_linear {
        qwen35_linear(g, o, dec)?;
    }
    qwen35_rope(g, d, o, dec);
    Ok(())
}

/// Qwen3.5's linear-attention dims from `qwen35.ssm.*`.
fn qwen35_linear(
    g: &GgufFile,
    o: &mut serde_json::Map<String, Value>,
    dec: &mut Vec<String>,
) -> Result<()> {
    let a = "qwen35";
    let need = |k: &str| -> Result<u64> {
        g.meta(&format!("{a}.{k}"))
            .and_then(|v| v.as_u64())
            .ok_or_else(|| super::refuse(g.path(), &format!("{a}.{k}"), "missing metadata key"))
    };
    let (kernel, dk, nk, nv, inner) = (
        need("ssm.conv_kernel")?,
        need("ssm.state_size")?,
        need("ssm.group_count")?,
        need("ssm.time_step_rank")?,
        need("ssm.inner_size")?,
    );
    if nv == 0 || inner % nv != 0 {
        return Err(super::refuse(
            g.path(),
            &format!("{a}.ssm.inner_size"),
            format!("{inner} does not split into {nv} value heads"),
        ));
    }
    o.insert("linear_conv_kernel_dim".into(), json!(kernel));
    o.insert("linear_key_head_dim".into(), json!(dk));
    o.insert("linear_num_key_heads".into(), json!(nk));
    o.insert("linear_num_value_heads".into(), json!(nv));
    o.insert("linear_value_head_dim".into(), json!(inner / nv));
    dec.push(format!(
        "linear_num_key_heads={nk}, linear_key_head_dim={dk}, linear_num_value_heads={nv}, linear_value_head_dim={}, linear_conv_kernel_dim={kernel} <- {a}.ssm.group_count, state_size, time_step_rank, inner_size / time_step_rank, conv_kernel",
        inner / nv
    ));
    Ok(())
}

/// Qwen3.5's `rope_parameters` (θ, the rotated fraction, the text-only mRoPE sections).
fn qwen35_rope(
    g: &GgufFile,
    d: &Dims,
    o: &mut serde_json::Map<String, Value>,
    dec: &mut Vec<String>,
) {
    let a = &d.arch;
    let theta = o.remove("rope_theta").unwrap_or(json!(10_000.0));
    o.remove("rope_scaling");
    let rotary = d.rope_dim as f64 / d.head_dim.max(1) as f64;
    let sections: Vec<u64> = match g.meta(&format!("{a}.rope.dimension_sections")) {
        Some(MetaValue::Array(v)) => v.iter().filter_map(MetaValue::as_u64).take(3).collect(),
        _ => vec![11, 11, 10],
    };
    o.insert(
        "rope_parameters".into(),
        json!({
            "rope_type": "default",
            "rope_theta": theta,
            "partial_rotary_factor": rotary,
            "mrope_interleaved": true,
            "mrope_section": sections,
        }),
    );
    dec.push(format!(
        "partial_rotary_factor={rotary} <- {a}.rope.dimension_count {} / head_dim {}",
        d.rope_dim, d.head_dim
    ));
}

/// Keys whose values must agree between a user's config and the GGUF: they fix the tensors' shapes.
const SHAPE_KEYS: [&str; 6] = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
];

/// `config.json` from the model's own config (`path`) over the one the GGUF implies (`derived`):
/// every key of the user's config wins, each value that differs from the derived one is recorded
/// as a decision, derived keys the user's config lacks are kept (and said). A config whose shape
/// keys contradict the GGUF is refused naming the key and both values.
pub fn with_user_config(
    derived: ConfigOut,
    path: &std::path::Path,
    g: &GgufFile,
) -> Result<ConfigOut> {
    let user: Value = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| onebit_stages::Error::Config {
            file: path.to_path_buf(),
            reason: format!("--config: {e}"),
        })?;
    let (Some(user), Some(ours)) = (user.as_object(), derived.json.as_object()) else {
        return Err(onebit_stages::Error::Config {
            file: path.to_path_buf(),
            reason: "--config: not a JSON object".into(),
        });
    };
    // A text_config (multimodal wrappers) holds the text model's keys.
    let text = user.get("text_config").and_then(Value::as_object);
    let get = |k: &str| user.get(k).or_else(|| text.and_then(|t| t.get(k)));
    // LFM2 states its FFN width before the auto-adjustment the model applies.
    let lfm2_ffn =
        (get("block_auto_adjust_ff_dim").and_then(Value::as_bool) == Some(true)).then(|| {
            let base = get("block_ff_dim")
                .or_else(|| get("intermediate_size"))
                .and_then(Value::as_u64)?;
            let mult = get("block_ffn_dim_multiplier").and_then(Value::as_f64)?;
            let m = get("block_multiple_of").and_then(Value::as_u64)?;
            Some(json!(onebit_stages::layout::geometry::lfm2_ffn_width(
                base, mult, m
            )))
        });
    for k in SHAPE_KEYS {
        let u = match (k, &lfm2_ffn) {
            ("intermediate_size", Some(Some(w))) => Some(w),
            _ => get(k),
        };
        if let (Some(u), Some(o)) = (u, ours.get(k))
            && u.as_f64() != o.as_f64()
        {
            return Err(super::refuse(
                g.path(),
                k,
                format!(
                    "--config {} says {k} = {u}, the GGUF {o}: it is the config of another model",
                    path.display()
                ),
            ));
        }
    }
    let mut decisions = derived.decisions;
    let mut out = user.clone();
    for (k, o) in ours {
        match get(k) {
            Some(u) if u == o => {}
            Some(u) => decisions.push(format!(
                "{k}={u} <- --config {} (the GGUF implies {o})",
                path.display()
            )),
            None => {
                if !o.is_null() {
                    decisions.push(format!(
                        "{k}={o} <- the GGUF (absent from --config {})",
                        path.display()
                    ));
                }
                out.insert(k.clone(), o.clone());
            }
        }
    }
    Ok(ConfigOut {
        json: Value::Object(out),
        decisions,
    })
}

/// The declared RoPE base of every Hunyuan dense model (llama.cpp's converter asserts it before
/// folding α in).
const HUNYUAN_THETA: f64 = 10_000.0;

/// `v` rounded to 0, 1, 2 and 3 decimals, shortest first: the values a config would state, for
/// recovering a parameter from an f32 that llama.cpp derived from it.
fn short_decimals(v: f64) -> impl Iterator<Item = f64> {
    [1.0, 10.0, 100.0, 1000.0]
        .into_iter()
        .map(move |s| (v * s).round() / s)
}

/// The α that llama.cpp folded into `base` (`θ·α^(D/(D−2))`, stored as f32), when one with at most
/// three decimals reproduces the stored base exactly; `None` for an unscaled base or no exact α.
fn hunyuan_alpha(base: f64, head_dim: u64) -> Option<f64> {
    if head_dim <= 2 || base <= HUNYUAN_THETA {
        return None;
    }
    let d = head_dim as f64;
    let raw = (base / HUNYUAN_THETA).powf((d - 2.0) / d);
    let stored = base as f32;
    short_decimals(raw).find(|&alpha| (HUNYUAN_THETA * alpha.powf(d / (d - 2.0))) as f32 == stored)
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

/// Llama 3's RoPE scaling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Llama3 {
    factor: f64,
    low: f64,
    high: f64,
    original: f64,
}

/// The parameters that reproduce a `rope_freqs.weight` (`None`: every factor is 1), and how many
/// other candidates reproduce it too.
#[derive(Debug)]
struct Llama3Fit {
    params: Option<Llama3>,
    others: usize,
}

/// A factor agrees with the stored one within this many f32 ulps (llama.cpp computes them with
/// torch in f32; the formula here runs in f64).
const ULPS: f32 = 4.0;

/// The factors llama.cpp's converter writes for `p` (convert_hf_to_gguf.py, LlamaModel
/// `generate_extra_tensors`): 1 above the high-frequency wavelength bound, `factor` below the
/// low-frequency one, and the smooth blend between.
fn llama3_factors(p: &Llama3, base: f64, dim: u64) -> Vec<f64> {
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f64 / dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < p.original / p.high {
                1.0
            } else if wavelen > p.original / p.low {
                p.factor
            } else {
                let smooth = (p.original / wavelen - p.low) / (p.high - p.low);
                1.0 / ((1.0 - smooth) / p.factor + smooth)
            }
        })
        .collect()
}

/// The first index where `want` and `stored` differ by more than [`ULPS`], with both values.
fn first_mismatch(want: &[f64], stored: &[f32]) -> Option<(usize, f32, f64)> {
    want.iter()
        .zip(stored)
        .enumerate()
        .find_map(|(i, (&w, &s))| {
            let tol = ULPS * (s.abs().max(f32::MIN_POSITIVE) * f32::EPSILON);
            ((w as f32 - s).abs() > tol).then_some((i, s, w))
        })
}

/// Recovers (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) from
/// the stored factors: `factor` is the largest factor, and the others are searched over the values
/// real configs use (Llama 3.x: 1, 4, 8192), accepting only a set that reproduces every factor.
/// Refuses naming the first factor the closest candidate misses.
fn llama3_scaling(stored: &[f32], base: f64, dim: u64) -> Result<Llama3Fit, String> {
    if stored.len() as u64 != dim / 2 {
        return Err(format!(
            "{} factors for a rotary dimension of {dim} ({} expected)",
            stored.len(),
            dim / 2
        ));
    }
    if stored.iter().all(|&f| f == 1.0) {
        return Ok(Llama3Fit {
            params: None,
            others: 0,
        });
    }
    let max = stored.iter().copied().fold(f32::MIN, f32::max);
    // The shortest decimal that is this f32.
    let factor = short_decimals(f64::from(max))
        .find(|v| *v as f32 == max)
        .unwrap_or(f64::from(max));
    let lows = [1.0, 0.5, 2.0, 0.25, 4.0];
    let highs = [4.0, 2.0, 8.0, 3.0, 1.5, 16.0, 32.0];
    let originals: Vec<f64> = std::iter::once(8192.0)
        .chain((4..=21).map(|e| f64::from(1u32 << e)))
        .collect();
    let mut found: Vec<Llama3> = Vec::new();
    let mut closest: Option<(usize, Llama3, (usize, f32, f64))> = None;
    for &low in &lows {
        for &high in highs.iter().filter(|&&h| h > low) {
            for &original in &originals {
                let p = Llama3 {
                    factor,
                    low,
                    high,
                    original,
                };
                match first_mismatch(&llama3_factors(&p, base, dim), stored) {
                    None => found.push(p),
                    Some(m) => {
                        if closest.as_ref().is_none_or(|(at, ..)| m.0 > *at) {
                            closest = Some((m.0, p, m));
                        }
                    }
                }
            }
        }
    }
    match found.first() {
        Some(&p) => Ok(Llama3Fit {
            params: Some(p),
            others: found.len() - 1,
        }),
        None => {
            let (_, p, (i, s, w)) = closest.ok_or("no llama3 candidate")?;
            Err(format!(
                "no llama3 scaling reproduces the stored frequency factors: rope_freqs.weight[{i}] is {s}, \
                 but the closest candidate (factor {}, low {}, high {}, original {}) gives {w}",
                p.factor, p.low, p.high, p.original
            ))
        }
    }
}

#[cfg(test)]
mod llama3_tests {
    use super::*;

    #[test]
    fn llama3_parameters_come_back_from_their_factors() {
        // Llama 3.1/3.2 (θ 500000, D 128, factor 8 or 32) and a small original that scales
        // frequencies a short sequence turns through.
        for (p, base, dim) in [
            (
                Llama3 {
                    factor: 8.0,
                    low: 1.0,
                    high: 4.0,
                    original: 8192.0,
                },
                500_000.0,
                128,
            ),
            (
                Llama3 {
                    factor: 32.0,
                    low: 1.0,
                    high: 4.0,
                    original: 8192.0,
                },
                500_000.0,
                64,
            ),
            (
                Llama3 {
                    factor: 8.0,
                    low: 1.0,
                    high: 4.0,
                    original: 64.0,
                },
                10_000.0,
                32,
            ),
        ] {
            let stored: Vec<f32> = llama3_factors(&p, base, dim)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let fit = llama3_scaling(&stored, base, dim).expect("fit");
            let got = fit.params.expect("scaled");
            assert_eq!(llama3_factors(&got, base, dim).len(), stored.len());
            assert!(first_mismatch(&llama3_factors(&got, base, dim), &stored).is_none());
            assert_eq!(got.factor, p.factor);
        }
    }

    #[test]
    fn factors_no_llama3_set_reproduces_are_refused_naming_the_first_mismatch() {
        let p = Llama3 {
            factor: 8.0,
            low: 1.0,
            high: 4.0,
            original: 8192.0,
        };
        let mut stored: Vec<f32> = llama3_factors(&p, 500_000.0, 128)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let i = stored
            .iter()
            .position(|&f| f > 1.0 && f < 8.0)
            .expect("a smoothed factor");
        stored[i] *= 1.01;
        let err = llama3_scaling(&stored, 500_000.0, 128).expect_err("refused");
        assert!(err.contains(&format!("rope_freqs.weight[{i}]")), "{err}");
        assert!(
            llama3_scaling(&vec![1.0; 64], 500_000.0, 128)
                .expect("fit")
                .params
                .is_none()
        );
    }
}
