//! Llama (`LlamaConfig`): llama, Llama 3.x, SmolLM2, R1-Distill-Llama. The shared rules are
//! llama's; the family adds Llama 3's piecewise RoPE scaling.

use super::{FamilyRules, RopeCx, Spec};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, Refusal};

/// The Llama family.
pub(crate) struct Llama;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec::new(Family::Llama, &["llama"], &Llama);

impl FamilyRules for Llama {
    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        llama3_scaling(r)
    }
}

/// `rope_type: llama3` with transformers' defaults for absent parameters.
pub(super) fn llama3_scaling(r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
    (r.block.ty == "llama3").then(|| {
        Ok(RopeScaling::Llama3 {
            factor: r.param("factor").unwrap_or(1.0),
            low_freq_factor: r.param("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: r.param("high_freq_factor").unwrap_or(4.0),
            original: r
                .param("original_max_position_embeddings")
                .unwrap_or(8192.0),
        })
    })
}
