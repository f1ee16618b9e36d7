//! The model families: one file per family, each read top to bottom like that family's config
//! class in transformers (its defaults, the keys only it has, its refusals and the decisions it
//! records), behind one small interface, [`FamilyRules`]. Every hook has the rule most families
//! share as its default, so a family file states only where it differs.
//!
//! Adding a family: one new file here (its [`Spec`] and its rules) and one line in [`REGISTRY`].

mod gemma3;
mod gemma4;
mod gpt_oss;
mod granite;
mod hunyuan;
mod lfm2;
mod llama;
mod nanbeige;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_5;
mod refused;

use serde_json::{Map, Value};

use super::config::Cx;
use super::rope::{RopeBlock, RopeScaling, param};
use super::{Family, LayerKind, Moe, Multipliers, NormForm, QkNorm, Refusal};

/// Every family with semantics, in the order `model_type` is looked up.
pub(crate) const REGISTRY: &[Spec] = &[
    llama::SPEC,
    nanbeige::SPEC,
    granite::SPEC,
    qwen2::SPEC,
    qwen3::SPEC,
    qwen3_5::SPEC,
    gemma3::SPEC,
    gemma4::SPEC,
    hunyuan::SPEC,
    lfm2::SPEC,
    phi3::SPEC,
    gpt_oss::SPEC,
];

/// What names a family and the constants its config class fills in: data, stated once in the
/// family's file, beside the rules that are code ([`FamilyRules`]).
pub(crate) struct Spec {
    /// The family.
    pub(crate) family: Family,
    /// The `model_type` values that name it (after unwrapping multimodal wrappers).
    pub(crate) model_types: &'static [&'static str],
    /// Outer `model_type`s of multimodal wrappers whose `text_config.model_type` is read instead.
    pub(crate) wrappers: &'static [&'static str],
    /// Constant defaults.
    pub(crate) defaults: Defaults,
    /// The family's rules.
    pub(crate) rules: &'static dyn FamilyRules,
}

impl Spec {
    /// A family with no wrappers and the shared defaults.
    pub(crate) const fn new(
        family: Family,
        model_types: &'static [&'static str],
        rules: &'static dyn FamilyRules,
    ) -> Spec {
        Spec {
            family,
            model_types,
            wrappers: &[],
            defaults: Defaults::SHARED,
            rules,
        }
    }
}

/// Constant defaults of a family: what its config class fills in when config.json omits a key.
/// `None` means the family has no default of its own (the shared rule applies, or the key is
/// required).
pub(crate) struct Defaults {
    /// `num_attention_heads`.
    pub(crate) heads: Option<u64>,
    /// `num_key_value_heads` (else MHA).
    pub(crate) kv_heads: Option<u64>,
    /// `head_dim` (else hidden / heads).
    pub(crate) head_dim: Option<u64>,
    /// `vocab_size`.
    pub(crate) vocab: Option<u64>,
    /// `rms_norm_eps` (else 1e-6, FLAGged).
    pub(crate) eps: Option<f64>,
    /// `tie_word_embeddings`.
    pub(crate) tied: bool,
    /// `partial_rotary_factor`.
    pub(crate) partial_rotary_factor: Option<f64>,
    /// `attn_output_gate` (the default is recorded as inferred when true).
    pub(crate) attn_output_gate: bool,
    /// Attention sinks on every layer (`self_attn.sinks`).
    pub(crate) attn_sinks: bool,
    /// The key naming the MLP activation and its default.
    pub(crate) activation: ActivationRule,
}

impl Defaults {
    /// The shared defaults (llama's).
    pub(crate) const SHARED: Defaults = Defaults {
        heads: None,
        kv_heads: None,
        head_dim: None,
        vocab: None,
        eps: None,
        tied: false,
        partial_rotary_factor: None,
        attn_output_gate: false,
        attn_sinks: false,
        activation: ActivationRule::HIDDEN_ACT,
    };
}

/// Where the MLP activation is named and what it is when the config omits it.
pub(crate) struct ActivationRule {
    /// The config key.
    pub(crate) key: &'static str,
    /// The activation when the key is absent.
    pub(crate) default: &'static str,
    /// Whether the default is the family's own (its config class states it; tagged `hf`) rather
    /// than the shared fallback.
    pub(crate) family_default: bool,
}

impl ActivationRule {
    /// `hidden_act`, SiLU when absent.
    pub(crate) const HIDDEN_ACT: ActivationRule = ActivationRule {
        key: "hidden_act",
        default: "silu",
        family_default: false,
    };
}

