//! Input statistics of every matrix product over calibration text, for calibrated quantization
//! (`convert --calibrate`): Σx² per input column, and second moments Σx xᵀ for GPTQ. While
//! collecting, the forward pass records each product's input and skips the head.

use std::sync::Arc;

use rayon::prelude::*;

use super::Model;
use onebit_kernels::ops;

/// Input statistics of one matrix product, collected over calibration text.
#[derive(Clone, Debug, Default)]
pub struct InputStats {
    /// Σ x² per input column: calibrated quantization weighs each column's error by its mean
    /// (as llama.cpp's importance matrix does).
    pub sum_sq: Vec<f64>,
    /// Rows (tokens) seen.
    pub rows: u64,
    /// Σ x xᵀ (`k × k`, row-major, symmetric) when second moments were asked for (GPTQ); one
    /// allocation shared by the matrices that read the same input (q/k/v, gate/up).
    pub gram: Option<Arc<Vec<f64>>>,
}

/// Input statistics per matrix (pack tensor name).
pub type ActStats = std::collections::BTreeMap<String, InputStats>;

/// What is being collected.
#[derive(Default)]
pub(super) struct Collecting {
    per: ActStats,
    /// Second moments wanted.
    gram: bool,
    /// Σ x xᵀ (upper triangle) by the first name of each input group, and that group.
    grams: std::collections::BTreeMap<String, (Vec<f64>, Vec<String>)>,
}

/// `g[i][j] += Σ_t x[t][i]·x[t][j]` for `j ≥ i` (`x` is `n × k`): eight rows of `g` at a time
/// against every column, so each transposed input row is read `k/8` times, not `k`.
fn add_gram(g: &mut [f64], x: &[f32], n: usize, k: usize) {
    let mut xt = vec![0f32; k * n];
    for t in 0..n {
        for i in 0..k {
            xt[i * n + t] = x[t * k + i];
        }
    }
    g.par_chunks_mut(8 * k).enumerate().for_each(|(b, rows)| {
        let i0 = b * 8;
        let n_i = rows.len() / k;
        for j in i0..k {
            let xj = &xt[j * n..(j + 1) * n];
            for di in 0..n_i.min(j + 1 - i0) {
                let i = i0 + di;
                rows[di * k + j] += ops::dot(&xt[i * n..(i + 1) * n], xj) as f64;
            }
        }
    });
}

impl Model {
    /// Starts collecting input statistics of every matrix product (see [`InputStats`]), with
    /// second moments when `gram`. While collecting, [`Model::forward`] records the head's
    /// inputs and returns no logits.
    pub fn collect_stats(&self, gram: bool) {
        if let Ok(mut s) = self.stats.lock() {
            *s = Some(Collecting {
                gram,
                ..Collecting::default()
            });
        }
    }

    /// The statistics collected since [`Model::collect_stats`], ending the collection.
    pub fn take_stats(&self) -> ActStats {
        let Some(c) = self.stats.lock().ok().and_then(|mut s| s.take()) else {
            return ActStats::new();
        };
        let mut per = c.per;
        for (_, (mut g, names)) in c.grams {
            let k = (g.len() as f64).sqrt() as usize;
            for i in 0..k {
                for j in 0..i {
                    g[i * k + j] = g[j * k + i];
                }
            }
            let g = Arc::new(g);
            for name in names {
                if let Some(e) = per.get_mut(&name) {
                    e.gram = Some(g.clone());
                }
            }
        }
        per
    }

    pub(super) fn record(&self, names: &[String], x: &[f32], n: usize) {
        let Ok(mut guard) = self.stats.lock() else {
            return;
        };
        let Some(c) = guard.as_mut() else {
            return;
        };
        let k = x.len() / n.max(1);
        for name in names {
            let e = c.per.entry(name.clone()).or_insert_with(|| InputStats {
                sum_sq: vec![0f64; k],
                ..InputStats::default()
            });
            for row in x.chunks_exact(k) {
                for (s, &v) in e.sum_sq.iter_mut().zip(row) {
                    *s += (v as f64) * (v as f64);
                }
            }
            e.rows += n as u64;
        }
        if c.gram
            && let Some(first) = names.first()
        {
            let (g, _) = c
                .grams
                .entry(first.clone())
                .or_insert_with(|| (vec![0f64; k * k], names.to_vec()));
            add_gram(g, x, n, k);
        }
    }

    pub(super) fn recording(&self) -> bool {
        self.stats.lock().map(|s| s.is_some()).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::add_gram;

    #[test]
    fn the_blocked_gram_is_the_plain_sum_of_outer_products() {
        let (n, k) = (37, 21);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 113) as f32 - 56.0) / 31.0)
            .collect();
        let mut g = vec![0f64; k * k];
        add_gram(&mut g, &x, n, k);
        add_gram(&mut g, &x[..5 * k], 5, k);
        for i in 0..k {
            for j in 0..k {
                let want: f64 = (0..n)
                    .chain(0..5)
                    .map(|t| x[t * k + i] as f64 * x[t * k + j] as f64)
                    .sum();
                if j >= i {
                    assert!(
                        (g[i * k + j] - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "[{i}][{j}]"
                    );
                } else {
                    assert_eq!(g[i * k + j], 0.0, "lower triangle is filled at take");
                }
            }
        }
    }
}
