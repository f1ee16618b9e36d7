//! One sequence's state: its position, the KV cache of each attention layer and the recurrent
//! state of each short-convolution or gated-DeltaNet layer, and how much of each row's logits its
//! reader uses. The forward pass writes it; `Model::session` makes one sized for the model.

/// The KV cache, recurrent state and position of one sequence. A clone is an independent copy
/// that continues from the same point (a fork of the sequence).
#[derive(Clone)]
pub struct Session {
    /// Tokens processed so far.
    pub pos: usize,
    /// Capacity in tokens.
    pub capacity: usize,
    /// Per layer: cached keys and values (empty for layers without attention).
    pub(super) k: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
    /// Per layer: a short-convolution layer's last `kernel − 1` inputs, oldest first, `[tap][H]`
    /// (empty for other layers). Zero at position 0, as the convolution's causal padding is.
    pub(super) conv: Vec<Vec<f32>>,
    /// Per layer: a gated-DeltaNet layer's state, `[value head][key dim][value dim]` (empty for
    /// other layers).
    pub(super) ssm: Vec<Vec<f32>>,
    /// How many of the best logits the sampler reading this session uses (0 = all of them).
    pub(super) reads_top: usize,
    /// The only tokens its next logits row may rank (a grammar's mask, a bit per token).
    pub(super) allowed: Option<std::sync::Arc<[u32]>>,
}

impl Session {
    /// A session without a cache: what stays in a finished slot once its cache is back in the pool.
    #[cfg(feature = "server")]
    pub(crate) fn empty() -> Session {
        Session {
            pos: 0,
            capacity: 0,
            k: Vec::new(),
            v: Vec::new(),
            conv: Vec::new(),
            ssm: Vec::new(),
            reads_top: 0,
            allowed: None,
        }
    }

    /// Says that whatever reads this session's logits uses only the `k` best of each row (greedy:
    /// 1; top-k sampling: k); 0 (the default) means the whole distribution (perplexity, full
    /// sampling). A row whose reader uses at most the re-scored candidates is ranked with the
    /// pack's scan head (if it has one) instead of the tiled head, and its other logits are −∞;
    /// the choice is per row, never by the other rows of a batch.
    pub fn read_top(&mut self, k: usize) {
        self.reads_top = k;
    }

    /// Restricts the next logits row to the tokens whose bits are set in `allowed` (a grammar's
    /// mask; `None` lifts it): a row ranked by the scan head ranks only those, so a reader of the
    /// best few candidates gets the best allowed ones. The sampler masks the logits itself.
    pub fn allow_only(&mut self, allowed: Option<std::sync::Arc<[u32]>>) {
        self.allowed = allowed;
    }

    /// Forgets everything after position `pos` (keeps a shared prompt prefix) and returns the
    /// position kept. Recurrent state (a convolution's last inputs, a delta-rule state) holds no history
    /// to rewind to: a session with such layers goes back to position 0, its state cleared,
    /// whenever `pos` is before its current position. Truncating to 0 always starts afresh.
    pub fn truncate(&mut self, pos: usize) -> usize {
        if pos >= self.pos {
            return self.pos;
        }
        if pos == 0 || self.has_recurrent_state() {
            for c in self.conv.iter_mut().chain(self.ssm.iter_mut()) {
                c.fill(0.0);
            }
            self.pos = 0;
        } else {
            self.pos = pos;
        }
        self.pos
    }

    /// Whether any layer keeps recurrent state (which cannot be rewound; see
    /// [`Session::truncate`]).
    pub fn has_recurrent_state(&self) -> bool {
        self.conv.iter().chain(&self.ssm).any(|c| !c.is_empty())
    }

    /// A gated-DeltaNet layer's state, `[value head][key dim][value dim]` (empty for other
    /// layers; tests compare states).
    pub fn ssm_state(&self, layer: usize) -> &[f32] {
        &self.ssm[layer]
    }

    /// A convolution's state: its last `kernel − 1` inputs, oldest first, `[tap][channel]`
    /// (hidden channels for a short convolution, q/k/v for a gated DeltaNet; empty for
    /// attention layers; tests compare states).
    pub fn conv_state(&self, layer: usize) -> &[f32] {
        &self.conv[layer]
    }

