//! Granite (dense, `GraniteConfig`): llama with four multipliers, on the attention scores, the
//! embedding output, each residual branch and the logits.

use super::{EmbedScale, FamilyRules, Spec};
use crate::semantics::config::{Cx, fmt_f};
use crate::semantics::{Family, Multipliers};

/// The Granite family.
pub(crate) struct Granite;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec::new(Family::Granite, &["granite"], &Granite);

impl FamilyRules for Granite {
    fn attn_scale(&self, cx: &mut Cx<'_, '_>, head_dim: u64) -> (f64, Option<Multipliers>) {
        let get = |k: &str| cx.cfg.f64(k).map(|v| v.0);
        let (a, e, r, l) = (
            get("attention_multiplier"),
            get("embedding_multiplier"),
            get("residual_multiplier"),
            get("logits_scaling"),
        );
        let m = Multipliers {
            attention: a.unwrap_or(1.0 / (head_dim as f64).sqrt()),
            embedding: e.unwrap_or(1.0),
            residual: r.unwrap_or(1.0),
            logits_scaling: l.unwrap_or(1.0),
        };
        cx.log.add(
            "multipliers",
            format!(
                "attention {}, embedding {}, residual {}, logits ÷ {}",
                fmt_f(m.attention),
                fmt_f(m.embedding),
                fmt_f(m.residual),
                fmt_f(m.logits_scaling)
            ),
            "config:attention_multiplier, embedding_multiplier, residual_multiplier, logits_scaling",
            Some("inferred"),
        );
        cx.log.flag("granite_folded undecided: decide by data (GGUF q scale ratio or tie ratio); never apply twice");
        (m.attention, Some(m))
    }

    fn embed_scale(&self, _cx: &mut Cx<'_, '_>, _h: u64, m: Option<&Multipliers>) -> EmbedScale {
        (m.map(|m| m.embedding), false)
    }
}
