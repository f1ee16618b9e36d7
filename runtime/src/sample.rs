//! Choosing the next token: greedy, or temperature / top-k / top-p sampling with a seeded RNG,
//! and a repetition penalty.
//!
//! The RNG is SplitMix64, written here: it is a dozen lines, fully deterministic across platforms
//! for a given seed, and saves a dependency.

/// Sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set with cumulative probability ≥ p (1 = all).
    pub top_p: f32,
    /// Divides positive logits (multiplies negative ones) of tokens already seen (1 = off).
    pub repetition_penalty: f32,
    /// RNG seed.
    pub seed: u64,
}

impl SamplerConfig {
    /// How many of each row's best logits this sampler reads: 1 when greedy, `top_k` when it
    /// keeps the top k; 0 (all) otherwise and whenever a repetition penalty may push the best
    /// tokens down below others.
    pub fn reads_top(&self) -> usize {
        if self.repetition_penalty != 1.0 {
            0
        } else if self.temperature <= 0.0 {
            1
        } else {
            self.top_k
        }
    }
}

impl SamplerConfig {
    /// Refuses what no sampler can honour, naming the parameter: a temperature that is negative or
    /// not finite, a top-p outside (0, 1], a repetition penalty that is not a finite positive
    /// number (as f32: `1e-300` underflows to 0 and would divide logits to infinity).
    pub fn check(&self) -> crate::Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(crate::Error::Request { field, reason });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                format!("{} is not a finite number of at least 0", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is not in (0, 1]", self.top_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                format!(
                    "{} is not a finite positive number (as a 32-bit float)",
                    self.repetition_penalty
                ),
            );
        }
        Ok(())
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

/// A sampler with its RNG state.
pub struct Sampler {
    cfg: SamplerConfig,
    state: u64,
}

impl Sampler {
    /// A sampler seeded from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let state = cfg.seed ^ 0x9E37_79B9_7F4A_7C15;
        Sampler { cfg, state }
    }

    fn next_f32(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Picks the next token from `logits`, given the tokens seen so far.
    pub fn pick(&mut self, logits: &mut [f32], seen: &[u32]) -> u32 {
        let rp = self.cfg.repetition_penalty;
        if rp != 1.0 {
            let mut uniq: Vec<u32> = seen.to_vec();
            uniq.sort_unstable();
            uniq.dedup();
            for &t in &uniq {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / rp } else { *l * rp };
                }
            }
        }
        if self.cfg.temperature <= 0.0 {
            return argmax(logits);
        }
        let t = self.cfg.temperature;
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let weight = |l: f32| ((l - max) / t).exp();
        let n = logits.len();
        if self.cfg.top_k == 0 && self.cfg.top_p >= 1.0 {
            // The whole distribution: one pass, no ordering needed.
            let total: f32 = logits.iter().map(|&l| weight(l)).sum();
            return draw(
                self.next_f32() * total,
                (0..n as u32).map(|i| (i, weight(logits[i as usize]))),
            )
            .unwrap_or_else(|| argmax(logits));
        }
        // Top-k and the nucleus need the best tokens in order: select them with a partial sort
        // (the vocabulary is 10⁵ entries; the kept set is usually tens).
        let best_first = |a: &u32, b: &u32| {
            logits[*b as usize]
                .partial_cmp(&logits[*a as usize])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(b))
        };
        let top = |k: usize| -> Vec<u32> {
            let mut idx: Vec<u32> = (0..n as u32).collect();
            if k < n {
                idx.select_nth_unstable_by(k - 1, best_first);
                idx.truncate(k);
            }
            idx.sort_unstable_by(best_first);
            idx
        };
        let limit = if self.cfg.top_k > 0 {
            self.cfg.top_k.min(n)
        } else {
            n
        };
        let mut idx = if self.cfg.top_k > 0 || self.cfg.top_p >= 1.0 {
            top(limit)
        } else {
            top(256.min(n))
        };
        if self.cfg.top_p < 1.0 {
            let z: f32 = if self.cfg.top_k > 0 {
                idx.iter().map(|&i| weight(logits[i as usize])).sum()
            } else {
                logits.iter().map(|&l| weight(l)).sum()
            };
            loop {
                let mut acc = 0.0;
                let cut = idx.iter().position(|&i| {
                    acc += weight(logits[i as usize]) / z;
                    acc >= self.cfg.top_p
                });
                match cut {
                    Some(c) => {
                        idx.truncate(c + 1);
                        break;
                    }
                    None if idx.len() >= limit => break,
                    None => idx = top((idx.len() * 8).min(limit)),
                }
            }
        }
        let total: f32 = idx.iter().map(|&i| weight(logits[i as usize])).sum();
        let r = self.next_f32() * total;
        draw(r, idx.iter().map(|&i| (i, weight(logits[i as usize])))).unwrap_or(idx[idx.len() - 1])
    }
}

