//! Nanbeige: llama semantics (Llama 3 RoPE included), its heads untied in every known pack and
//! its FFN padded.

use super::{FamilyRules, RopeCx, Spec};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, Refusal};

/// The Nanbeige family.
pub(crate) struct Nanbeige;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec::new(Family::Nanbeige, &["nanbeige"], &Nanbeige);

impl FamilyRules for Nanbeige {
    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        super::llama::llama3_scaling(r)
    }

    fn tie_flag(&self, tied: bool) -> Option<&'static str> {
        tied.then_some("nanbeige heads are untied in every known pack")
    }
}
