//! Token log-probabilities as OpenAI reports them (`logprobs`, `top_logprobs`): log-softmax over
//! the whole vocabulary of the model's logits divided by the request's temperature (1 when it is
//! greedy), before any bias, penalty, truncation or grammar mask. Computed in f64 from the row as
//! the model wrote it, only for requests that ask.

/// One generated token's log-probability and the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token chosen.
    pub id: u32,
    /// The bytes it stands for (part of a character for a byte token).
    pub piece: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The `k` most likely tokens at this position, most likely first: id, bytes, log-probability.
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

/// The log-softmax of `row / temperature` at `chosen`, and the `k` best entries (id,
/// log-probability), best first. Entries that are not finite numbers have probability 0.
pub fn log_softmax_at(
    row: &[f32],
    temperature: f32,
    chosen: u32,
    k: usize,
) -> (f32, Vec<(u32, f32)>) {
    let scale = if temperature > 0.0 {
        1.0 / f64::from(temperature)
    } else {
        1.0
    };
    let finite = |x: f32| x.is_finite().then(|| f64::from(x) * scale);
    let max = row
        .iter()
        .filter_map(|&x| finite(x))
        .fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return (f32::NEG_INFINITY, Vec::new());
    }
    let lse = max
        + row
            .iter()
            .filter_map(|&x| finite(x))
            .map(|x| (x - max).exp())
            .sum::<f64>()
            .ln();
    let at = |i: usize| {
        row.get(i)
            .and_then(|&x| finite(x))
            .map_or(f32::NEG_INFINITY, |x| (x - lse) as f32)
    };
    let mut best: Vec<u32> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| row[i as usize].is_finite())
            .collect();
        let key = |i: &u32| std::cmp::Reverse(ordered(row[*i as usize]));
        if idx.len() > k {
            idx.select_nth_unstable_by_key(k - 1, key);
            idx.truncate(k);
        }
        idx.sort_by_key(|i| (key(i), *i));
        best = idx;
    }
    (
        at(chosen as usize),
        best.into_iter().map(|i| (i, at(i as usize))).collect(),
    )
}

/// A total order on finite floats (larger is greater).
fn ordered(x: f32) -> i32 {
    let b = x.to_bits() as i32;
    if b < 0 { !(b & i32::MAX) } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_an_f64_log_softmax_with_temperature_and_ranks_the_top() {
        let row = [2.0f32, -1.0, f32::NEG_INFINITY, 0.5, 2.0, -3.25];
        for t in [0.0f32, 0.7, 1.0, 1.9] {
            let s = if t > 0.0 { 1.0 / f64::from(t) } else { 1.0 };
            let z: f64 = row
                .iter()
                .filter(|x| x.is_finite())
                .map(|&x| (f64::from(x) * s).exp())
                .sum();
            let want = |i: usize| (f64::from(row[i]) * s - z.ln()) as f32;
            let (lp, top) = log_softmax_at(&row, t, 3, 3);
            assert!((lp - want(3)).abs() < 1e-6, "t {t}: {lp} vs {}", want(3));
            // Ties keep the lower id first; −∞ is never ranked.
            let ids: Vec<u32> = top.iter().map(|e| e.0).collect();
            assert_eq!(ids, [0, 4, 3], "t {t}");
            for (i, l) in top {
                assert!((l - want(i as usize)).abs() < 1e-6);
            }
            let total: f64 = (0..row.len())
                .filter(|&i| row[i].is_finite())
                .map(|i| f64::from(want(i)).exp())
                .sum();
            assert!((total - 1.0).abs() < 1e-6, "sums to {total}");
        }
        let (lp, top) = log_softmax_at(&row, 1.0, 2, 10);
        assert_eq!(lp, f32::NEG_INFINITY, "a masked token has probability 0");
        assert_eq!(top.len(), 5, "only finite entries are ranked");
        assert!(ordered(-1.0) < ordered(-0.5) && ordered(-0.5) < ordered(0.0));
        assert!(ordered(0.0) < ordered(1e-30) && ordered(1.0) < ordered(2.0));
    }
}