    /// A copy of the recurrent state (each short convolution's last inputs, each delta-rule
    /// state) at the current position, or `None` for a model without recurrent layers, whose KV
    /// cache alone can be rewound. A server takes one at the end of a prompt, so that a later
    /// prompt that extends it can start from there (the state itself cannot be rewound).
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        self.has_recurrent_state().then(|| Checkpoint {
            pos: self.pos,
            conv: self.conv.clone(),
            ssm: self.ssm.clone(),
        })
    }

    /// Goes back to `c`'s position with its recurrent state. The KV cache up to that position is
    /// kept as it is: `c` must have been taken from this session, and no position before `c.pos`
    /// rewritten since (a server keeps the tokens each session holds, which guarantees both).
    /// Returns false, changing nothing, when `c` is past the current position or does not fit
    /// this session's layers.
    pub fn restore(&mut self, c: &Checkpoint) -> bool {
        let fits = |a: &[Vec<f32>], b: &[Vec<f32>]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
        };
        if c.pos > self.pos || !fits(&self.conv, &c.conv) || !fits(&self.ssm, &c.ssm) {
            return false;
        }
        for (dst, src) in self.conv.iter_mut().zip(&c.conv) {
            dst.copy_from_slice(src);
        }
        for (dst, src) in self.ssm.iter_mut().zip(&c.ssm) {
            dst.copy_from_slice(src);
        }
        self.pos = c.pos;
        true
    }

    /// The cached keys of `layer` for positions `< pos` (tests compare caches).
    pub fn keys(&self, layer: usize) -> &[f32] {
        let w = self.k[layer].len() / self.capacity.max(1);
        &self.k[layer][..self.pos * w]
    }

    /// The cached values of `layer` for positions `< pos`.
    pub fn values(&self, layer: usize) -> &[f32] {
        let w = self.v[layer].len() / self.capacity.max(1);
        &self.v[layer][..self.pos * w]
    }
}

/// A session's recurrent state at one position (see [`Session::checkpoint`]).
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The position the state belongs to: the tokens processed when it was taken.
    pub pos: usize,
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

