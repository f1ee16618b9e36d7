//! The tied-head fit rule (verification.md §3, seed #2194): a tied head stored apart from the
//! embedding must be the embedding requantized, judged against the 4-bit noise floor of the
//! embedding itself (asymmetric, and symmetric for a head with signed codes).

use crate::format::tiles::Codes;

use super::{PairStats, Verdict, VerifyRow};

/// The 4-bit noise floor of `e` at block `b` (verification.md §3): requantize each row's b-column
/// blocks to 16 levels with min/max, then Σ|requant − e| / Σ|e|.
pub fn four_bit_floor(e: &[f32], k: usize, b: usize) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for row in e.chunks(k) {
        for blk in row.chunks(b) {
            let lo = blk.iter().copied().fold(f32::INFINITY, f32::min) as f64;
            let hi = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let scale = (hi - lo) / 15.0;
            for &v in blk {
                let v = v as f64;
                let q = if scale > 0.0 {
                    ((v - lo) / scale).round().clamp(0.0, 15.0)
                } else {
                    0.0
                };
                num += (lo + q * scale - v).abs();
                den += v.abs();
            }
        }
    }
    num / den.max(f64::MIN_POSITIVE)
}

/// The symmetric 4-bit noise floor of `e` at block `b`: each row's b-column blocks requantized as
/// Q4_0 does (`d` = the signed value of largest magnitude ÷ −8, codes −8..7), then
/// Σ|requant − e| / Σ|e|. The floor of heads whose tiles hold signed codes (Q40_*).
pub fn four_bit_floor_symmetric(e: &[f32], k: usize, b: usize) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for row in e.chunks(k) {
        for blk in row.chunks(b) {
            let max = blk
                .iter()
                .copied()
                .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m })
                as f64;
            let d = max / -8.0;
            for &v in blk {
                let v = v as f64;
                let q = if d != 0.0 {
                    (v / d).round().clamp(-8.0, 7.0)
                } else {
                    0.0
                };
                num += (q * d - v).abs();
                den += v.abs();
            }
        }
    }
    num / den.max(f64::MIN_POSITIVE)
}

/// The tied-head fit rule (seed #2194): `x` the decoded head, `e` the embedding at the head's
/// scale. All four must hold: corr > 0.99; fit `a` within 5 % of 1; rms ratio within 5 % of 1;
/// rel L1 ≤ max(0.02, 1.5 × floor₃₂(e)). The seed calibrated the floor on asymmetric heads; for a
/// head with signed codes (`codes` = [`Codes::Signed4`]) the floor is the larger of that floor and
/// the symmetric one ([`four_bit_floor_symmetric`]): a correct symmetric requantization of an
/// embedding that lies on an asymmetric grid costs the symmetric floor, not the asymmetric one
/// (measured: a Q4_1 Hunyuan embedding requantized into Q40_4608 reads rel 0.0852 against the
/// floors 0.0020 (min/max) and 0.0851 (symmetric)).
pub fn tie_fit(x: &[f32], e: &[f32], k: usize, codes: Option<Codes>, row: &mut VerifyRow) {
    let mut p = PairStats::default();
    p.extend(x, e);
    p.fill(row);
    let mut floor = four_bit_floor(e, k, 32);
    row.floor = Some(floor);
    let mut floor_note = String::new();
    if codes == Some(Codes::Signed4) {
        let sym = four_bit_floor_symmetric(e, k, 32);
        floor_note = format!(", symmetric floor {sym:.6}");
        floor = floor.max(sym);
    }
    let corr = p.corr();
    let a = row.scale.unwrap_or(0.0);
    let rms = row.rms_ratio.unwrap_or(0.0);
    let rel = row.rel_l1.unwrap_or(f64::INFINITY);
    let bound = (1.5 * floor).max(0.02);
    let mut failed = Vec::new();
    if corr <= 0.99 {
        failed.push(format!("corr {corr:.6} ≤ 0.99"));
    }
    if (a - 1.0).abs() > 0.05 {
        failed.push(format!("fit scale {a:.6} off 1 by more than 5 %"));
    }
    if (rms - 1.0).abs() > 0.05 {
        failed.push(format!("rms ratio {rms:.6} off 1 by more than 5 %"));
    }
    if rel > bound {
        failed.push(format!(
            "rel L1 {rel:.6} > max(0.02, 1.5 × floor {floor:.6}) = {bound:.6}"
        ));
    }
    let numbers = format!(
        "corr {corr:.6}, a {a:.6}, rms ratio {rms:.6}, rel {rel:.6}, floor {:.6}{floor_note}",
        row.floor.unwrap_or(floor)
    );
    if failed.is_empty() {
        row.verdict = Verdict::Pass;
        row.reason = format!("head fit: {numbers}");
    } else {
        row.verdict = Verdict::Fail;
        row.reason = format!("tied-head fit fails ({}): {numbers}", failed.join("; "));
    }
}
