//! Hunyuan dense (`HunYuanDenseV1Config`: Hunyuan 0.5B–7B, Hunyuan-MT, Hy-MT2): llama with a
//! fixed NTK stretch of the RoPE base (`rope_scaling {"type": "dynamic", "alpha": α}` gives
//! `θ·α^(D/(D−2))`), q/k RMSNorm *after* RoPE, and fused attention payloads in q, k, v order.
//! Biases, cross-layer attention, other norms and MoE are refused.

use super::{FamilyRules, RopeCx, Spec};
use crate::semantics::config::{Cx, fmt_f};
use crate::semantics::rope::RopeScaling;
use crate::semantics::{Family, Moe, QkNorm, Refusal};

/// The Hunyuan dense family.
pub(crate) struct Hunyuan;

/// What names the family and what it fills in.
pub(super) const SPEC: Spec = Spec::new(Family::Hunyuan, &["hunyuan_v1_dense"], &Hunyuan);

impl FamilyRules for Hunyuan {
    fn rope_scaling(&self, r: &mut RopeCx<'_, '_, '_>) -> Option<Result<RopeScaling, Refusal>> {
        if r.block.ty != "dynamic" {
            return None;
        }
        let Some(alpha) = r.param("alpha") else {
            return Some(Err(Refusal::new(
                r.cx.mt,
                "rope_scaling.type",
                "dynamic",
                "hunyuan_v1_dense rope_scaling.type \"dynamic\" has no alpha: length-dependent dynamic NTK is not implemented",
            )));
        };
        for k in ["factor", "mscale", "mscale_all_dim"] {
            if let Some(v) = r.param(k)
                && v != 1.0
            {
                r.cx.log.add(
                    &format!("rope_scaling.{k}"),
                    fmt_f(v),
                    r.block.src.clone(),
                    Some("hf"),
                );
                r.cx.log
                    .flag("ignored with alpha (transformers), but not 1");
            }
        }
        let d = r.head_dim;
        let declared = r.theta;
        r.theta = declared * alpha.powf(d as f64 / (d as f64 - 2.0));
        r.theta_src = format!(
            "{} {} * {}.alpha {} ^ ({d}/{})",
            r.theta_src,
            fmt_f(declared),
            r.block.src,
            fmt_f(alpha),
            d.saturating_sub(2)
        );
        Some(Ok(RopeScaling::DynamicAlpha {
            alpha,
            theta: declared,
        }))
    }

    fn qk_norm(&self, cx: &mut Cx<'_, '_>) -> QkNorm {
        match cx.cfg.bool("use_qk_norm") {
            Some((false, s)) => {
                cx.log.add(
                    "qk_norm",
                    "after_rope",
                    format!(
                        "{s} false, but transformers applies the norm whenever the weights exist"
                    ),
                    Some("hf"),
                );
                cx.log.flag(
                    "use_qk_norm false: the pack's q_norm/k_norm weights decide (check_pack)",
                );
            }
            Some((true, s)) => cx.log.add(
                "qk_norm",
                "after_rope",
                format!("{s}; order: RoPE, then norm (family:hunyuan_v1_dense)"),
                Some("seed #2218"),
            ),
            None => cx.log.add(
                "qk_norm",
                "after_rope",
                "default (hunyuan_v1_dense): use_qk_norm absent; order: RoPE, then norm",
                Some("hf"),
            ),
        }
        QkNorm::AfterRope
    }

    fn refusals(&self, cx: &mut Cx<'_, '_>) -> Result<(), Refusal> {
        let mt = cx.mt;
        for (key, what) in [
            ("attention_bias", "attention_bias true is not implemented"),
            ("mlp_bias", "mlp_bias true is not implemented"),
            (
                "use_cla",
                "use_cla true (cross-layer attention) is not implemented",
            ),
        ] {
            if cx.cfg.bool(key).is_some_and(|b| b.0) {
                return Err(Refusal::new(
                    mt,
                    key,
                    true,
                    format!("hunyuan_v1_dense {what}"),
                ));
            }
        }
        if let Some((n, _)) = cx.cfg.str("norm_type")
            && n != "rms"
        {
            return Err(Refusal::new(
                mt,
                "norm_type",
                n,
                format!("hunyuan_v1_dense norm_type \"{n}\" is not implemented (rms)"),
            ));
        }
        for k in ["num_experts", "moe_topk"] {
            if cx.cfg.get(k).is_some() {
                return Err(Refusal::new(
                    mt,
                    k,
                    "present",
                    format!("hunyuan_v1_dense {k}: MoE is not implemented"),
                ));
            }
        }
        Ok(())
    }

    fn moe(&self, cx: &mut Cx<'_, '_>) -> Result<Option<Moe>, Refusal> {
        // MoE keys were refused above; a zero or non-numeric expert width is read as harmless.
        for k in ["num_experts", "num_local_experts", "moe_intermediate_size"] {
            let _ = cx.cfg.get(k);
        }
        Ok(None)
    }

    fn tile_order(&self, cx: &mut Cx<'_, '_>) -> &'static str {
        cx.log.add(
            "tile_order",
            "qkv",
            format!("family:{} (fused payloads store q, k, v)", cx.mt),
            Some("seed #2218"),
        );
        "qkv"
    }
}
