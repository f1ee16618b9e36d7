//! The runtime's model description from the semantics: the [`ModelSpec`] resolved once (RoPE
//! tables per layer kind, norm and scale flags) and the tensor table from the detected layouts,
//! each decision with its source. A family the host forward pass does not run is refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use onebit_pack::manifest::TensorEntry;
use onebit_pack::spec::{Act, LayerSpec, Mixer, ModelSpec, RopeTable, ValueHeadOrder};

use crate::error::{Error, Result};
use crate::layout::geometry::ffn_pad_of;
use crate::layout::{Layout, TensorLayout};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Activation, Family, LayerKind, Semantics};

/// Families the host forward pass runs.
pub const HOST_FAMILIES: [Family; 7] = [
    Family::Gemma3,
    Family::Llama,
    Family::Qwen2,
    Family::Qwen3,
    Family::Hunyuan,
    Family::Lfm2,
    Family::Qwen3_5,
];

/// FFN width above which FastFlowLM's converter puts a Qwen3.5 pack's value heads in
/// transformers' grouped order (q4nx-format §5, "qwen35 big (4B/9B: FFN > 6144)"); below it the
/// pack keeps llama.cpp's tiled order.
pub const QWEN35_GROUPED_ABOVE_FFN: u64 = 6144;

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
                "the host runtime does not run family {:?} ({}) yet; it runs gemma3, llama, qwen2, qwen3, hunyuan_v1_dense, lfm2, qwen3_5",
                sem.family, sem.model_type
            ),
        ));
    }
    refuse_unsupported(sem, file)?;
    let (layers, ropes) = layer_specs(sem, file, &mut dec)?;
    if sem.attn_output_gate {
        dec.push(
            "attn_output_gate=true <- semantics attn_output_gate (q_proj rows: all q, then all gates)"
                .into(),
        );
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
    // The family's FFN padding (q4nx-format §4): the pack's gate/up rows and down columns are the
    // padded width, the padding zero, so the forward pass runs at that width with the same result.
    let pad = ffn_pad_of(&sem.model_type);
    let ffn = sem.intermediate.div_ceil(pad) * pad;
    if ffn != sem.intermediate {
        dec.push(format!(
            "ffn={ffn} <- semantics intermediate {} padded to a multiple of {pad} (model_type {}, q4nx-format §4; the padding is zero)",
            sem.intermediate, sem.model_type
        ));
    }
    let spec = ModelSpec {
        family: sem.model_type.clone(),
        hidden: sem.hidden as usize,
        heads: sem.heads as usize,
        kv_heads: sem.kv_heads as usize,
        head_dim: sem.head_dim as usize,
        ffn: ffn as usize,
        vocab: sem.vocab as usize,
        eps: sem.eps as f32,
        norm_add_one: false,
        act: match sem.activation {
            Activation::Silu => Act::Silu,
            Activation::GeluTanh => Act::GeluTanh,
        },
        layers,
        ropes,
        qk_norm: sem.qk_norm,
        sandwich_norms: sandwich,
        attn_scale: sem.attn_scale as f32,
        qkv_bias: sem.qkv_bias,
        embed_scale,
        tied_head_divisor: tied_div,
        tied_head: sem.tied,
        attn_output_gate: sem.attn_output_gate,
        final_softcap: sem.final_softcap.map(|v| v as f32),
        attn_softcap: sem.attn_softcap.map(|v| v as f32),
        bos: sem.bos_id.map(|v| v as u32),
        add_bos: sem.add_bos,
        eos: sem.eos_ids.iter().map(|&v| v as u32).collect(),
        context: sem.context.unwrap_or(4096) as usize,
    };
    Ok((spec, dec))
}

