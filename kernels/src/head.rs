//! Exact re-scoring of a quantized tied head's best candidates.
//!
//! A tied head stored as 4-bit tiles is the single matrix that costs a small model the most
//! accuracy (Gemma 3 270M: the 4-bit head alone takes teacher-forced top-1 from 98 % to 85 %), and
//! the largest one to read per token (262,144 rows). Its exact values are the pack's bf16
//! embedding rows divided by the pre-scale, but reading all of them costs 2 bytes per weight, three
//! times the tiles. So a cheaper head ranks the whole vocabulary — the 4-bit tiles, or for readers
//! of the best logits only the 2-bit scan head (`kernels::scan`) — and only the `k` best rows of
//! that ranking are read again from the embedding and their logits replaced by the exact
//! products: `k·hidden·2` more bytes per token (164 KB for k = 128 on Gemma 3 270M). Greedy
//! decoding then picks the exact head's choice whenever it is among the ranking's `k` best, and
//! the softmax mass that perplexity and sampling see is exact where it is concentrated. The other
//! logits keep the tiles' values, or are −∞ after the scan head.

use rayon::prelude::*;

/// Reads row `r` of the exact head (`k` bf16 values, little-endian) into the buffer.
pub type ReadRow<'a> = &'a (dyn Fn(usize, &mut [u8]) + Sync);

/// The exact head: bf16 rows (`rows × k` little-endian) times `scale`.
#[derive(Clone, Copy)]
pub struct ExactHead<'a> {
    /// Reads one row of the embedding (a positioned read: the candidates are scattered over it,
    /// and reading them through a mapping would leave every page ever touched resident).
    pub rows: ReadRow<'a>,
    /// Hidden size (columns).
    pub k: usize,
    /// Multiplies every product (1 / the embedding's pre-scale).
    pub scale: f32,
}

impl ExactHead<'_> {
    /// The exact logit of row `r` for the input `x`; `buf` holds the row read.
    pub fn logit(&self, r: usize, x: &[f32], buf: &mut Vec<u8>) -> f32 {
        buf.resize(self.k * 2, 0);
        (self.rows)(r, buf);
        let row = &buf[..];
        let mut acc = [0f32; 8];
        let mut chunks = row.chunks_exact(16).zip(x.chunks_exact(8));
        for (b, xs) in &mut chunks {
            for j in 0..8 {
                acc[j] += bf16(b[2 * j], b[2 * j + 1]) * xs[j];
            }
        }
        let done = self.k / 8 * 8;
        let mut s: f32 = acc.iter().sum();
        for j in done..self.k {
            s += bf16(row[2 * j], row[2 * j + 1]) * x[j];
        }
        s * self.scale
    }
}

fn bf16(lo: u8, hi: u8) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([lo, hi])) << 16)
}

/// Sets `row[i]` to −∞ wherever bit `i` of `allowed` (32 tokens a word) is clear; rows past the
/// bits are forbidden too. A grammar's mask (a constrained request's next-token set) reaches the
/// logits through here, in the head or after it.
pub fn forbid_outside(allowed: &[u32], row: &mut [f32]) {
    // Whole words first: a grammar allows either most tokens (inside a string) or a few (between
    // values), so nearly every word is all ones or all zeros, and those are a skip or a fill.
    for (w, chunk) in row.chunks_mut(32).enumerate() {
        match allowed.get(w).copied().unwrap_or(0) {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            bits => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits >> b & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// Indices of the `k` largest values of `v` (any order) into `out`: one pass that keeps up to
/// `2k` candidates above a threshold and cuts them back to `k` when full, so the vocabulary is
/// read once and never sorted.
pub fn top_k(v: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    if k == 0 {
        return;
    }
    let mut buf: Vec<(f32, u32)> = Vec::with_capacity(2 * k);
    let mut floor = f32::NEG_INFINITY;
    let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
    for (i, &x) in v.iter().enumerate() {
        if x > floor {
            buf.push((x, i as u32));
            if buf.len() == 2 * k {
                buf.select_nth_unstable_by(k - 1, desc);
                buf.truncate(k);
                floor = buf.iter().map(|p| p.0).fold(f32::INFINITY, f32::min);
            }
        }
    }
    if buf.len() > k {
        buf.select_nth_unstable_by(k - 1, desc);
        buf.truncate(k);
    }
    out.extend(buf.iter().map(|p| p.1));
}

/// Replaces, for each of the `n` tokens, the `k` largest logits of the ranking head by the exact
/// head's (`xs` is `n × hidden`, `logits` is `n × vocab`). With `only`, every other logit becomes
/// −∞: the ranking head's values are not logits anyone should read (the 2-bit scan head).
pub fn rescore(
    logits: &mut [f32],
    xs: &[f32],
    n: usize,
    head: ExactHead<'_>,
    k: usize,
    only: bool,
) {
    if k == 0 || n == 0 {
        return;
    }
    let vocab = logits.len() / n;
    let one = |(row, x): (&mut [f32], &[f32])| {
        let mut idx = Vec::new();
        top_k(row, k, &mut idx);
        let mut buf = Vec::new();
        let exact: Vec<f32> = idx
            .iter()
            .map(|&i| head.logit(i as usize, x, &mut buf))
            .collect();
        if only {
            row.fill(f32::NEG_INFINITY);
        }
        for (&i, &v) in idx.iter().zip(&exact) {
            row[i as usize] = v;
        }
    };
    if n == 1 {
        one((logits, xs));
    } else {
        logits
            .par_chunks_mut(vocab)
            .zip(xs.par_chunks(head.k))
            .for_each(one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_finds_the_largest_values_of_any_order() {
        let v: Vec<f32> = (0..10_000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 100_003) as f32)
            .collect();
        for k in [1, 3, 64, 500] {
            let mut got = Vec::new();
            top_k(&v, k, &mut got);
            let mut want: Vec<u32> = (0..v.len() as u32).collect();
            want.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]));
            let mut got_vals: Vec<f32> = got.iter().map(|&i| v[i as usize]).collect();
            let mut want_vals: Vec<f32> = want[..k].iter().map(|&i| v[i as usize]).collect();
            got_vals.sort_by(f32::total_cmp);
            want_vals.sort_by(f32::total_cmp);
            assert_eq!(got.len(), k);
            assert_eq!(got_vals, want_vals, "k = {k}");
        }
        let mut got = Vec::new();
        top_k(&[f32::NAN, 1.0, f32::NAN, 2.0], 3, &mut got);
        got.sort();
        assert_eq!(got, vec![1, 3], "NaN is never a candidate");
        top_k(&v, 0, &mut got);
        assert!(got.is_empty());
    }

    #[test]
    fn the_exact_logit_is_the_bf16_dot_product_times_the_scale() {
        let k = 21;
        let vals: Vec<f32> = (0..2 * k).map(|i| (i as f32 - 17.0) / 8.0).collect();
        let rows: Vec<u8> = vals
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let x: Vec<f32> = (0..k).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let read =
            |r: usize, out: &mut [u8]| out.copy_from_slice(&rows[r * k * 2..(r + 1) * k * 2]);
        let head = ExactHead {
            rows: &read,
            k,
            scale: 0.5,
        };
        let mut buf = Vec::new();
        for r in 0..2 {
            let want: f32 = (0..k).map(|j| vals[r * k + j] * x[j]).sum::<f32>() * 0.5;
            assert!((head.logit(r, &x, &mut buf) - want).abs() < 1e-5, "row {r}");
        }
    }
}
