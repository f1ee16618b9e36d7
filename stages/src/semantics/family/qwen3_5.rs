//! Qwen3.5 / 3.6 hybrids (`Qwen3_5TextConfig`): gated DeltaNet linear-attention layers beside
//! full attention (every `full_attention_interval`-th layer full), head_dim 256, a quarter of
//! each head rotated, q/k RMSNorm before RoPE, norms stored as `1+w`, and a sigmoid output gate in
//! `q_proj`.

use super::{Defaults, FamilyRules, Layers, RopeCx, Spec};
use crate::semantics::config::Cx;
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, LayerKind, NormForm, QkNorm, Refusal};

/// The Qwen3.5 family.
pub(crate) struct Qwen3_5;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    wrappers: &["qwen3_5"],
    defaults: Defaults {
        head_dim: Some(256),
        partial_rotary_factor: Some(0.25),
        attn_output_gate: true,
        ..Defaults::SHARED
    },
    ..Spec::new(Family::Qwen3_5, &["qwen3_5", "qwen3_5_text"], &Qwen3_5)
};

impl FamilyRules for Qwen3_5 {
    fn layer_type(&self, name: &str) -> Option<LayerKind> {
        (name == "linear_attention").then_some(LayerKind::LinearAttention)
    }

    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { cx, kinds, .. } = layers;
        let (n, s) = cx
            .cfg
            .u64("full_attention_interval")
            .unwrap_or((4, cx.omits("full_attention_interval")));
        for (i, k) in kinds.iter_mut().enumerate() {
            if i as u64 % n.max(1) != n.max(1) - 1 {
                *k = LayerKind::LinearAttention;
            }
        }
        Ok(Some(format!(
            "{s}: layer i full iff i % {n} == {}",
            n.max(1) - 1
        )))
    }

    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        super::qwen_mrope(r)
    }

    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        super::qk_norm_before_rope(cx)
    }

    fn norm_form(&self, cx: &mut Cx<'_, '_>) -> NormForm {
        cx.log.add(
            "norm_form",
            "stored_w+1 (apply as stored, ssm_norm plain)",
            "family:qwen3_5 (llama.cpp convention)",
            Some("inferred"),
        );
        NormForm::StoredOnePlusW
    }
}