/// Where the layers of a family go when `layer_types` is absent: the sliding window as read.
pub(crate) struct Window {
    /// `sliding_window`, when positive.
    pub(crate) size: Option<u64>,
    /// Whether the window is in force (`use_sliding_window` not false).
    pub(crate) on: bool,
}

/// What a family's layer pattern reads and changes: the config, the layer kinds (all full
/// attention on entry) and the sliding window as read.
pub(crate) struct Layers<'r, 'c, 'a> {
    /// The config, the log, the model type.
    pub(crate) cx: &'r mut Cx<'c, 'a>,
    /// The kinds, one per layer.
    pub(crate) kinds: &'r mut [LayerKind],
    /// The sliding window.
    pub(crate) window: &'r Window,
}

/// One RoPE block as a family's rules see it: the block read, and the base and its source, which
/// a family may change (Hunyuan's α stretch, Gemma 3's local base).
pub(crate) struct RopeCx<'r, 'c, 'a> {
    /// The config, the log, the model type.
    pub(crate) cx: &'r mut Cx<'c, 'a>,
    /// `full` or `sliding`.
    pub(crate) kind: &'r str,
    /// The RoPE block of that kind.
    pub(crate) block: &'r RopeBlock<'a>,
    /// θ.
    pub(crate) theta: f64,
    /// θ's source.
    pub(crate) theta_src: String,
    /// Rotated dimensions.
    pub(crate) rotary_dim: u64,
    /// Head dim D.
    pub(crate) head_dim: u64,
    /// The source the `rope_scaling[kind]` decision prints, when the family's rule is not the
    /// block's `rope_type`.
    pub(crate) scaling_src: Option<String>,
}

impl RopeCx<'_, '_, '_> {
    /// A number of the block's parameters.
    pub(crate) fn param(&self, k: &str) -> Option<f64> {
        param(self.block.params, k)
    }
}

/// The embedding output scale, and whether the pack stores the embedding pre-scaled.
pub(crate) type EmbedScale = (Option<f64>, bool);

/// What one model family adds to, or changes in, the shared reading of a config. The hooks are
/// called in the order the decision log prints; each default is the rule most families share.
pub(crate) trait FamilyRules: Sync {
    /// The FFN width from the declared one (LFM2 adjusts it).
    fn intermediate(&self, _cx: &mut Cx<'_, '_>, declared: (u64, String)) -> (u64, String) {
        declared
    }

    /// Keys of the family's own layer kinds, read before the kinds are (LFM2's convolution).
    fn layer_keys(&self, _cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        Ok(())
    }

    /// A `layer_types` entry only this family has.
    fn layer_type(&self, _name: &str) -> Option<LayerKind> {
        None
    }

    /// The layer pattern when `layer_types` is absent: changes `kinds` (all full attention on
    /// entry) and returns the source of the pattern, or `None` when every layer stays full.
    fn layer_pattern(&self, _layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        Ok(None)
    }

    /// Corrections to the layer kinds read (Gemma 4 forces its last layer full).
    fn fix_layer_kinds(&self, _cx: &mut Cx<'_, '_>, _kinds: &mut [LayerKind]) {}

    /// θ when the config states none, for `full` or `sliding` layers.
    fn rope_theta(&self, _kind: &str) -> f64 {
        1e4
    }

    /// The family's reading of a RoPE block: `None` when the family has no rule for its type (a
    /// `default` block is then plain RoPE and any other type is refused).
    fn rope_scaling(&self, _r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        None
    }

