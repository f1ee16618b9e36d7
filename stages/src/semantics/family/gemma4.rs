//! Gemma 4 (E2B/E4B, `Gemma4TextConfig`): a 5:1 sliding/full pattern whose last layer is always
//! full, proportional RoPE on full layers, q/k RMSNorm before RoPE, unit score scale, GELU (tanh),
//! a tied head and a √hidden embedding scale; MoE and k=v attention refused.

use super::gemma3::GEMMA_ACTIVATION;
use super::{Defaults, EmbedScale, FamilyRules, Layers, RopeCx, Spec};
use crate::semantics::config::{Cx, fmt_f};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, LayerKind, Multipliers, QkNorm, Refusal};

/// The Gemma 4 family.
pub(crate) struct Gemma4;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    wrappers: &["gemma4"],
    defaults: Defaults {
        head_dim: Some(256),
        tied: true,
        activation: GEMMA_ACTIVATION,
        ..Defaults::SHARED
    },
    ..Spec::new(Family::Gemma4, &["gemma4", "gemma4_text"], &Gemma4)
};

impl FamilyRules for Gemma4 {
    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { kinds, window, .. } = layers;
        let w = window.size.unwrap_or(512);
        let n_layers = kinds.len();
        for (i, k) in kinds.iter_mut().enumerate() {
            if (i + 1) % 6 != 0 && i + 1 != n_layers {
                *k = LayerKind::SlidingAttention { window: w };
            }
        }
        Ok(Some(
            "default (gemma4): 5:1 pattern, last layer full [hf]".into(),
        ))
    }

    fn fix_layer_kinds(&self, cx: &mut Cx<'_, '_>, kinds: &mut [LayerKind]) {
        if let Some(last) = kinds.last_mut()
            && *last != LayerKind::FullAttention
        {
            *last = LayerKind::FullAttention;
            cx.log.add(
                "layer_kind_last",
                "full",
                "family:gemma4 forces the last layer full",
                Some("hf"),
            );
            cx.log.flag("layer_types states the last layer otherwise");
        }
    }

    fn rope_theta(&self, kind: &str) -> f64 {
        if kind == "full" { 1e6 } else { 1e4 }
    }

    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        (r.block.ty == "proportional").then_some(Ok(RopeScaling::Proportional))
    }

    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        super::qk_norm_before_rope(cx)
    }

    fn attn_scale(&self, cx: &mut Cx<'_, '_>, _head_dim: u64) -> (f64, Option<Multipliers>) {
        cx.log
            .add("attn_scale", "1", "family:gemma4", Some("inferred·ref"));
        (1.0, None)
    }

    fn extra_keys(&self, cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        for k in ["attention_k_eq_v", "enable_moe_block"] {
            if cx.cfg.bool(k).is_some_and(|b| b.0) {
                return Err(Refusal::new(
                    cx.mt,
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
            if let Some((v, s)) = cx.cfg.u64(k) {
                cx.log.add(k, v, s, Some("hf"));
            }
        }
        if let Some((b, s)) = cx.cfg.bool("use_double_wide_mlp") {
            cx.log.add("use_double_wide_mlp", b as u8, s, Some("hf"));
        }
        Ok(())
    }

    fn embed_scale(&self, cx: &mut Cx<'_, '_>, h: u64, _m: Option<&Multipliers>) -> EmbedScale {
        let s = (h as f64).sqrt();
        cx.log.add(
            "embed_scale",
            fmt_f(s),
            "family:gemma4 √hidden (rounded to the weight dtype)",
            Some("hf"),
        );
        cx.log
            .flag("whether the pack stores it pre-scaled is decided by data");
        (Some(s), false)
    }
}
