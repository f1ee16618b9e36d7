//! Qwen3 (`Qwen3Config`, and the text model of Qwen3-VL): head_dim 128 by default, per-head q/k
//! RMSNorm before RoPE, multimodal RoPE read as plain RoPE for text; sliding windows refused.

use super::{Defaults, FamilyRules, Layers, RopeCx, Spec};
use crate::semantics::config::Cx;
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, QkNorm, Refusal};

/// The Qwen3 family.
pub(crate) struct Qwen3;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    wrappers: &["qwen3_vl"],
    defaults: Defaults {
        head_dim: Some(128),
        ..Defaults::SHARED
    },
    ..Spec::new(
        Family::Qwen3,
        &["qwen3", "qwen3_vl_text", "qwen3_vl"],
        &Qwen3,
    )
};

impl FamilyRules for Qwen3 {
    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { cx, window, .. } = layers;
        if window.on {
            return Err(Refusal::new(
                cx.mt,
                "use_sliding_window",
                true,
                "qwen3 use_sliding_window true is not implemented (no NPU2 pack uses it)",
            ));
        }
        Ok(None)
    }

    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        super::qwen_mrope(r)
    }

    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        super::qk_norm_before_rope(cx)
    }
}
