//! A pack's `rope_freqs.weight` against the RoPE the semantics derive from config.json.
//!
//! llama.cpp keeps Llama 3's (and LongRoPE's) frequency scaling as a tensor of per-frequency
//! divisors `inv_i / inv_i'` (`inv_i = θ^(−2i/D)` unscaled, `inv_i'` as the model uses it), and
//! FastFlowLM's packs copy it. Our runtime computes the frequencies from config.json
//! ([`Rope::inv_freq`]), so a pack whose stored divisors differ from what its config implies would
//! be run with other frequencies than it carries: verify compares them, value by value, and fails
//! the tensor when they differ (semantics.md §4.1).

use crate::error::Result;
use crate::format::q4nx::Container;
use crate::layout::TensorLayout;
use crate::semantics::Rope;

use super::{Verdict, VerifyRow, whole};

/// The pack (and GGUF) name of llama.cpp's frequency-divisor tensor.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// Relative tolerance of a stored divisor: the pack stores it in bf16 (8 significant bits), so
/// one bf16 step, 2⁻⁸, with the f32 rounding of llama.cpp's own computation well inside it.
pub const TOLERANCE: f64 = 1.0 / 256.0;

/// The divisors `rope` implies, one per rotated pair.
pub fn implied_divisors(rope: &Rope) -> Vec<f64> {
    let d = rope.rotary_dim as f64;
    (0..(rope.rotary_dim / 2) as usize)
        .map(|i| rope.base.powf(-(2.0 * i as f64) / d) / rope.inv_freq(i))
        .collect()
}

/// The row comparing the pack's `rope_freqs.weight` with the divisors `rope` implies; `rope` is
/// the semantics' RoPE of full-attention layers, or why there is none (no config.json, or the
/// semantics refused it).
pub fn rope_freqs_row(
    c: &Container,
    l: &TensorLayout,
    rope: std::result::Result<&Rope, &str>,
) -> Result<VerifyRow> {
    let rope = match rope {
        Ok(r) => r,
        Err(why) => {
            let mut row = VerifyRow::new(l, "semantics".into());
            row.reason = format!("NO_REF: no RoPE from config.json to compare with: {why}");
            return Ok(row);
        }
    };
    let want = implied_divisors(rope);
    let mut row = VerifyRow::new(
        l,
        format!(
            "semantics: rope_scaling {} (θ {}, {} rotated dims) from config.json",
            rope.scaling.name(),
            rope.base,
            rope.rotary_dim
        ),
    );
    let n = l.rows * l.k;
    if n != want.len() as u64 {
        row.verdict = Verdict::Fail;
        row.reason = format!(
            "the pack stores {n} divisors but config.json's RoPE rotates {} pairs",
            want.len()
        );
        return Ok(row);
    }
    let got = whole(c, l, l.rows)?;
    let mut worst = (0usize, 0f64);
    let mut max_abs = 0f64;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let err = (g as f64 - w).abs();
        max_abs = max_abs.max(err);
        let rel = err / w.abs().max(f64::MIN_POSITIVE);
        if rel > worst.1 || !rel.is_finite() {
            worst = (i, rel);
        }
    }
    row.compared = n;
    row.max_err = Some(max_abs);
    row.rel_l1 = Some(worst.1);
    let (i, rel) = worst;
    (row.verdict, row.reason) = if rel <= TOLERANCE {
        (
            Verdict::Pass,
            format!(
                "every divisor within {TOLERANCE:.4} (relative) of config.json's: worst {rel:.2e} at [{i}]"
            ),
        )
    } else {
        (
            Verdict::Fail,
            format!(
                "rope_freqs.weight[{i}] is {} but config.json's rope_scaling implies {:.6} (relative difference {rel:.3e}); the runtime follows config.json, so this pack would not run with the frequencies it carries",
                got[i], want[i]
            ),
        )
    };
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::semantics::RopeScaling;

    #[test]
    fn llama3_divisors_are_those_llama_cpp_stores() {
        // Llama-3.2-1B: θ 500000, D 64, factor 32, low 1, high 4, original 8192
        // (convert_hf_to_gguf.py writes 1 for short wavelengths, 32 for long, a blend between).
        let rope = Rope {
            base: 500000.0,
            rotary_dim: 64,
            scaling: RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original: 8192.0,
            },
        };
        let d = implied_divisors(&rope);
        assert_eq!(d.len(), 32);
        assert!((d[0] - 1.0).abs() < 1e-12, "{}", d[0]);
        assert!((d[31] - 32.0).abs() < 1e-9, "{}", d[31]);
        let blended = d
            .iter()
            .filter(|&&x| x > 1.0 + 1e-9 && x < 32.0 - 1e-9)
            .count();
        assert!(blended > 0, "{d:?}");
        // The blend, as llama.cpp computes it: 1 / ((1 − s)/f + s).
        for (i, &x) in d.iter().enumerate() {
            let freq = 500000f64.powf(-(2.0 * i as f64) / 64.0);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let want = if wavelen < 8192.0 / 4.0 {
                1.0
            } else if wavelen > 8192.0 {
                32.0
            } else {
                let s = (8192.0 / wavelen - 1.0) / 3.0;
                1.0 / ((1.0 - s) / 32.0 + s)
            };
            assert!((x - want).abs() < 1e-9 * want, "{i}: {x} vs {want}");
        }
    }

    #[test]
    fn no_scaling_implies_ones() {
        let rope = Rope {
            base: 10000.0,
            rotary_dim: 8,
            scaling: RopeScaling::None,
        };
        assert_eq!(implied_divisors(&rope), vec![1.0; 4]);
    }
}