impl Checkpoint {
    /// Bytes the checkpoint holds.
    pub fn bytes(&self) -> usize {
        let floats: usize = self.conv.iter().chain(&self.ssm).map(Vec::len).sum();
        floats * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {

    use crate::model::Model;
    use crate::model::test_pack::*;
    use crate::pack::Pack;
    use crate::spec::{Act, QkNorm, ValueHeadOrder};

    #[test]
    fn batched_prefill_leaves_exactly_the_logits_and_kv_of_single_steps() {
        let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
        let (_d, m) = load(&sp);
        let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
        let (batch, step, all, singles) = prefill_and_steps(&m, &toks);
        assert_eq!(bits(&all), bits(&singles), "logits");
        for l in 0..sp.layers.len() {
            assert_eq!(bits(batch.keys(l)), bits(step.keys(l)), "keys of layer {l}");
            assert_eq!(
                bits(batch.values(l)),
                bits(step.values(l)),
                "values of layer {l}"
            );
        }
        // Prefill then one step equals the same tokens in one batch.
        let mut a = m.session(32);
        m.forward(&mut a, &toks[..5], false).expect("prefix");
        let tail = m.forward(&mut a, &toks[5..], true).expect("rest");
        assert_eq!(bits(&tail), bits(&all[5 * V..]));
    }

    #[test]
    fn a_mixed_batch_of_sequences_gives_each_exactly_its_single_sequence_numbers() {
        let sp = spec(QkNorm::AfterRope, Act::Silu, false);
        let (_d, m) = load(&sp);
        let prompts: [&[u32]; 3] = [&[1, 5, 9], &[2, 40, 41, 42, 8], &[7]];
        // Alone: each prompt, then two decode steps.
        let mut alone = Vec::new();
        for p in prompts {
            let mut s = m.session(16);
            let mut l = m.forward(&mut s, p, false).expect("prefill");
            l.extend(m.forward(&mut s, &[11], false).expect("step"));
            l.extend(m.forward(&mut s, &[12], false).expect("step"));
            alone.push((l, s));
        }
        // Together: sequence 0 and 1 prefilled, then a batch with their decode rows and sequence
        // 2's whole prompt, then one more batch of three decode rows.
        let (mut a, mut b, mut c) = (m.session(16), m.session(16), m.session(16));
        let mut got = [Vec::new(), Vec::new(), Vec::new()];
        got[0] = m.forward(&mut a, prompts[0], false).expect("a");
        got[1] = m.forward(&mut b, prompts[1], false).expect("b");
        let rows = [(0, 11), (1, 11), (2, 7)];
        let l = m
            .forward_batch(&mut [&mut a, &mut b, &mut c], &rows, &[0, 1, 2])
            .expect("mixed");
        got[0].extend(&l[..V]);
        got[1].extend(&l[V..2 * V]);
        got[2] = l[2 * V..].to_vec();
        let rows = [(2, 11), (0, 12), (1, 12)];
        let l = m
            .forward_batch(&mut [&mut a, &mut b, &mut c], &rows, &[0, 1, 2])
            .expect("decode");
        got[2].extend(&l[..V]);
        got[0].extend(&l[V..2 * V]);
        got[1].extend(&l[2 * V..]);
        got[2].extend(m.forward(&mut c, &[12], false).expect("c"));
        for (i, (s, (want, ws))) in [&a, &b, &c].iter().zip(&alone).enumerate() {
            assert_eq!(bits(&got[i]), bits(want), "logits of sequence {i}");
            assert_eq!(s.pos, ws.pos, "position of sequence {i}");
            for l in 0..sp.layers.len() {
                assert_eq!(bits(s.keys(l)), bits(ws.keys(l)), "keys {i}/{l}");
                assert_eq!(bits(s.values(l)), bits(ws.values(l)), "values {i}/{l}");
            }
        }
        // A batch that overflows one sequence's context is refused before any cache changes.
        let mut full = m.session(2);
        let mut other = m.session(8);
        let err = m
            .forward_batch(
                &mut [&mut full, &mut other],
                &[(1, 1), (0, 1), (0, 2), (0, 3)],
                &[0],
            )
            .expect_err("overflow");
        assert!(err.to_string().contains("2-token context"), "{err}");
        assert_eq!((full.pos, other.pos), (0, 0));
    }

    /// Every batch shape the scheduler builds is valid for every kernel: a prompt chunk that needs no
    /// logits (zero head rows), decode rows only, and a mix of both, on packs with and without the
    /// scan head and of each mixer kind. A chunk without logits returns none and leaves the same
    /// caches and states as the prompt run whole.
    #[test]
    fn batches_with_no_logit_rows_advance_the_caches_and_return_no_logits() {
        let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
        let scan_dir = tempfile::tempdir().expect("t");
        write_pack_with(scan_dir.path(), &sp, true, true);
        let mut scan =
            Model::load(Pack::open(scan_dir.path(), false).expect("open")).expect("load");
        scan.set_head_rescore(4);
        let (_a, attn) = load(&sp);
        let (_c, conv) = load(&conv_spec());
        let (_d, delta) = load(&delta_spec(ValueHeadOrder::Tiled));
        let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
        for (name, m) in [
            ("scan head", &scan),
            ("attention", &attn),
            ("short convolution", &conv),
            ("gated deltanet", &delta),
        ] {
            for reads_top in [0, 1] {
                // Whole prompt at once.
                let mut whole = m.session(32);
                whole.read_top(reads_top);
                let want = m.forward(&mut whole, &toks, false).expect("whole");
                // The same prompt in chunks of 4, the first two asking for no logits.
                let mut chunked = m.session(32);
                chunked.read_top(reads_top);
                let rows = |ts: &[u32]| ts.iter().map(|&t| (0usize, t)).collect::<Vec<_>>();
                for chunk in [&toks[..4], &toks[4..8]] {
                    let l = m
                        .forward_batch(&mut [&mut chunked], &rows(chunk), &[])
                        .expect("chunk without logits");
                    assert!(l.is_empty(), "{name}: no rows wanted, no logits");
                }
                let got = m
                    .forward_batch(&mut [&mut chunked], &rows(&toks[8..]), &[0])
                    .expect("last chunk");
                assert_eq!(bits(&got), bits(&want), "{name} (reads {reads_top})");
                assert_eq!(chunked.pos, toks.len());
                // An empty batch is no pass at all.
                let none = m
                    .forward_batch(&mut [&mut chunked], &[], &[])
                    .expect("empty batch");
                assert!(none.is_empty());
                assert_eq!(chunked.pos, toks.len());
                // Decode rows of two sequences beside a chunk of a third that needs no logits: the
                // decode rows get their single-sequence numbers whatever the third reads.
                let mut other = m.session(32);
                other.read_top(1 - reads_top);
                let mut solo = chunked.clone();
                let alone = m.forward(&mut solo, &[11], false).expect("alone");
                let mut third = m.session(32);
                let mixed = m
                    .forward_batch(
                        &mut [&mut chunked, &mut third, &mut other],
                        &[(0, 11), (1, 4), (1, 8), (2, 9)],
                        &[0, 3],
                    )
                    .expect("mixed");
                assert_eq!(
                    bits(&mixed[..V]),
                    bits(&alone),
                    "{name}: decode row beside others"
                );
            }
        }
    }
}
