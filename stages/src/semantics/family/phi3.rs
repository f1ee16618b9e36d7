//! Phi-3 / Phi-4-mini (`Phi3Config`): llama with LongRoPE, per-frequency divisors (short below
//! `original_max_position_embeddings`, long above) and a cos/sin magnitude factor.

use serde_json::Value;

use super::{FamilyRules, RopeCx, Spec};
use crate::semantics::config::fmt_f;
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, Refusal};

/// The Phi-3 family.
pub(crate) struct Phi3;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec::new(Family::Phi3, &["phi3"], &Phi3);

impl FamilyRules for Phi3 {
    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        (r.block.ty == "longrope").then(|| longrope(r))
    }
}

fn longrope(r: &mut RopeCx<'_, '_, '_>) -> Result<RopeScaling, Refusal> {
    let b = r.block;
    let arr = |k: &str| -> Vec<f64> {
        b.params
            .and_then(|p| p.get(k))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let (short, long) = (arr("short_factor"), arr("long_factor"));
    let half = r.rotary_dim / 2;
    if short.len() as u64 != half || long.len() as u64 != half {
        return Err(Refusal::new(
            r.cx.mt,
            "rope_scaling.short_factor",
            short.len(),
            format!(
                "longrope factors have {}/{} entries for {half} frequencies",
                short.len(),
                long.len(),
            ),
        ));
    }
    let cfg = r.cx.cfg;
    let original = cfg
        .f64("original_max_position_embeddings")
        .map(|v| v.0)
        .or(r.param("original_max_position_embeddings"))
        .unwrap_or(4096.0);
    let max = cfg
        .f64("max_position_embeddings")
        .map(|v| v.0)
        .unwrap_or(original);
    let mscale = if max > original {
        (1.0 + (max / original).ln() / original.ln()).sqrt()
    } else {
        1.0
    };
    r.cx.log.add(
        "rope_longrope",
        format!(
            "original {}, max {}, mscale {:.5}",
            fmt_f(original),
            fmt_f(max),
            mscale
        ),
        b.src.clone(),
        Some("inferred·ref"),
    );
    Ok(RopeScaling::LongRope {
        short,
        long,
        original,
        max,
        mscale,
    })
}
