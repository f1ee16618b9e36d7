//! Qwen2 / Qwen2.5 (`Qwen2Config`, and the text model of Qwen2.5-VL): llama with q/k/v biases
//! always (none on o_proj), sliding windows from `max_window_layers` on, and multimodal RoPE read
//! as plain RoPE for text.

use super::{FamilyRules, RopeCx, Window};
use crate::semantics::config::Cx;
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, LayerKind, Refusal};

/// The Qwen2 family.
pub(crate) struct Qwen2;

impl FamilyRules for Qwen2 {
    fn family(&self) -> Family {
        Family::Qwen2
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["qwen2", "qwen2_5_vl", "qwen2_5_vl_text"]
    }

    fn wrappers(&self) -> &'static [&'static str] {
        &["qwen2_5_vl"]
    }

    fn layer_pattern(
        &self,
        cx: &mut Cx<'_, '_>,
        kinds: &mut [LayerKind],
        window: &Window,
    ) -> Result<Option<String>, Refusal> {
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
