//! Choosing the next token: greedy, or temperature sampling truncated by top-k, top-p, min-p and
//! typical-p, after a logit bias and the repetition, presence and frequency penalties.
//!
//! Each step follows the definition its name comes from, in transformers' order (temperature,
//! top-k, top-p, min-p, typical-p; each truncation renormalizes what the previous one kept), and
//! the penalties follow OpenAI's (`presence_penalty`, `frequency_penalty`, `logit_bias`) and
//! llama.cpp's (`repeat_last_n`) documentation; `sample_tests.rs` checks each against a plain
//! f64 implementation of that definition.
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
    /// Keep the tokens at least `min_p` times as likely as the most likely one (0 = all).
    pub min_p: f32,
    /// Locally typical sampling: keep the smallest set with cumulative probability ≥ p of the
    /// tokens whose surprise `−ln p` is closest to the distribution's entropy (1 = all).
    pub typical_p: f32,
    /// Divides positive logits (multiplies negative ones) of tokens in the penalty window, the
    /// prompt included (1 = off).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token the answer has generated (OpenAI's
    /// `presence_penalty`, −2 … 2; 0 = off).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the answer has generated it (OpenAI's
    /// `frequency_penalty`, −2 … 2; 0 = off).
    pub frequency_penalty: f32,
    /// The penalties look at the last this-many tokens (llama.cpp's `repeat_last_n`; `usize::MAX`:
    /// all of them, 0: no penalty).
    pub repeat_last_n: usize,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`: −100
    /// bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed.
    pub seed: u64,
}

impl SamplerConfig {
    /// How many of each row's best logits this sampler reads: 1 when greedy, `top_k` when it
    /// keeps the top k; 0 (all) otherwise and whenever a penalty or bias may move the best
    /// tokens below others.
    pub fn reads_top(&self) -> usize {
        if self.moves_logits() {
            0
        } else if self.temperature <= 0.0 {
            1
        } else {
            self.top_k
        }
    }

    /// Whether a bias or a penalty changes logits before the choice.
    fn moves_logits(&self) -> bool {
        !self.logit_bias.is_empty()
            || (self.repeat_last_n > 0
                && (self.repetition_penalty != 1.0
                    || self.presence_penalty != 0.0
                    || self.frequency_penalty != 0.0))
    }

    /// Refuses what no sampler can honour, naming the parameter: a temperature that is negative or
    /// not finite, a top-p or typical-p outside (0, 1], a min-p outside [0, 1], a repetition
    /// penalty that is not a finite positive number (as f32: `1e-300` underflows to 0 and would
    /// divide logits to infinity), a presence or frequency penalty or a bias that is not finite.
    pub fn check(&self) -> crate::Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(crate::Error::Request { field, reason });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                format!("{} is not a finite number of at least 0", self.temperature),
            );
        }
        for (field, p) in [("top_p", self.top_p), ("typical_p", self.typical_p)] {
            if !(p > 0.0 && p <= 1.0) {
                return bad(field, format!("{p} is not in (0, 1]"));
            }
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} is not in [0, 1]", self.min_p));
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
        for (field, x) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !x.is_finite() {
                return bad(field, format!("{x} is not a finite number"));
            }
        }
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return bad(
                "logit_bias",
                format!("token {t}: {b} is not a finite number"),
            );
        }
        Ok(())
    }

    /// Whether anything truncates the distribution.
    fn truncates(&self) -> bool {
        self.top_k > 0 || self.top_p < 1.0 || self.min_p > 0.0 || self.typical_p < 1.0
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: usize::MAX,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// A sampler with its RNG state.
pub struct Sampler {
    cfg: SamplerConfig,
    state: u64,
}

/// Candidates for a draw: a token and its unnormalized weight.
type Weighted = Vec<(u32, f32)>;

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

    /// Picks the next token from `logits`, given the tokens seen so far: `seen[..prompt]` is the
    /// prompt, the rest the answer's own tokens.
    pub fn pick(&mut self, logits: &mut [f32], seen: &[u32], prompt: usize) -> u32 {
        self.adjust(logits, seen, prompt);
        if self.cfg.temperature <= 0.0 {
            return argmax(logits);
        }
        if !self.cfg.truncates() {
            // The whole distribution: one pass, no ordering needed.
            let (t, max) = (self.cfg.temperature, max_of(logits));
            let weight = |l: f32| ((l - max) / t).exp();
            let total: f32 = logits.iter().map(|&l| weight(l)).sum();
            return draw(
                self.next_f32() * total,
                logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, weight(l))),
            )
            .unwrap_or_else(|| argmax(logits));
        }
        let kept = self.candidates(logits);
        let total: f32 = kept.iter().map(|c| c.1).sum();
        let r = self.next_f32() * total;
        draw(r, kept.iter().copied()).unwrap_or_else(|| kept.last().map_or(0, |c| c.0))
    }

    /// Applies the logit bias, then the penalties over the last `repeat_last_n` tokens: the
    /// repetition penalty to every token there, the presence and frequency penalties to those
    /// the answer generated (OpenAI: `μ[j] − c[j]·α_frequency − [c[j] > 0]·α_presence`, `c[j]`
    /// how often `j` was sampled before).
    fn adjust(&self, logits: &mut [f32], seen: &[u32], prompt: usize) {
        for &(t, b) in &self.cfg.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        let c = &self.cfg;
        let penalties =
            c.repetition_penalty != 1.0 || c.presence_penalty != 0.0 || c.frequency_penalty != 0.0;
        if !penalties || c.repeat_last_n == 0 {
            return;
        }
        let from = seen.len().saturating_sub(c.repeat_last_n);
        // (token, how often the answer generated it), one entry per distinct token of the window.
        let mut counts: Vec<(u32, u32)> = Vec::new();
        let mut window: Vec<(u32, bool)> = seen[from..]
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, from + i >= prompt))
            .collect();
        window.sort_unstable();
        for (t, generated) in window {
            match counts.last_mut() {
                Some((last, n)) if *last == t => *n += u32::from(generated),
                _ => counts.push((t, u32::from(generated))),
            }
        }
        for (t, n) in counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if c.repetition_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / c.repetition_penalty
                } else {
                    *l * c.repetition_penalty
                };
            }
            if n > 0 {
                *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
            }
        }
    }

    /// The tokens the truncations keep, best first, with their weights `exp((l − max)/T)`.
    fn candidates(&self, logits: &[f32]) -> Weighted {
        let c = &self.cfg;
        let (t, max) = (c.temperature, max_of(logits));
        let weight = |l: f32| ((l - max) / t).exp();
        let n = logits.len();
        // Best first; ties by token id, so a choice never depends on the order of a sort.
        let by_weight = |a: &(u32, f32), b: &(u32, f32)| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.0.cmp(&b.0))
        };
        let all = || -> Weighted {
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, weight(l)))
                .collect()
        };
        let mut kept: Option<Weighted> = None;
        if c.top_k > 0 {
            let mut v = all();
            if c.top_k < n {
                v.select_nth_unstable_by(c.top_k - 1, by_weight);
                v.truncate(c.top_k);
            }
            v.sort_unstable_by(by_weight);
            kept = Some(v);
        }
        if c.top_p < 1.0 {
            let v = kept.take().unwrap_or_else(all);
            let z: f32 = v.iter().map(|x| x.1).sum();
            kept = Some(smallest_reaching(v, c.top_p * z, by_weight));
        }
        if c.min_p > 0.0 {
            // Relative to the most likely token kept (weight 1 unless the bias or a grammar
            // removed every token but some).
            let v = kept.take().unwrap_or_else(all);
            let best = v.iter().fold(0.0f32, |a, x| a.max(x.1));
            let floor = c.min_p * best;
            kept = Some(v.into_iter().filter(|x| x.1 >= floor).collect());
        }
        if c.typical_p < 1.0 {
            let v = kept.take().unwrap_or_else(all);
            let z: f64 = v.iter().map(|x| f64::from(x.1)).sum();
            // Entropy of the renormalized distribution, and each token's distance from it.
            let entropy: f64 = v
                .iter()
                .filter(|x| x.1 > 0.0)
                .map(|x| {
                    let p = f64::from(x.1) / z;
                    -p * p.ln()
                })
                .sum();
            let distance = |x: &(u32, f32)| {
                if x.1 > 0.0 {
                    (-(f64::from(x.1) / z).ln() - entropy).abs()
                } else {
                    f64::INFINITY
                }
            };
            let by_distance = |a: &(u32, f32), b: &(u32, f32)| {
                distance(a)
                    .partial_cmp(&distance(b))
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.0.cmp(&b.0))
            };
            kept = Some(smallest_reaching(v, c.typical_p * z as f32, by_distance));
        }
        let mut v = kept.unwrap_or_else(all);
        v.retain(|x| x.1 > 0.0);
        if v.is_empty() {
            // Every weight underflowed or was banned: the best logit, as greedy would.
            v.push((argmax(logits), 1.0));
        }
        v
    }
}

/// The shortest prefix of `v` ordered by `order` whose weights sum to at least `mass` (all of
/// `v` when none does). The order is selected in widening steps (256, ×8 …): a vocabulary has
/// 10⁵ entries and the kept set is usually tens.
fn smallest_reaching(
    mut v: Weighted,
    mass: f32,
    order: impl Fn(&(u32, f32), &(u32, f32)) -> std::cmp::Ordering,
) -> Weighted {
    let n = v.len();
    let mut k = 256.min(n);
    loop {
        if k < n {
            v.select_nth_unstable_by(k - 1, &order);
        }
        let mut head = v[..k].to_vec();
        head.sort_unstable_by(&order);
        let mut acc = 0.0f32;
        if let Some(at) = head.iter().position(|x| {
            acc += x.1;
            acc >= mass
        }) {
            head.truncate(at + 1);
            return head;
        }
        if k == n {
            return head;
        }
        k = (k * 8).min(n);
    }
}

/// The largest finite-or-infinite value (−∞ for an empty or all-NaN row).
fn max_of(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
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
#[path = "sample_tests.rs"]
mod tests;
