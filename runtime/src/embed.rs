//! Text embeddings from a causal model, as llama-server's `/v1/embeddings` makes them: the final
//! hidden states (after the last norm, what the head reads) of a text's tokens pooled into one
//! vector and L2-normalized, so a dot product of two is their cosine similarity.

use std::fmt;
use std::str::FromStr;

/// How a text's token states become one vector (`--pooling`, llama.cpp's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token.
    #[default]
    Mean,
    /// The last token's state: in a causal model, the only one that has read the whole text.
    Last,
    /// The first token's state (a BERT-style `[CLS]`; with a BOS, the same for every text
    /// unless the model was trained for it).
    Cls,
}

impl Pooling {
    /// Every pooling, in the order `--help` lists them.
    pub const ALL: [Pooling; 3] = [Pooling::Mean, Pooling::Last, Pooling::Cls];

    /// llama.cpp's name.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Last => "last",
            Pooling::Cls => "cls",
        }
    }
}

impl fmt::Display for Pooling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> Result<Pooling, String> {
        Pooling::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown pooling `{s}` (mean, last, cls)"))
    }
}

/// One text's states pooled as they arrive, chunk by chunk (a long prompt is read in several
/// forward passes).
#[derive(Clone, Debug)]
pub struct Pooler {
    pooling: Pooling,
    width: usize,
    /// The sum of every state (mean), in f64 so a long text loses nothing; or the kept state.
    acc: Vec<f64>,
    count: usize,
}

impl Pooler {
    /// A pooler of `width`-wide states.
    pub fn new(pooling: Pooling, width: usize) -> Pooler {
        Pooler {
            pooling,
            width,
            acc: vec![0.0; width],
            count: 0,
        }
    }

    /// Adds the next tokens' states, `[tokens][width]` in position order.
    pub fn push(&mut self, states: &[f32]) {
        for row in states.chunks_exact(self.width) {
            match self.pooling {
                Pooling::Mean => {
                    for (a, &v) in self.acc.iter_mut().zip(row) {
                        *a += f64::from(v);
                    }
                }
                Pooling::Last => {
                    for (a, &v) in self.acc.iter_mut().zip(row) {
                        *a = f64::from(v);
                    }
                }
                Pooling::Cls if self.count == 0 => {
                    for (a, &v) in self.acc.iter_mut().zip(row) {
                        *a = f64::from(v);
                    }
                }
                Pooling::Cls => {}
            }
            self.count += 1;
        }
    }

    /// The pooled vector, L2-normalized (all zeros stay zeros).
    pub fn finish(&self) -> Vec<f32> {
        let n = match self.pooling {
            Pooling::Mean => self.count.max(1) as f64,
            _ => 1.0,
        };
        let norm = self
            .acc
            .iter()
            .map(|a| (a / n) * (a / n))
            .sum::<f64>()
            .sqrt();
        let scale = if norm > 0.0 { 1.0 / (n * norm) } else { 0.0 };
        self.acc.iter().map(|a| (a * scale) as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poolings_take_the_mean_the_last_or_the_first_state_normalized() {
        let states = [3.0f32, 0.0, 0.0, 4.0, 1.0, 1.0];
        let pooled = |p: Pooling, chunks: &[&[f32]]| {
            let mut pl = Pooler::new(p, 2);
            for c in chunks {
                pl.push(c);
            }
            pl.finish()
        };
        let whole: &[&[f32]] = &[&states];
        let pieces: &[&[f32]] = &[&states[..2], &states[2..]];
        for chunks in [whole, pieces] {
            // mean (4/3, 5/3) normalized is (0.6247, 0.7809).
            let m = pooled(Pooling::Mean, chunks);
            assert!((m[0] - 0.624_695).abs() < 1e-5 && (m[1] - 0.780_869).abs() < 1e-5);
            let l = pooled(Pooling::Last, chunks);
            assert!(
                (l[0] - l[1]).abs() < 1e-7 && (l[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6
            );
            assert_eq!(pooled(Pooling::Cls, chunks), [1.0, 0.0]);
        }
        assert_eq!(Pooler::new(Pooling::Mean, 2).finish(), [0.0, 0.0]);
        assert_eq!("last".parse::<Pooling>(), Ok(Pooling::Last));
        assert!("max".parse::<Pooling>().is_err_and(|e| e.contains("`max`")));
    }
}
