//! LFM2's gated short convolution ([`onebit_pack::spec::Mixer::ShortConv`]): `in_proj` to B, C and x,
//! a causal depthwise convolution of B ⊙ x over the last `kernel` positions (the earlier ones kept
//! per sequence as its state), times C, then `out_proj`.

use super::Model;
use super::mixer::{Mixing, Pass};
use super::weight::{Binder, Weight};
use crate::error::Result;

/// The gated short convolution of one layer.
pub(super) struct ShortConv {
    /// `3H × H`: B, C and x, H rows each.
    in_proj: Weight,
    /// `H × H`.
    out_proj: Weight,
    /// `[kernel][H]` (transposed from the pack's `[H][kernel]` at load, so every step below runs
    /// over contiguous channels): tap j of channel c at `j·H + c`, tap `kernel − 1` on the
    /// current position.
    taps: Vec<f32>,
    kernel: usize,
    hidden: usize,
}

impl ShortConv {
    /// Binds layer `i`'s `shortconv.*` tensors for a `kernel`-tap convolution over `h` channels.
    pub fn load(b: &Binder<'_>, i: usize, h: usize, kernel: usize) -> Result<ShortConv> {
        let n = |s: &str| format!("model.layers.{i}.shortconv.{s}");
        let name = n("conv.weight");
        let taps = b.vector(&name, false)?;
        if kernel == 0 || taps.len() != h * kernel {
            return Err(b.bad(format!(
                "{name}: {} values, expected {h} channels × {kernel} taps",
                taps.len()
            )));
        }
        let mut by_tap = vec![0f32; h * kernel];
        for (c, row) in taps.chunks_exact(kernel).enumerate() {
            for (j, &w) in row.iter().enumerate() {
                by_tap[j * h + c] = w;
            }
        }
        Ok(ShortConv {
            in_proj: b.weight(&n("in_proj.weight"), 3 * h, h)?,
            out_proj: b.weight(&n("out_proj.weight"), h, h)?,
            taps: by_tap,
            kernel,
            hidden: h,
        })
    }
}

impl Mixing for ShortConv {
    fn forward(
        &self,
        m: &Model,
        li: usize,
        hbuf: &[f32],
        pass: &mut Pass<'_, '_>,
        out: &mut [f32],
    ) -> Result<()> {
        let (h, n) = (self.hidden, pass.rows());
        let lname = |s: &str| format!("model.layers.{li}.shortconv.{s}");
        let rec = m.recording();
        if rec {
            m.record(&[lname("in_proj.weight")], hbuf, n);
        }
        let mut bcx = vec![0f32; n * 3 * h];
        m.matmul(&self.in_proj, hbuf, n, &mut bcx)?;
        let mut states = pass.conv_states(li);
        let mut y = vec![0f32; n * h];
        short_conv(self, h, &bcx, &pass.seq_pos, &mut states, &mut y);
        pass.defer_conv(li, states);
        if rec {
            m.record(&[lname("out_proj.weight")], &y, n);
        }
        m.matmul(&self.out_proj, &y, n, out)
    }

    fn weights(&self) -> Vec<&Weight> {
        vec![&self.in_proj, &self.out_proj]
    }

    fn conv_state(&self) -> usize {
        (self.kernel - 1) * self.hidden
    }
}

/// The gated short convolution over the rows at `seq_pos` (rows of one sequence in order):
/// `bcx` holds each row's `in_proj` output (B, C, x; `h` each), `states[i]` sequence i's last
/// `kernel − 1` convolution inputs, advanced here row by row, and `y` receives C ⊙ conv(B ⊙ x).
/// Prefill and token-by-token steps run this same loop, so they leave the same state.
fn short_conv(
    c: &ShortConv,
    h: usize,
    bcx: &[f32],
    seq_pos: &[(usize, usize)],
    states: &mut [Vec<f32>],
    y: &mut [f32],
) {
    let kern = c.kernel;
    let mut bx = vec![0f32; h];
    for (t, &(i, _)) in seq_pos.iter().enumerate() {
        let row = &bcx[t * 3 * h..(t + 1) * 3 * h];
        let (b, rest) = row.split_at(h);
        let (gate, xs) = rest.split_at(h);
        let st = &mut states[i];
        let yt = &mut y[t * h..(t + 1) * h];
        // Every step over contiguous channels (vectorized by the compiler).
        for ((o, &bb), &xx) in bx.iter_mut().zip(b).zip(xs) {
            *o = bb * xx;
        }
        let last = &c.taps[(kern - 1) * h..kern * h];
        for ((o, &w), &v) in yt.iter_mut().zip(last).zip(&bx) {
            *o = w * v;
        }
        for j in 0..kern - 1 {
            let (w, past) = (&c.taps[j * h..(j + 1) * h], &st[j * h..(j + 1) * h]);
            for ((o, &w), &v) in yt.iter_mut().zip(w).zip(past) {
                *o += w * v;
            }
        }
        for (o, &g) in yt.iter_mut().zip(gate) {
            *o *= g;
        }
        if kern > 1 {
            st.copy_within(h.., 0);
            st[(kern - 2) * h..].copy_from_slice(&bx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::weight::Weight;
    use super::{ShortConv, short_conv};

    /// The loop against LFM2's definition over a whole sequence: a causal depthwise conv1d
    /// (padding kernel − 1, the first `len` outputs) of B ⊙ x, times C.
    #[test]
    fn short_conv_is_a_causal_depthwise_convolution() {
        let (h, kern, n) = (5, 3, 7);
        let val = |i: usize| ((i * 7919 % 97) as f32 - 48.0) / 17.0;
        // `[H][kernel]` as the pack stores them; the layer holds them `[kernel][H]`.
        let taps: Vec<f32> = (0..h * kern).map(|i| val(i + 1000)).collect();
        let mut by_tap = vec![0f32; h * kern];
        for ch in 0..h {
            for j in 0..kern {
                by_tap[j * h + ch] = taps[ch * kern + j];
            }
        }
        let bcx: Vec<f32> = (0..n * 3 * h).map(val).collect();
        let unused = Weight::Bf16 {
            rows: 0,
            k: 0,
            range: 0..0,
            scale: 1.0,
        };
        let c = ShortConv {
            in_proj: unused.clone(),
            out_proj: unused,
            taps: by_tap,
            kernel: kern,
            hidden: h,
        };
        let seq: Vec<(usize, usize)> = (0..n).map(|p| (0, p)).collect();
        let mut states = vec![vec![0f32; (kern - 1) * h]];
        let mut y = vec![0f32; n * h];
        short_conv(&c, h, &bcx, &seq, &mut states, &mut y);
        let bx = |t: usize, ch: usize| (bcx[t * 3 * h + ch] * bcx[t * 3 * h + 2 * h + ch]) as f64;
        for t in 0..n {
            for ch in 0..h {
                let conv: f64 = (0..kern)
                    .filter(|&j| t + j >= kern - 1)
                    .map(|j| taps[ch * kern + j] as f64 * bx(t + j + 1 - kern, ch))
                    .sum();
                let want = bcx[t * 3 * h + h + ch] as f64 * conv;
                assert!((y[t * h + ch] as f64 - want).abs() < 1e-4, "[{t}][{ch}]");
            }
        }
        // The state is the last kernel − 1 inputs, oldest first.
        for j in 0..kern - 1 {
            for ch in 0..h {
                let want = bx(n - (kern - 1) + j, ch) as f32;
                assert!((states[0][j * h + ch] - want).abs() < 1e-5);
            }
        }
    }
}
