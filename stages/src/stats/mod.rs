//! Streaming statistics of decoded values, mergeable across row blocks decoded in parallel, the
//! correlation every comparison uses ([`pearson`]), and per-tensor statistics ([`tensor`]).

pub mod tensor;

use serde::Serialize;

/// Running moments and counts of a stream of f32 values.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Moments {
    /// Finite values seen.
    pub count: u64,
    /// Sum (f64).
    pub sum: f64,
    /// Sum of squares (f64).
    pub sum_sq: f64,
    /// Minimum finite value.
    pub min: f32,
    /// Maximum finite value.
    pub max: f32,
    /// Exact zeros.
    pub zeros: u64,
    /// NaNs.
    pub nan: u64,
    /// ±Inf.
    pub inf: u64,
}

impl Default for Moments {
    fn default() -> Self {
        Moments {
            count: 0,
            sum: 0.0,
            sum_sq: 0.0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            zeros: 0,
            nan: 0,
            inf: 0,
        }
    }
}

impl Moments {
    /// Adds every value of `xs`.
    pub fn extend(&mut self, xs: &[f32]) {
        let (mut sum, mut sq) = (0f64, 0f64);
        for &x in xs {
            if x.is_nan() {
                self.nan += 1;
                continue;
            }
            if x.is_infinite() {
                self.inf += 1;
                continue;
            }
            self.count += 1;
            sum += x as f64;
            sq += (x as f64) * (x as f64);
            self.min = self.min.min(x);
            self.max = self.max.max(x);
            if x == 0.0 {
                self.zeros += 1;
            }
        }
        self.sum += sum;
        self.sum_sq += sq;
    }

    /// Adds one value.
    pub fn push(&mut self, x: f32) {
        self.extend(std::slice::from_ref(&x));
    }

    /// Merges another stream's moments.
    pub fn merge(&mut self, o: &Moments) {
        self.count += o.count;
        self.sum += o.sum;
        self.sum_sq += o.sum_sq;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.zeros += o.zeros;
        self.nan += o.nan;
        self.inf += o.inf;
    }

    /// Mean of the finite values (NaN when none).
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }

    /// Population standard deviation.
    pub fn std(&self) -> f64 {
        let m = self.mean();
        (self.sum_sq / self.count as f64 - m * m).max(0.0).sqrt()
    }

    /// Root mean square.
    pub fn rms(&self) -> f64 {
        (self.sum_sq / self.count as f64).sqrt()
    }

    /// Largest magnitude.
    pub fn absmax(&self) -> f32 {
        self.min.abs().max(self.max.abs())
    }

    /// Fraction of exact zeros among finite values.
    pub fn zero_fraction(&self) -> f64 {
        self.zeros as f64 / self.count as f64
    }

    /// `Some(v)` when any value was seen, for nullable columns.
    pub fn some<T>(&self, v: T) -> Option<T> {
        (self.count > 0).then_some(v)
    }
}

/// Pearson correlation of two equally long sequences (f64 accumulation); 0 when either is flat.
pub fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    if n == 0 {
        return 0.0;
    }
    let (mut sa, mut sb) = (0f64, 0f64);
    for i in 0..n {
        sa += a[i] as f64;
        sb += b[i] as f64;
    }
    let (ma, mb) = (sa / n as f64, sb / n as f64);
    let (mut cov, mut va, mut vb) = (0f64, 0f64, 0f64);
    for i in 0..n {
        let (x, y) = (a[i] as f64 - ma, b[i] as f64 - mb);
        cov += x * y;
        va += x * x;
        vb += y * y;
    }
    if va == 0.0 || vb == 0.0 {
        0.0
    } else {
        cov / (va * vb).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_match_direct_computation_and_merge() {
        let xs = [1.0f32, -2.0, 0.0, 4.0, f32::NAN, f32::INFINITY];
        let mut a = Moments::default();
        a.extend(&xs[..3]);
        let mut b = Moments::default();
        b.extend(&xs[3..]);
        a.merge(&b);
        assert_eq!(a.count, 4);
        assert_eq!((a.nan, a.inf, a.zeros), (1, 1, 1));
        assert_eq!((a.min, a.max, a.absmax()), (-2.0, 4.0, 4.0));
        assert!((a.mean() - 0.75).abs() < 1e-12);
        assert!((a.rms() - (21.0f64 / 4.0).sqrt()).abs() < 1e-12);
        assert!((a.std() - (21.0f64 / 4.0 - 0.5625).sqrt()).abs() < 1e-12);
        assert_eq!(a.zero_fraction(), 0.25);
    }
}
