//! RoPE per layer kind: base, rotated dimensions and scaling, with the inverse frequencies each
//! scaling implies (semantics.md §4.1, §4.8, §4.11, §4.12, §4.13).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::config::{Cfg, fmt_f};

/// How the frequencies are scaled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Frequencies divided by `factor` (Gemma3 full layers).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3's piecewise scaling.
    Llama3 {
        /// `factor`.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original: f64,
    },
    /// Hunyuan's fixed base stretch `θ·α^(D/(D−2))`, already applied to `base`.
    DynamicAlpha {
        /// α.
        alpha: f64,
        /// The declared θ.
        theta: f64,
    },
    /// Phi-3 LongRoPE: per-frequency divisors, short below `original`, long above.
    LongRope {
        /// `short_factor`.
        short: Vec<f64>,
        /// `long_factor`.
        long: Vec<f64>,
        /// `original_max_position_embeddings`.
        original: f64,
        /// `max_position_embeddings`.
        max: f64,
        /// The cos/sin magnitude factor `√(1 + ln(max/orig)/ln(orig))`.
        mscale: f64,
    },
    /// YaRN (gpt-oss).
    Yarn {
        /// `factor`.
        factor: f64,
        /// `beta_fast`.
        beta_fast: f64,
        /// `beta_slow`.
        beta_slow: f64,
        /// `original_max_position_embeddings`.
        original: f64,
        /// `truncate`.
        truncate: bool,
    },
    /// Gemma4's proportional RoPE: pairs over the whole head dim, frequencies past `rot/2` zero.
    Proportional,
}

/// RoPE of one layer kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    /// The base θ actually used (after Hunyuan's α stretch).
    pub base: f64,
    /// Rotated dimensions (`partial_rotary_factor × D`).
    pub rotary_dim: u64,
    /// The scaling.
    pub scaling: RopeScaling,
}

impl Rope {
    /// Inverse frequency `i` (0 ≤ i < rotary_dim/2) after scaling, for short contexts.
    pub fn inv_freq(&self, i: usize) -> f64 {
        let d = self.rotary_dim as f64;
        let inv = self.base.powf(-(2.0 * i as f64) / d);
        match &self.scaling {
            RopeScaling::None | RopeScaling::DynamicAlpha { .. } | RopeScaling::Proportional => inv,
            RopeScaling::Linear { factor } => inv / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: lf,
                high_freq_factor: hf,
                original: l,
            } => {
                let wavelen = 2.0 * std::f64::consts::PI / inv;
                if wavelen < l / hf {
                    inv
                } else if wavelen > l / lf {
                    inv / factor
                } else {
                    let s = (l / wavelen - lf) / (hf - lf);
                    (1.0 - s) * inv / factor + s * inv
                }
            }
            RopeScaling::LongRope { short, .. } => inv / short.get(i).copied().unwrap_or(1.0),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original,
                ..
            } => {
                // YaRN's ramp between interpolation (inv/factor) and extrapolation (inv).
                let dim_of = |rot: f64| {
                    (d * (original / (rot * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * self.base.ln())
                };
                let (low, high) = (
                    dim_of(*beta_fast).floor().max(0.0),
                    dim_of(*beta_slow).ceil().min(d - 1.0),
                );
                let ramp = if high == low {
                    0.0
                } else {
                    ((i as f64 - low) / (high - low)).clamp(0.0, 1.0)
                };
                let extrapolation = 1.0 - ramp;
                inv / factor * (1.0 - extrapolation) + inv * extrapolation
            }
        }
    }
}

/// One RoPE block normalised from the v4 (`rope_theta` + `rope_scaling`) or v5
/// (`rope_parameters`, optionally per layer kind) spelling.
pub(crate) struct RopeBlock<'a> {
    /// θ with its source, when stated.
    pub(crate) theta: Option<(f64, String)>,
    /// `rope_type` (or `type`), `default` when absent.
    pub(crate) ty: String,
    /// The block's parameters.
    pub(crate) params: Option<&'a Map<String, Value>>,
    /// Where the block was read.
    pub(crate) src: String,
}

/// The block of RoPE parameters for a layer kind (`full_attention`, `sliding_attention`).
pub(crate) fn rope_block<'a>(cfg: &Cfg<'a>, kind: Option<&str>) -> RopeBlock<'a> {
    let top_theta = cfg.f64("rope_theta");
    if let Some((Value::Object(p), src)) = cfg.get("rope_parameters") {
        let block = match kind.and_then(|k| p.get(k)).and_then(Value::as_object) {
            Some(b) => b,
            None => p,
        };
        let bsrc = match kind {
            Some(k) if p.contains_key(k) => format!("{src}.{k}"),
            _ => src,
        };
        let theta = block
            .get("rope_theta")
            .and_then(Value::as_f64)
            .map(|t| (t, format!("{bsrc}.rope_theta")))
            .or(top_theta);
        let ty = block
            .get("rope_type")
            .or_else(|| block.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        return RopeBlock {
            theta,
            ty: ty.to_string(),
            params: Some(block),
            src: bsrc,
        };
    }
    match cfg.get("rope_scaling") {
        Some((Value::Object(s), src)) => {
            let ty = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            RopeBlock {
                theta: top_theta,
                ty: ty.to_string(),
                params: Some(s),
                src,
            }
        }
        _ => RopeBlock {
            theta: top_theta,
            ty: "default".into(),
            params: None,
            src: "config".into(),
        },
    }
}

impl RopeScaling {
    /// The scaling as the decision log prints it.
    pub(crate) fn name(&self) -> String {
        match self {
            RopeScaling::None => "none".to_string(),
            RopeScaling::Linear { factor } => format!("linear ÷{}", fmt_f(*factor)),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original,
            } => format!(
                "llama3 factor {} low {} high {} original {}",
                fmt_f(*factor),
                fmt_f(*low_freq_factor),
                fmt_f(*high_freq_factor),
                fmt_f(*original)
            ),
            RopeScaling::DynamicAlpha { alpha, .. } => {
                format!("dynamic alpha {} (applied to the base)", fmt_f(*alpha))
            }
            RopeScaling::LongRope { .. } => "longrope (short ≤ original, long above)".into(),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original,
                truncate,
            } => format!(
                "yarn factor {} beta_fast {} beta_slow {} original {} truncate {truncate}",
                fmt_f(*factor),
                fmt_f(*beta_fast),
                fmt_f(*beta_slow),
                fmt_f(*original)
            ),
            RopeScaling::Proportional => "proportional".into(),
        }
    }
}

/// A number of a RoPE parameter block.
pub(crate) fn param(p: Option<&Map<String, Value>>, k: &str) -> Option<f64> {
    p.and_then(|m| m.get(k)).and_then(Value::as_f64)
}
