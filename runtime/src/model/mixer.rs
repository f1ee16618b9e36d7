//! What a layer is: a norm, a mixer over positions ([`Mixing`]: attention, a short convolution
//! or a gated DeltaNet, one file each), the residual, a norm and the FFN. A mixer sees the whole
//! batch of a forward pass at once through [`Pass`].
//!
//! Adding a mixer means one file that implements [`Mixing`] (its weights, its state per sequence
//! and its `forward`) and one line in `load.rs` that builds it from the spec's `Mixer`.

use super::Model;
use super::ffn::Ffn;
use super::session::Session;
use super::weight::Weight;
use crate::error::Result;
use onebit_kernels::ops;

/// What mixes positions in a layer.
pub(super) trait Mixing: Send + Sync {
    /// This layer's mixing of the pass's rows: `x` is the normed input (`rows × hidden`), `out`
    /// (`rows × hidden`) receives the branch the layer adds to the residual. Reads and advances
    /// each row's session through `pass` (KV cache writes at once; recurrent state deferred to
    /// the end of the pass).
    fn forward(
        &self,
        m: &Model,
        layer: usize,
        x: &[f32],
        pass: &mut Pass<'_, '_>,
        out: &mut [f32],
    ) -> Result<()>;

    /// The matrices, for the kernel self-check.
    fn weights(&self) -> Vec<&Weight>;

    /// Floats per token of this layer's KV cache (0: none).
    fn kv_rows(&self) -> usize {
        0
    }

    /// Floats of one sequence's convolution state (0: none).
    fn conv_state(&self) -> usize {
        0
    }

    /// Floats of one sequence's delta-rule state (0: none).
    fn ssm_state(&self) -> usize {
        0
    }
}

/// What the layers of one forward pass share: the sessions, each row's sequence and position,
/// RoPE angles per table (made when a layer first needs them), and the recurrent states the pass
/// leaves, written back only when the whole pass succeeds (a refused pass leaves every session as
/// it was).
pub(super) struct Pass<'p, 's> {
    /// The sequences of the batch.
    pub sessions: &'p mut [&'s mut Session],
    /// Per row: (index into `sessions`, position).
    pub seq_pos: Vec<(usize, usize)>,
    /// Per row: the last position its attention reads (its own, or its image's last).
    pub ends: Vec<usize>,
    /// Per RoPE table: each row's angles, once a layer has needed them.
    pub angles: Vec<Option<Vec<ops::RopeAngles>>>,
    conv: Vec<(usize, Vec<Vec<f32>>)>,
    ssm: Vec<(usize, Vec<Vec<f32>>)>,
}

impl<'p, 's> Pass<'p, 's> {
    /// A pass over `sessions` with rows at `seq_pos` attending up to `ends`, for a model with
    /// `ropes` RoPE tables.
    pub fn new(
        sessions: &'p mut [&'s mut Session],
        seq_pos: Vec<(usize, usize)>,
        ends: Vec<usize>,
        ropes: usize,
    ) -> Self {
        Pass {
            sessions,
            seq_pos,
            ends,
            angles: vec![None; ropes],
            conv: Vec::new(),
            ssm: Vec::new(),
        }
    }

    /// Rows in the pass.
    pub fn rows(&self) -> usize {
        self.seq_pos.len()
    }

    /// Every session's convolution state of `layer`, to advance and then [`Pass::defer_conv`].
    pub fn conv_states(&self, layer: usize) -> Vec<Vec<f32>> {
        self.sessions
            .iter()
            .map(|s| s.conv[layer].clone())
            .collect()
    }

    /// Every session's delta-rule state of `layer`, to advance and then [`Pass::defer_ssm`].
    pub fn ssm_states(&self, layer: usize) -> Vec<Vec<f32>> {
        self.sessions.iter().map(|s| s.ssm[layer].clone()).collect()
    }

    /// Layer `layer`'s convolution states as this pass leaves them.
    pub fn defer_conv(&mut self, layer: usize, states: Vec<Vec<f32>>) {
        self.conv.push((layer, states));
    }

    /// Layer `layer`'s delta-rule states as this pass leaves them.
    pub fn defer_ssm(&mut self, layer: usize, states: Vec<Vec<f32>>) {
        self.ssm.push((layer, states));
    }

    /// Writes the deferred recurrent states into the sessions (the pass succeeded).
    pub fn commit(self) {
        for (li, states) in self.conv {
            for (s, st) in self.sessions.iter_mut().zip(states) {
                s.conv[li] = st;
            }
        }
        for (li, states) in self.ssm {
            for (s, st) in self.sessions.iter_mut().zip(states) {
                s.ssm[li] = st;
            }
        }
    }
}

/// One decoder layer.
pub(super) struct Layer {
    /// The norm before the mixer.
    pub attn_norm: Vec<f32>,
    /// The mixer.
    pub mixing: Box<dyn Mixing>,
    /// The norm of the mixer's branch (Gemma's sandwich norms).
    pub post_attn_norm: Option<Vec<f32>>,
    /// The norm before the FFN.
    pub ffn_norm: Vec<f32>,
    /// The norm of the FFN's branch (sandwich norms).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The gated FFN.
    pub ffn: Ffn,
}

/// The residual update `x += norm(branch)`, the norm only where the model has it (Gemma's
/// sandwich norms).
pub(super) fn add_branch(x: &mut [f32], branch: &mut [f32], post_norm: Option<&[f32]>, eps: f32) {
    if let Some(w) = post_norm {
        ops::rmsnorm_inplace(branch, w, eps);
    }
    for (a, &b) in x.iter_mut().zip(branch.iter()) {
        *a += b;
    }
}