/// The first candidate at which the running weight passes `r`.
fn draw(r: f32, weights: impl Iterator<Item = (u32, f32)>) -> Option<u32> {
    let mut acc = 0.0;
    let mut last = None;
    for (i, w) in weights {
        acc += w;
        if w > 0.0 {
            last = Some(i);
        }
        if r < acc {
            return Some(i);
        }
    }
    last
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_no_sampler_can_honour_are_refused_by_name() {
        let base = SamplerConfig::default();
        assert!(base.check().is_ok());
        let field = |c: SamplerConfig| match c.check() {
            Err(crate::Error::Request { field, .. }) => field,
            other => panic!("not refused: {other:?}"),
        };
        for t in [f32::NAN, f32::INFINITY, -0.5] {
            assert_eq!(
                field(SamplerConfig {
                    temperature: t,
                    ..base.clone()
                }),
                "temperature"
            );
        }
        for p in [0.0, f32::NAN, 1.5, -1.0] {
            assert_eq!(
                field(SamplerConfig {
                    top_p: p,
                    ..base.clone()
                }),
                "top_p"
            );
        }
        for r in [0.0, f32::NAN, f32::INFINITY, -1.0, 1e-300f64 as f32] {
            assert_eq!(
                field(SamplerConfig {
                    repetition_penalty: r,
                    ..base.clone()
                }),
                "repetition_penalty"
            );
        }
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.pick(&mut [0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            repetition_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.pick(&mut [0.0, 3.0, 2.0], &[1]), 2);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_repeat() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg);
        assert_eq!(s.pick(&mut [0.5, 0.4, 2.0], &[]), 2);
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                seed,
                ..Default::default()
            });
            (0..20)
                .map(|_| s.pick(&mut [1.0, 1.0, 1.0, 1.0], &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }

    #[test]
    fn sampling_follows_the_distribution_with_or_without_truncation() {
        // p ∝ [e², e¹, e⁰, e⁰]; counts over 4000 draws within a few percent of the truth.
        let logits = [2.0f32, 1.0, 0.0, 0.0];
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        for (top_k, top_p) in [(0, 1.0), (4, 1.0), (0, 0.999)] {
            let mut s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                top_k,
                top_p,
                seed: 11,
                ..Default::default()
            });
            let mut counts = [0usize; 4];
            for _ in 0..4000 {
                counts[s.pick(&mut logits.clone(), &[]) as usize] += 1;
            }
            for (c, l) in counts.iter().zip(logits) {
                let want = l.exp() / z;
                let got = *c as f32 / 4000.0;
                assert!((got - want).abs() < 0.03, "k={top_k} p={top_p}: {counts:?}");
            }
        }
        // A nucleus beyond the first selection (300 equal tokens, p = 0.9) widens until it holds.
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_p: 0.9,
            seed: 2,
            ..Default::default()
        });
        let flat = vec![0.0f32; 300];
        let picks: std::collections::BTreeSet<u32> =
            (0..3000).map(|_| s.pick(&mut flat.clone(), &[])).collect();
        assert!(
            picks.len() > 256 && picks.iter().all(|&i| i < 272),
            "{}",
            picks.len()
        );
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_p: 0.5,
            seed: 3,
            ..Default::default()
        });
        // p ≈ [0.88, 0.12, …]: the nucleus at 0.5 is the first token alone.
        for _ in 0..20 {
            assert_eq!(s.pick(&mut [4.0, 2.0, 0.0, 0.0], &[]), 0);
        }
    }
}
