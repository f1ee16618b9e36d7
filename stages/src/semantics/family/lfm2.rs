//! LFM2 / LFM2.5 (`Lfm2Config`, and the text model of LFM2-VL): gated short-convolution layers
//! beside attention layers (`full_attn_idxs`), an FFN width auto-adjusted from `block_ff_dim`,
//! RoPE base 10⁶, q/k RMSNorm before RoPE and a tied head.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{Defaults, FamilyRules, Layers, Spec};
use crate::semantics::config::{Cx, fmt_f};
use crate::semantics::{Family, LayerKind, QkNorm, Refusal};

/// The LFM2 family.
pub(crate) struct Lfm2;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec {
    wrappers: &["lfm2_vl", "lfm2-vl"],
    defaults: Defaults {
        tied: true,
        ..Defaults::SHARED
    },
    ..Spec::new(Family::Lfm2, &["lfm2", "lfm2_vl", "lfm2-vl"], &Lfm2)
};

impl FamilyRules for Lfm2 {
    fn intermediate(&self, cx: &mut Cx<'_, '_>, declared: (u64, String)) -> (u64, String) {
        let cfg = cx.cfg;
        if cfg.bool("block_auto_adjust_ff_dim").is_some_and(|b| b.0)
            && let (Some(mult), Some(m)) = (
                cfg.f64("block_ffn_dim_multiplier"),
                cfg.u64("block_multiple_of"),
            )
        {
            let base = cfg.u64("block_ff_dim").map_or(declared.0, |b| b.0);
            let adjusted = crate::layout::geometry::lfm2_ffn_width(base, mult.0, m.0);
            return (
                adjusted,
                format!(
                    "config:block_ff_dim {base} auto-adjusted ({} · ceil(int({} · int(2·{base}/3)) / {})); the gate_proj tile count confirms",
                    m.0,
                    fmt_f(mult.0),
                    m.0
                ),
            );
        }
        declared
    }

    fn layer_keys(&self, cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        if let Some((l, s)) = cx.cfg.u64("conv_L_cache") {
            cx.log.add("conv_kernel", l, s, Some("inferred"));
        }
        if let Some((b, s)) = cx.cfg.bool("conv_bias") {
            if b {
                return Err(Refusal::new(
                    cx.mt,
                    "conv_bias",
                    true,
                    "lfm2 conv_bias true is not implemented",
                ));
            }
            cx.log.add("conv_bias", 0, s, Some("inferred"));
        }
        Ok(())
    }

    fn layer_type(&self, name: &str) -> Option<LayerKind> {
        (name == "conv").then_some(LayerKind::Conv)
    }

    fn layer_pattern(&self, layers: Layers<'_, '_, '_>) -> Result<Option<String>, Refusal> {
        let Layers { cx, kinds, .. } = layers;
        let Some((Value::Array(idx), s)) = cx.cfg.get("full_attn_idxs") else {
            return Ok(None);
        };
        let set: BTreeSet<u64> = idx.iter().filter_map(Value::as_u64).collect();
        for (i, k) in kinds.iter_mut().enumerate() {
            if !set.contains(&(i as u64)) {
                *k = LayerKind::Conv;
            }
        }
        Ok(Some(format!("{s} (the rest conv)")))
    }

    fn rope_theta(&self, _kind: &str) -> f64 {
        1e6
    }

    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        super::qk_norm_before_rope(cx)
    }
}
