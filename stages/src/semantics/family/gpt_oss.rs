//! gpt-oss (`GptOssConfig`): alternating sliding/full attention (sliding first), YaRN RoPE with
//! base 150,000, attention sinks on every layer, and a mixture-of-experts MLP.

use super::{Defaults, FamilyRules, Layers, RopeCx, Spec};
use crate::semantics::config::{Cx, fmt_f};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, LayerKind, Moe, Refusal};

/// The gpt-oss family.
pub(crate) struct GptOss;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    defaults: Defaults {
        attn_sinks: true,
        ..Defaults::SHARED
    },
    ..Spec::new(Family::GptOss, &["gpt_oss"], &GptOss)
};

impl FamilyRules for GptOss {
    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { kinds, window, .. } = layers;
        let w = window.size.unwrap_or(128);
        for (i, k) in kinds.iter_mut().enumerate() {
            if i % 2 == 0 {
                *k = LayerKind::SlidingAttention { window: w };
            }
        }
        Ok(Some("family:gpt_oss alternating, sliding first".into()))
    }

    fn rope_theta(&self, _kind: &str) -> f64 {
        1.5e5
    }

    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        (r.block.ty == "yarn").then(|| {
            Ok(RopeScaling::Yarn {
                factor: r.param("factor").unwrap_or(1.0),
                beta_fast: r.param("beta_fast").unwrap_or(32.0),
                beta_slow: r.param("beta_slow").unwrap_or(1.0),
                original: r
                    .param("original_max_position_embeddings")
                    .unwrap_or(4096.0),
                truncate: r
                    .block
                    .params
                    .and_then(|p| p.get("truncate"))
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(true),
            })
        })
    }

    fn moe(&self, cx: &mut Cx<'_, '_>) -> Result<Option<Moe>, Refusal> {
        let e = cx.cfg.u64("num_local_experts").map(|v| v.0).unwrap_or(0);
        let k = cx
            .cfg
            .u64("num_experts_per_tok")
            .or_else(|| cx.cfg.u64("experts_per_token"))
            .map(|v| v.0)
            .unwrap_or(0);
        cx.log.add(
            "moe",
            format!("{e} experts, {k} per token"),
            "config:num_local_experts, num_experts_per_tok",
            Some("inferred"),
        );
        cx.log.add(
            "attn_sinks",
            1,
            "family:gpt_oss (self_attn.sinks)",
            Some("inferred"),
        );
        if let Some((l, s)) = cx.cfg.f64("swiglu_limit") {
            cx.log.add("swiglu_limit", fmt_f(l), s, Some("inferred"));
        }
        Ok(Some(Moe {
            experts: e,
            per_token: k,
        }))
    }
}