/// Refuses what the semantics hold and the host runtime does not implement.
fn refuse_unsupported(sem: &Semantics, file: &Path) -> Result<()> {
    let unsupported = [
        (sem.moe.is_some(), "mixture-of-experts layers"),
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
    Ok(())
}

/// Each layer's mixer, window and RoPE table, and the tables (one per layer kind that uses
/// RoPE; one empty table when none does, so index 0 stays valid); records each table and the
/// layers of each non-attention mixer.
fn layer_specs(
    sem: &Semantics,
    file: &Path,
    dec: &mut Vec<String>,
) -> Result<(Vec<LayerSpec>, Vec<RopeTable>)> {
    let mut ropes: Vec<RopeTable> = Vec::new();
    let mut rope_index: BTreeMap<String, usize> = BTreeMap::new();
    let mut layers = Vec::new();
    let delta_net = delta_net_mixer(sem, file, dec)?;
    for (i, kind) in sem.layer_kinds.iter().enumerate() {
        let window = match kind {
            LayerKind::FullAttention => None,
            LayerKind::SlidingAttention { window } => Some(*window as usize),
            LayerKind::Conv => {
                let kernel = sem.conv_kernel.unwrap_or(3) as usize;
                // No RoPE: the index is never read (0, or a table added below).
                layers.push(LayerSpec {
                    window: None,
                    rope: 0,
                    mixer: Mixer::ShortConv { kernel },
                });
                continue;
            }
            LayerKind::LinearAttention => {
                let mixer = delta_net.ok_or_else(|| {
                    refuse(
                        file,
                        &format!("layer_kind[{i}]"),
                        "a linear_attention layer without linear dims in the semantics",
                    )
                })?;
                layers.push(LayerSpec {
                    window: None,
                    rope: 0,
                    mixer,
                });
                continue;
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
        layers.push(LayerSpec {
            window,
            rope: idx,
            mixer: Mixer::Attention,
        });
    }
    // The indices of the layers whose mixer matches, for the decisions.
    let indices = |f: fn(&Mixer) -> bool| -> Vec<String> {
        (0..layers.len())
            .filter(|&i| f(&layers[i].mixer))
            .map(|i| i.to_string())
            .collect()
    };
    let conv = indices(|m| matches!(m, Mixer::ShortConv { .. }));
    if !conv.is_empty() {
        dec.push(format!(
            "mixer[{}]=short convolution of {} taps <- semantics layer_kind conv, conv_kernel",
            conv.join(","),
            sem.conv_kernel.unwrap_or(3)
        ));
    }
    let linear = indices(|m| matches!(m, Mixer::GatedDeltaNet { .. }));
    if !linear.is_empty() {
        dec.push(format!(
            "mixer[{}]=gated DeltaNet <- semantics layer_kind linear_attention, linear dims",
            linear.join(",")
        ));
    }
    if ropes.is_empty() {
        // Every layer a convolution: keep index 0 valid.
        ropes.push(RopeTable {
            inv_freq: Vec::new(),
            attention_factor: 1.0,
        });
    }
    Ok((layers, ropes))
}

/// The gated-DeltaNet mixer of a model with linear dims, its value-head order decided (and
/// recorded) by the FastFlowLM rule.
fn delta_net_mixer(sem: &Semantics, file: &Path, dec: &mut Vec<String>) -> Result<Option<Mixer>> {
    let Some(l) = &sem.linear else {
        return Ok(None);
    };
    if l.key_heads == 0 || l.value_heads % l.key_heads != 0 {
        return Err(refuse(
            file,
            "linear_num_value_heads",
            format!(
                "{} value heads do not share {} key heads evenly",
                l.value_heads, l.key_heads
            ),
        ));
    }
    let value_order = if l.value_heads == l.key_heads {
        dec.push(format!(
            "value_order=tiled <- linear_num_value_heads = linear_num_key_heads = {} (no sharing: both orders agree)",
            l.key_heads
        ));
        ValueHeadOrder::Tiled
    } else if sem.intermediate > QWEN35_GROUPED_ABOVE_FFN {
        dec.push(format!(
            "value_order=grouped <- intermediate {} > {QWEN35_GROUPED_ABOVE_FFN}: FastFlowLM reorders a big Qwen3.5's value heads into transformers' order (q4nx-format §5, inferred)",
            sem.intermediate
        ));
        ValueHeadOrder::Grouped
    } else {
        dec.push(format!(
            "value_order=tiled <- intermediate {} <= {QWEN35_GROUPED_ABOVE_FFN}: the pack keeps llama.cpp's order (value head j reads key head j mod {})",
            sem.intermediate, l.key_heads
        ));
        ValueHeadOrder::Tiled
    };
    Ok(Some(Mixer::GatedDeltaNet {
        key_heads: l.key_heads as usize,
        key_dim: l.key_head_dim as usize,
        value_heads: l.value_heads as usize,
        value_dim: l.value_head_dim as usize,
        kernel: l.conv_kernel as usize,
        value_order,
    }))
}

/// The tensor table from the detected layouts.
pub fn tensor_entries(layouts: &[TensorLayout]) -> BTreeMap<String, TensorEntry> {
    layouts
        .iter()
        .map(|l| {
            let kind = match &l.layout {
                Layout::Tiled { kind, .. } => kind.name().to_string(),
                Layout::Plain => l.dtype.clone(),
                Layout::MmBlock { .. } => l.reading(),
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
