//! The shared reading of a config: the keys every family has, read in the order the decision log
//! prints them, with the family's [`FamilyRules`] hook deciding wherever families differ.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::config::{Cfg, Cx, Log, fmt_f};
use super::family::{self, Defaults, FamilyRules, Layers, RopeCx, Spec, Window};
use super::rope::{Rope, RopeScaling, param, rope_block};
use super::{Activation, LayerKind, LinearDims, MAX_LAYERS, Refusal, Semantics, SideFiles, tokens};

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

/// Derives the semantics of a config. Never panics on any JSON: anything unusable is a refusal.
///
/// The shared keys are read here, in the order the decision log prints them; at each point where
/// families differ, the family's [`FamilyRules`] hook decides.
pub fn derive(config: &Value, side: &SideFiles<'_>) -> Result<Semantics, Refusal> {
    let top = config.as_object().ok_or_else(|| {
        Refusal::new(
            "",
            "config.json",
            "not an object",
            "config.json is not a JSON object",
        )
    })?;
    let (spec, model_type) = family::family_of(top)?;
    let (family, defaults, rules) = (spec.family, &spec.defaults, spec.rules);
    let cfg = Cfg::new(top);
    let mut log = Log {
        decisions: Vec::new(),
    };
    let mt = model_type.as_str();
    let mut cx = Cx {
        cfg: &cfg,
        log: &mut log,
        mt,
    };
    let fam_name = serde_json::to_value(family)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    cx.log
        .add("family", fam_name, format!("config:model_type {mt}"), None);
    let dims = dims(&mut cx, defaults)?;
    let d = dims.head_dim;
    let intermediate = ffn_width(&mut cx, rules)?;
    let kinds = layer_kinds(&mut cx, rules, dims.layers as usize)?;
    let linear = linear_dims(&mut cx, &kinds)?;
    let conv_kernel = short_conv_kernel(&mut cx, &kinds)?;
    // RoPE, q/k norm, norm form.
    let rope = derive_rope(spec, &mut cx, d, &kinds)?;
    let qk_norm = rules.qk_norm(&mut cx);
    let norm_form = rules.norm_form(&mut cx);
    let eps = eps(&mut cx, defaults);
    let activation = activation(&mut cx, defaults)?;
    // Attention scale, the family's refusals, softcaps.
    let (attn_scale, multipliers) = rules.attn_scale(&mut cx, d);
    rules.refusals(&mut cx)?;
    let (final_softcap, attn_softcap) = softcaps(&mut cx);
    let (qkv_bias, o_bias, mlp_bias) = biases(&mut cx, rules);
    // Bidirectional attention (Gemma), then keys only the family has.
    refuse_bidirectional(&mut cx)?;
    rules.extra_keys(&mut cx)?;
    let moe = rules.moe(&mut cx)?;
    let tied = tie(&mut cx, defaults, rules);
    // Embedding scale, output gate, fused q/k/v order, context.
    let (embed_scale, embed_prescaled) =
        rules.embed_scale(&mut cx, dims.hidden, multipliers.as_ref());
    let attn_output_gate = output_gate(&mut cx, defaults);
    let tile_order = rules.tile_order(&mut cx);
    let context = cfg.u64("max_position_embeddings").map(|v| v.0);
    if let Some(c) = context {
        cx.log
            .add("context", c, "config:max_position_embeddings", None);
    }
    let toks = tokens::derive(&cfg, side, cx.log);
    let (ignored, unknown) = leftovers(top, &cfg);
    Ok(Semantics {
        family,
        model_type: mt.to_string(),
        hidden: dims.hidden,
        layers: dims.layers,
        heads: dims.heads,
        kv_heads: dims.kv_heads,
        head_dim: d,
        intermediate,
        vocab: dims.vocab,
        eps,
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
        conv_kernel,
        moe,
        attn_sinks: defaults.attn_sinks,
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

/// The model's dimensions, each with the source the log records.
struct Dims {
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    vocab: u64,
}

/// A positive value of `key`, or a refusal saying the config has none and the family no default.
fn need(mt: &str, k: &str, v: Option<(u64, String)>) -> Result<(u64, String), Refusal> {
    v.filter(|(n, _)| *n > 0).ok_or_else(|| {
        Refusal::new(
            mt,
            k,
            "absent",
            format!("config.json has no usable {k} and {mt} has no default for it"),
        )
    })
}

/// `v` when positive, else the family default for `key`, when the family has one.
fn or_default(
    mt: &str,
    v: Option<(u64, String)>,
    key: &str,
    default: Option<u64>,
) -> Option<(u64, String)> {
    match v {
        Some(v) if v.0 > 0 => Some(v),
        _ => default.map(|d| (d, format!("default ({mt}): config omits {key}"))),
    }
}

/// The dimensions (semantics.md §2, §3): hidden size, layers, heads, key/value heads, head
/// dimension, vocabulary.
fn dims(cx: &mut Cx<'_, '_>, defaults: &Defaults) -> Result<Dims, Refusal> {
    let (cfg, mt) = (cx.cfg, cx.mt);
    let hidden = need(
        mt,
        "hidden_size",
        cfg.u64("hidden_size").or_else(|| cfg.u64("block_dim")),
    )?;
    cx.log.add("hidden", hidden.0, hidden.1, None);
    let layers = need(mt, "num_hidden_layers", cfg.u64("num_hidden_layers"))?;
    cx.log.add("layers", layers.0, layers.1, None);
    if layers.0 > MAX_LAYERS {
        return Err(Refusal::new(
            mt,
            "num_hidden_layers",
            layers.0,
            format!("num_hidden_layers {} exceeds {MAX_LAYERS}", layers.0),
        ));
    }
    let heads = match or_default(
        mt,
        cfg.u64("num_attention_heads")
            .or_else(|| cfg.u64("num_heads")),
        "num_attention_heads",
        defaults.heads,
    ) {
        Some(h) => h,
        None => need(mt, "num_attention_heads", None)?,
    };
    let tag_default = |src: &str| {
        if src.starts_with("default") {
            Some("hf")
        } else {
            None
        }
    };
    cx.log
        .add("heads", heads.0, heads.1.clone(), tag_default(&heads.1));
    let kv = or_default(
        mt,
        cfg.u64("num_key_value_heads"),
        "num_key_value_heads",
        defaults.kv_heads,
    )
    .unwrap_or_else(|| {
        (
            heads.0,
            "config:num_attention_heads (num_key_value_heads absent: MHA)".to_string(),
        )
    });
    cx.log.add("kv_heads", kv.0, kv.1, None);
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
    let head_dim = head_dim(cx, defaults, hidden.0, heads.0)?;
    cx.log.add("head_dim", head_dim.0, head_dim.1, None);
    let vocab = match or_default(mt, cfg.u64("vocab_size"), "vocab_size", defaults.vocab) {
        Some(v) => v,
        None => need(mt, "vocab_size", None)?,
    };
    cx.log.add("vocab", vocab.0, vocab.1, None);
    Ok(Dims {
        hidden: hidden.0,
        layers: layers.0,
        heads: heads.0,
        kv_heads: kv.0,
        head_dim: head_dim.0,
        vocab: vocab.0,
    })
}

/// `head_dim` (or `attention_head_dim`; both must agree), else the family's, else hidden / heads.
fn head_dim(
    cx: &Cx<'_, '_>,
    defaults: &Defaults,
    hidden: u64,
    heads: u64,
) -> Result<(u64, String), Refusal> {
    let mt = cx.mt;
    Ok(
        match (cx.cfg.u64("head_dim"), cx.cfg.u64("attention_head_dim")) {
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
            _ => match defaults.head_dim {
                Some(d) => (d, cx.omits("head_dim")),
                None => (
                    hidden / heads,
                    format!("config:hidden_size / num_attention_heads ({hidden} / {heads})"),
                ),
            },
        },
    )
}

/// The FFN width (the family may adjust the declared one).
fn ffn_width(cx: &mut Cx<'_, '_>, rules: &dyn FamilyRules) -> Result<u64, Refusal> {
    let mt = cx.mt;
    let declared = cx
        .cfg
        .u64("intermediate_size")
        .or_else(|| cx.cfg.u64("block_ff_dim"))
        .filter(|v| v.0 > 0)
        .ok_or_else(|| {
            Refusal::new(
                mt,
                "intermediate_size",
                "absent",
                "config.json has no intermediate_size",
            )
        })?;
    let intermediate = rules.intermediate(cx, declared);
    cx.log
        .add("intermediate", intermediate.0, intermediate.1, None);
    Ok(intermediate.0)
}

/// Each layer's kind: `layer_types` when the config has it, else the family's pattern, then the
/// family's fixes; logged as the mix and, in a mixed model, layer by layer.
fn layer_kinds(
    cx: &mut Cx<'_, '_>,
    rules: &dyn FamilyRules,
    n_layers: usize,
) -> Result<Vec<LayerKind>, Refusal> {
    let (cfg, mt) = (cx.cfg, cx.mt);
    let size = cfg.u64("sliding_window").map(|w| w.0).filter(|w| *w > 0);
    let use_window = cfg.bool("use_sliding_window");
    let window = Window {
        size,
        on: size.is_some() && use_window.as_ref().is_none_or(|b| b.0),
    };
    if window.size.is_some() && !window.on {
        cx.log.add(
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
    rules.layer_keys(cx)?;
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
        kinds = listed_kinds(mt, rules, types, &window)?;
        kind_source = src;
    } else if let Some(src) = rules.layer_pattern(Layers {
        cx,
        kinds: &mut kinds,
        window: &window,
    })? {
        kind_source = src;
    }
    rules.fix_layer_kinds(cx, &mut kinds);
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
    cx.log.add(
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
            cx.log
                .add(&format!("layer_kind[{i}]"), k.name(), "layer mix", None);
        }
    }
    Ok(kinds)
}

/// The kinds `layer_types` lists, one per layer.
fn listed_kinds(
    mt: &str,
    rules: &dyn FamilyRules,
    types: &[Value],
    window: &Window,
) -> Result<Vec<LayerKind>, Refusal> {
    types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = t.as_str().unwrap_or("");
            Ok(match name {
                "full_attention" | "attention" => LayerKind::FullAttention,
                "sliding_attention" => LayerKind::SlidingAttention {
                    window: window.size.unwrap_or(0),
                },
                other => rules.layer_type(other).ok_or_else(|| {
                    Refusal::new(
                        mt,
                        &format!("layer_types[{i}]"),
                        other,
                        format!(
                            "layer_types[{i}] is \"{other}\", a layer kind {mt} has no implementation for"
                        ),
                    )
                })?,
            })
        })
        .collect()
}

/// The norms' epsilon: `rms_norm_eps`, `norm_eps` or `block_norm_eps`, else the family's, else
/// 1e-6 (flagged).
fn eps(cx: &mut Cx<'_, '_>, defaults: &Defaults) -> f64 {
    let cfg = cx.cfg;
    let eps = match cfg
        .f64("rms_norm_eps")
        .or_else(|| cfg.f64("norm_eps"))
        .or_else(|| cfg.f64("block_norm_eps"))
    {
        Some(e) => e,
        None => match defaults.eps {
            Some(e) => (e, cx.omits("rms_norm_eps")),
            None => {
                cx.log.add("eps", "0.000001", "default", None);
                cx.log.flag("no rms_norm_eps/norm_eps/block_norm_eps");
                (1e-6, String::new())
            }
        },
    };
    if !eps.1.is_empty() {
        cx.log
            .add("eps", format!("{:e}", eps.0), eps.1.clone(), None);
    }
    eps.0
}

/// The MLP's gate activation, from the family's key for it.
fn activation(cx: &mut Cx<'_, '_>, defaults: &Defaults) -> Result<Activation, Refusal> {
    let mt = cx.mt;
    let act = &defaults.activation;
    let (act_name, act_src) = match cx.cfg.str(act.key) {
        Some((a, s)) => (a.to_string(), s),
        None if act.family_default => (act.default.to_string(), cx.omits(act.key)),
        None => (
            act.default.to_string(),
            format!("default ({mt}): {} absent", act.key),
        ),
    };
    let activation = match act_name.as_str() {
        "silu" | "swish" => Activation::Silu,
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
        other => {
            return Err(Refusal::new(
                mt,
                act.key,
                other,
                format!(
                    "{} \"{other}\" is not implemented (silu, gelu_pytorch_tanh)",
                    act.key
                ),
            ));
        }
    };
    cx.log.add(
        "activation",
        &act_name,
        act_src,
        act.family_default.then_some("hf"),
    );
    Ok(activation)
}

/// The final and the attention logit softcaps (Gemma 2).
fn softcaps(cx: &mut Cx<'_, '_>) -> (Option<f64>, Option<f64>) {
    let final_softcap = cx.cfg.f64("final_logit_softcapping").map(|v| v.0);
    let attn_softcap = cx.cfg.f64("attn_logit_softcapping").map(|v| v.0);
    if let Some(c) = final_softcap {
        cx.log.add(
            "final_softcap",
            fmt_f(c),
            "config:final_logit_softcapping",
            None,
        );
    }
    if let Some(c) = attn_softcap {
        cx.log.add(
            "attn_softcap",
            fmt_f(c),
            "config:attn_logit_softcapping",
            None,
        );
    }
    (final_softcap, attn_softcap)
}

/// (q/k/v bias, output bias, MLP bias): the family's q/k/v bias, all attention biases with
/// `attention_bias`, and `mlp_bias`.
fn biases(cx: &mut Cx<'_, '_>, rules: &dyn FamilyRules) -> (bool, bool, bool) {
    let mut qkv_bias = rules.qkv_bias(cx);
    let mut o_bias = false;
    if let Some((b, s)) = cx.cfg.bool("attention_bias") {
        if b {
            qkv_bias = true;
            o_bias = true;
        }
        cx.log.add("attention_bias", b as u8, s, Some("hf"));
    }
    let mlp_bias = match cx.cfg.bool("mlp_bias") {
        Some((b, s)) => {
            cx.log.add("mlp_bias", b as u8, s, Some("hf"));
            b
        }
        None => false,
    };
    (qkv_bias, o_bias, mlp_bias)
}

/// Refuses a model whose attention is bidirectional everywhere (Gemma's
/// `use_bidirectional_attention`): the runtime's attention is causal.
fn refuse_bidirectional(cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
    let mt = cx.mt;
    if let Some((v, _)) = cx.cfg.get("use_bidirectional_attention") {
        let all = v.as_bool() == Some(true) || v.as_str() == Some("all");
        if all {
            return Err(Refusal::new(
                mt,
                "use_bidirectional_attention",
                v.clone(),
                format!("{mt} use_bidirectional_attention {v}: attention is not causal"),
            ));
        }
    }
    Ok(())
}

/// Whether the head is tied to the embedding (the tie test on the weights confirms).
fn tie(cx: &mut Cx<'_, '_>, defaults: &Defaults, rules: &dyn FamilyRules) -> bool {
    let mt = cx.mt;
    let tied = match cx
        .cfg
        .bool("tie_word_embeddings")
        .or_else(|| cx.cfg.bool("tie_embedding"))
    {
        Some((t, s)) => {
            cx.log
                .add("tied", t as u8, format!("{s}; the tie test confirms"), None);
            t
        }
        None => {
            cx.log.add(
                "tied",
                defaults.tied as u8,
                format!("default ({mt}): tie_word_embeddings absent; the tie test confirms"),
                Some("hf"),
            );
            defaults.tied
        }
    };
    if let Some(f) = rules.tie_flag(tied) {
        cx.log.flag(f);
    }
    tied
}

/// The attention output gate (Qwen3.5): `attn_output_gate`, else the family's.
fn output_gate(cx: &mut Cx<'_, '_>, defaults: &Defaults) -> bool {
    match cx.cfg.bool("attn_output_gate") {
        Some((g, s)) => {
            cx.log.add("attn_output_gate", g as u8, s, Some("golden"));
            g
        }
        None if defaults.attn_output_gate => {
            let src = cx.omits("attn_output_gate");
            cx.log.add("attn_output_gate", 1, src, Some("inferred"));
            true
        }
        None => false,
    }
}

/// The config's keys nothing read: (ignored, the known-irrelevant ones; unknown, the rest).
fn leftovers(top: &serde_json::Map<String, Value>, cfg: &Cfg<'_>) -> (Vec<String>, Vec<String>) {
    let read = cfg.read.borrow().clone();
    let mut ignored = Vec::new();
    let mut unknown = Vec::new();
    let mut seen = BTreeSet::new();
    for map in std::iter::once(top).chain(cfg.text) {
        // Sorted: the log must not depend on how the JSON map keeps its keys (serde_json keeps
        // document order when any crate in the build enables `preserve_order`).
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        for k in keys {
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
    (ignored, unknown)
}

/// The short convolution's taps when any layer is a convolution (LFM2): `conv_L_cache`, else
/// the class default (3).
fn short_conv_kernel(cx: &mut Cx<'_, '_>, kinds: &[LayerKind]) -> Result<Option<u64>, Refusal> {
    if !kinds.contains(&LayerKind::Conv) {
        return Ok(None);
    }
    match cx.cfg.u64("conv_L_cache") {
        Some((0, s)) => Err(Refusal::new(
            cx.mt,
            "conv_L_cache",
            0,
            format!("a convolution of 0 taps ({s})"),
        )),
        Some((l, _)) => Ok(Some(l)),
        None => {
            let src = cx.omits("conv_L_cache");
            cx.log.add("conv_kernel", 3, src, Some("hf"));
            Ok(Some(3))
        }
    }
}

/// The linear-attention geometry, required when any layer is linear attention (Qwen3.5).
fn linear_dims(cx: &mut Cx<'_, '_>, kinds: &[LayerKind]) -> Result<Option<LinearDims>, Refusal> {
    if !kinds.contains(&LayerKind::LinearAttention) {
        return Ok(None);
    }
    let n_lin = kinds
        .iter()
        .filter(|k| **k == LayerKind::LinearAttention)
        .count();
    let g = |k: &str| cx.cfg.u64(k).map(|v| v.0).filter(|v| *v > 0);
    match (
        g("linear_num_key_heads"),
        g("linear_key_head_dim"),
        g("linear_num_value_heads"),
        g("linear_value_head_dim"),
    ) {
        (Some(kh), Some(kd), Some(vh), Some(vd)) => {
            let conv = g("linear_conv_kernel_dim").unwrap_or(4);
            cx.log.add(
                "linear",
                format!(
                    "key {kh}x{kd}, value {vh}x{vd}, conv channels {}, kernel {conv}",
                    kh.saturating_mul(kd).saturating_mul(2).saturating_add(vh.saturating_mul(vd))
                ),
                "config:linear_num_key_heads, linear_key_head_dim, linear_num_value_heads, linear_value_head_dim, linear_conv_kernel_dim",
                Some("inferred·ref"),
            );
            Ok(Some(LinearDims {
                key_heads: kh,
                key_head_dim: kd,
                value_heads: vh,
                value_head_dim: vd,
                conv_kernel: conv,
            }))
        }
        _ => Err(Refusal::new(
            cx.mt,
            "linear_num_key_heads",
            "absent",
            format!(
                "{n_lin} layer(s) are linear_attention but the config has no usable linear_num_*/linear_*_head_dim dims"
            ),
        )),
    }
}

/// The RoPE of every layer kind present: the shared reading of θ, the rotated share and the
/// scaling block, with the family's rules for its scaling types.
fn derive_rope(
    spec: &Spec,
    cx: &mut Cx<'_, '_>,
    d: u64,
    kinds: &[LayerKind],
) -> Result<BTreeMap<String, Rope>, Refusal> {
    let mut out = BTreeMap::new();
    let wanted: BTreeSet<&str> = kinds.iter().filter_map(LayerKind::rope_key).collect();
    let mt = cx.mt;
    for kind in wanted {
        let v5_key = if kind == "full" {
            "full_attention"
        } else {
            "sliding_attention"
        };
        let b = rope_block(cx.cfg, Some(v5_key));
        let (theta, theta_src) = b.theta.clone().unwrap_or((
            spec.rules.rope_theta(kind),
            format!("default ({mt}): rope_theta absent"),
        ));
        let partial = param(b.params, "partial_rotary_factor")
            .map(|p| (p, format!("{}.partial_rotary_factor", b.src)))
            .or_else(|| cx.cfg.f64("partial_rotary_factor"))
            .or(spec
                .defaults
                .partial_rotary_factor
                .map(|p| (p, format!("default ({mt}): partial_rotary_factor absent"))));
        let mut rotary_dim = d;
        if let Some((p, s)) = &partial {
            rotary_dim = (*p * d as f64).round() as u64;
            cx.log.add(
                &format!("rotary_dim[{kind}]"),
                rotary_dim,
                format!("{s} {} × head_dim {d}", fmt_f(*p)),
                None,
            );
        }
        let mut r = RopeCx {
            cx: &mut *cx,
            kind,
            block: &b,
            theta,
            theta_src,
            rotary_dim,
            head_dim: d,
            scaling_src: None,
        };
        let scaling = match spec.rules.rope_scaling(&mut r) {
            Some(s) => s?,
            None if b.ty == "default" => RopeScaling::None,
            None => {
                return Err(Refusal::new(
                    mt,
                    &format!("{}.rope_type", b.src),
                    &b.ty,
                    format!("{mt} rope_type \"{}\" is not implemented", b.ty),
                ));
            }
        };
        let (theta, theta_src, scaling_src) = (r.theta, r.theta_src, r.scaling_src);
        cx.log
            .add(&format!("rope_base[{kind}]"), fmt_f(theta), theta_src, None);
        let src = scaling_src.unwrap_or_else(|| {
            if b.ty == "default" {
                format!("{} (no scaling)", b.src)
            } else {
                format!("{}.rope_type {}", b.src, b.ty)
            }
        });
        cx.log
            .add(&format!("rope_scaling[{kind}]"), scaling.name(), src, None);
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
