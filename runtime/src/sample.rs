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
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        idx.sort_unstable_by(|&a, &b| {
            logits[b as usize]
                .partial_cmp(&logits[a as usize])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b))
        });
        if self.cfg.top_k > 0 {
            idx.truncate(self.cfg.top_k);
        }
        let max = logits[idx[0] as usize];
        let mut p: Vec<f32> = idx
            .iter()
            .map(|&i| ((logits[i as usize] - max) / self.cfg.temperature).exp())
            .collect();
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= sum);
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = p.len();
            for (i, &v) in p.iter().enumerate() {
                acc += v;
                if acc >= self.cfg.top_p {
                    keep = i + 1;
                    break;
                }
            }
            p.truncate(keep);
            idx.truncate(keep);
            let s: f32 = p.iter().sum();
            p.iter_mut().for_each(|v| *v /= s);
        }
        let r = self.next_f32();
        let mut acc = 0.0;
        for (i, &v) in p.iter().enumerate() {
            acc += v;
            if r < acc {
                return idx[i];
            }
        }
        idx[p.len() - 1]
    }
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