    /// Whether and where q/k are normalised per head.
    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        cx.log
            .add("qk_norm", "off", format!("family:{}", cx.mt), None);
        QkNorm::Off
    }

    /// The form the pack stores norm weights in.
    fn norm_form(&self, cx: &mut Cx<'_, '_>) -> NormForm {
        cx.log
            .add("norm_form", "w", format!("family:{}", cx.mt), None);
        NormForm::W
    }

    /// The attention score scale, and Granite's multipliers.
    fn attn_scale(&self, cx: &mut Cx<'_, '_>, head_dim: u64) -> (f64, Option<Multipliers>) {
        let s = 1.0 / (head_dim as f64).sqrt();
        cx.log.add(
            "attn_scale",
            super::config::fmt_f(s),
            format!("1/√head_dim (family:{})", cx.mt),
            None,
        );
        (s, None)
    }

    /// Config values this family cannot honour, checked once the attention is read.
    fn refusals(&self, _cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        Ok(())
    }

    /// Whether q/k/v carry biases regardless of `attention_bias` (Qwen2).
    fn qkv_bias(&self, _cx: &mut Cx<'_, '_>) -> bool {
        false
    }

    /// Keys only this family has, recorded or refused (Gemma 4).
    fn extra_keys(&self, _cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        Ok(())
    }

    /// The mixture-of-experts block: the shared rule refuses any MoE key.
    fn moe(&self, cx: &mut Cx<'_, '_>) -> Result<Option<Moe>, Refusal> {
        refuse_moe_keys(cx)?;
        Ok(None)
    }

    /// A FLAG on the tie decision.
    fn tie_flag(&self, _tied: bool) -> Option<&'static str> {
        None
    }

    /// The embedding output scale (`h`: the hidden size), and whether the pack stores the embedding
    /// pre-scaled.
    fn embed_scale(&self, _cx: &mut Cx<'_, '_>, _h: u64, _m: Option<&Multipliers>) -> EmbedScale {
        (None, false)
    }

    /// The order of q, k and v in fused attention payloads.
    fn tile_order(&self, cx: &mut Cx<'_, '_>) -> &'static str {
        cx.log
            .add("tile_order", "kqv", format!("family:{}", cx.mt), None);
        "kqv"
    }
}

/// The shared MoE rule: a positive expert count or expert width in a family without an MoE route.
pub(crate) fn refuse_moe_keys(cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
    for k in ["num_experts", "num_local_experts", "moe_intermediate_size"] {
        if cx
            .cfg
            .get(k)
            .and_then(|v| v.0.as_u64())
            .is_some_and(|n| n > 0)
        {
            return Err(Refusal::new(
                cx.mt,
                k,
                "present",
                format!("{} {k}: no MoE route for this family", cx.mt),
            ));
        }
    }
    Ok(())
}

/// Per-head RMSNorm before RoPE, the order every q/k-normed family but Hunyuan uses.
pub(crate) fn qk_norm_before_rope(cx: &mut Cx<'_, '_>) -> QkNorm {
    cx.log.add(
        "qk_norm",
        "before_rope",
        format!("family:{} (per-head RMSNorm, then RoPE)", cx.mt),
        Some("inferred·ref"),
    );
    QkNorm::BeforeRope
}

/// Multimodal `mrope` on a Qwen text model: plain RoPE for text; any other scaling type next to an
/// `mrope_section` is refused.
pub(crate) fn qwen_mrope(r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
    let b = r.block;
    match b.ty.as_str() {
        "default" => None,
        "mrope" | "mrope_interleaved" => {
            r.cx.log.add(
                &format!("rope_mrope[{}]", r.kind),
                "plain for text",
                format!("{} {}", b.src, b.ty),
                Some("inferred·ref"),
            );
            Some(Ok(RopeScaling::None))
        }
        t if b.params.is_some_and(|p| p.contains_key("mrope_section")) => Some(Err(Refusal::new(
            r.cx.mt,
            "rope_scaling.rope_type",
            t,
            format!("{} rope_type \"{t}\" is not implemented", r.cx.mt),
        ))),
        _ => None,
    }
}

/// The family of a config, after unwrapping multimodal wrappers (semantics.md §2), with the
/// `model_type` read.
pub(crate) fn family_of(top: &Map<String, Value>) -> Result<(&'static Spec, String), Refusal> {
    let outer = top.get("model_type").and_then(Value::as_str).unwrap_or("");
    let inner = top
        .get("text_config")
        .and_then(|t| t.get("model_type"))
        .and_then(Value::as_str);
    let wrapped = REGISTRY.iter().any(|f| f.wrappers.contains(&outer));
    let mt = match inner {
        Some(i) if wrapped => i,
        _ => outer,
    };
    if mt.is_empty() {
        return Err(Refusal::new(
            "",
            "model_type",
            "absent",
            "config.json has no model_type",
        ));
    }
    if let Some(f) = REGISTRY.iter().find(|f| f.model_types.contains(&mt)) {
        return Ok((f, mt.to_string()));
    }
    Err(refused::refusal(mt, top))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_registered_once_and_no_model_type_names_two() {
        let mut seen = std::collections::BTreeMap::new();
        for f in REGISTRY {
            for mt in f.model_types {
                assert_eq!(
                    seen.insert(*mt, f.family),
                    None,
                    "model_type {mt} named twice"
                );
            }
        }
        let families: std::collections::BTreeSet<String> =
            REGISTRY.iter().map(|f| format!("{:?}", f.family)).collect();
        assert_eq!(families.len(), REGISTRY.len());
    }
}
