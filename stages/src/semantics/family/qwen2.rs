//! Qwen2 / Qwen2.5 (`Qwen2Config`, and the text model of Qwen2.5-VL): llama with q/k/v biases
//! always (none on o_proj), sliding windows from `max_window_layers` on, and multimodal RoPE read
//! as plain RoPE for text.

use super::{FamilyRules, Layers, RopeCx, Spec};
use crate::semantics::config::Cx;
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, LayerKind, Refusal};

/// The Qwen2 family.
pub(crate) struct Qwen2;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    wrappers: &["qwen2_5_vl"],
    ..Spec::new(
        Family::Qwen2,
        &["qwen2", "qwen2_5_vl", "qwen2_5_vl_text"],
        &Qwen2,
    )
};

impl FamilyRules for Qwen2 {
    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { cx, kinds, window } = layers;
        if !window.on {
            return Ok(None);
        }
        let (m, s) = cx
            .cfg
            .u64("max_window_layers")
            .unwrap_or((0, "default".into()));
        for (i, k) in kinds.iter_mut().enumerate() {
            if i as u64 >= m {
                *k = LayerKind::SlidingAttention {
                    window: window.size.unwrap_or(0),
                };
            }
        }
        Ok(Some(format!(
            "config:use_sliding_window; {s}: layers ≥ {m} sliding"
        )))
    }

    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        super::qwen_mrope(r)
    }

    fn qkv_bias(&self, cx: &mut Cx<'_, '_>) -> bool {
        cx.log.add(
            "qkv_bias",
            1,
            "family:qwen2 (q/k/v biases always, none on o_proj)",
            Some("inferred"),
        );
        true
    }
}
