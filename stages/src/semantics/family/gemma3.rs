//! Gemma 3 (`Gemma3TextConfig`): sliding-window layers with every `sliding_window_pattern`-th
//! layer full, a local RoPE base for sliding layers (never scaled), q/k RMSNorm before RoPE,
//! norms stored as `1+w`, scores scaled by `query_pre_attn_scalar^-1/2`, GELU (tanh), a tied head
//! and an embedding the pack stores already scaled by √hidden.

use super::{ActivationRule, Defaults, EmbedScale, FamilyRules, Layers, RopeCx, Spec};
use crate::semantics::config::{Cx, fmt_f};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, LayerKind, Multipliers, NormForm, QkNorm, Refusal};

/// The Gemma 3 family.
pub(crate) struct Gemma3;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    wrappers: &["gemma3"],
    defaults: Defaults {
        heads: Some(8),
        kv_heads: Some(4),
        head_dim: Some(256),
        vocab: Some(262208),
        eps: Some(1e-6),
        tied: true,
        activation: GEMMA_ACTIVATION,
        ..Defaults::SHARED
    },
    ..Spec::new(Family::Gemma3, &["gemma3", "gemma3_text"], &Gemma3)
};

/// Gemma's activation key and default (Gemma 3 and 4).
pub(super) const GEMMA_ACTIVATION: ActivationRule = ActivationRule {
    key: "hidden_activation",
    default: "gelu_pytorch_tanh",
    family_default: true,
};

impl FamilyRules for Gemma3 {
    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { cx, kinds, window } = layers;
        let (p, s) = cx
            .cfg
            .u64("sliding_window_pattern")
            .unwrap_or((6, cx.omits("sliding_window_pattern")));
        let w = window.size.unwrap_or(512);
        for (i, k) in kinds.iter_mut().enumerate() {
            if (i + 1) % p.max(1) as usize != 0 {
                *k = LayerKind::SlidingAttention { window: w };
            }
        }
        Ok(Some(format!(
            "{s}: layer i full iff (i+1) % {p} == 0 [seed #2248]"
        )))
    }

    fn rope_theta(&self, kind: &str) -> f64 {
        if kind == "full" { 1e6 } else { 1e4 }
    }

    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        if r.kind == "sliding" {
            let (t, s) = r.cx.cfg.f64("rope_local_base_freq").unwrap_or((
                1e4,
                format!("default ({}): rope_local_base_freq absent", r.cx.mt),
            ));
            r.theta = t;
            r.theta_src = format!("{s}; sliding layers are never scaled");
            r.scaling_src = Some("family:gemma3 (sliding layers are never scaled)".into());
            return Some(Ok(RopeScaling::None));
        }
        if r.block.ty != "linear" {
            return None;
        }
        let f = r.param("factor").unwrap_or(1.0);
        if r.cx.cfg.get("rope_local_base_freq").is_none() {
            r.cx.log.add(
                "rope_scale_variant",
                "seed: every layer",
                "config has no rope_local_base_freq",
                Some("seed #2248"),
            );
            r.cx.log.flag("the seed variant scales sliding layers too; this reader follows transformers and llama.cpp (full layers only)");
        }
        Some(Ok(RopeScaling::Linear { factor: f }))
    }

    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        super::qk_norm_before_rope(cx)
    }

    fn norm_form(&self, cx: &mut Cx<'_, '_>) -> NormForm {
        cx.log.add(
            "norm_form",
            "stored_1+w (apply as stored)",
            "family:gemma3 (the pack stores 1+w)",
            Some("seed #2248"),
        );
        NormForm::StoredOnePlusW
    }

    fn attn_scale(&self, cx: &mut Cx<'_, '_>, _head_dim: u64) -> (f64, Option<Multipliers>) {
        let (q, s) = cx
            .cfg
            .f64("query_pre_attn_scalar")
            .unwrap_or((256.0, cx.omits("query_pre_attn_scalar")));
        cx.log.add(
            "attn_scale",
            fmt_f(q.powf(-0.5)),
            format!("{s} {}^-1/2", fmt_f(q)),
            Some("seed #2248"),
        );
        (q.powf(-0.5), None)
    }

    fn refusals(&self, cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        let final_softcap = cx.cfg.f64("final_logit_softcapping").map(|v| v.0);
        let attn_softcap = cx.cfg.f64("attn_logit_softcapping").map(|v| v.0);
        if final_softcap.is_some() || attn_softcap.is_some() {
            return Err(Refusal::new(
                cx.mt,
                "final_logit_softcapping",
                final_softcap.or(attn_softcap).unwrap_or(0.0),
                "gemma3 with a logit softcap is not implemented",
            ));
        }
        Ok(())
    }

    fn embed_scale(&self, cx: &mut Cx<'_, '_>, h: u64, _m: Option<&Multipliers>) -> EmbedScale {
        let s = (h as f64).sqrt();
        cx.log.add("embed_scale", fmt_f(s), "family:gemma3 √hidden; the pack stores the embedding pre-scaled: do not scale the input again", Some("golden"));
        (Some(s), true)
    }
}
