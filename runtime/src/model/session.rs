//! One sequence's state: its position, the KV cache of each attention layer and the recurrent
//! state of each short-convolution or gated-DeltaNet layer, and how much of each row's logits its
//! reader uses. The forward pass writes it; `Model::session` makes one sized for the model.

use std::sync::Arc;

use onebit_kernels::kv::LayerCache;

use crate::error::{Error, Result};
use crate::image_input::ImageEmbeds;

/// The KV cache, recurrent state and position of one sequence. A clone is an independent copy
/// that continues from the same point (a fork of the sequence).
#[derive(Clone)]
pub struct Session {
    /// Tokens processed so far.
    pub pos: usize,
    /// Capacity in tokens.
    pub capacity: usize,
    /// Per layer: cached keys and values (no blocks for layers without attention).
    pub(super) kv: Vec<LayerCache>,
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
    /// Images placed in the sequence: (first position, embeddings), in position order. Their
    /// rows take the image's embeddings instead of the tokens', and attend to each other both
    /// ways (Gemma 3: bidirectional inside an image, causal elsewhere).
    pub(super) images: Vec<(usize, Arc<ImageEmbeds>)>,
}

impl Session {
    /// A session without a cache: what stays in a finished slot once its cache is back in a
    /// pool (a server's slots keep their place while their memory is reused).
    pub fn empty() -> Session {
        Session {
            pos: 0,
            capacity: 0,
            kv: Vec::new(),
            conv: Vec::new(),
            ssm: Vec::new(),
            reads_top: 0,
            allowed: None,
            images: Vec::new(),
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

    /// Places `image` at positions `at..at + image.tokens` (not yet run): when the forward pass
    /// reaches them, their rows read the image's embeddings, whatever tokens they carry (the
    /// prompt's image tokens), and attend to every row of the image. Refuses a place already run
    /// or overlapping another image.
    pub fn place_image(&mut self, at: usize, image: Arc<ImageEmbeds>) -> Result<()> {
        let end = at + image.tokens;
        if at < self.pos || end > self.capacity {
            return Err(Error::Request {
                field: "image",
                reason: format!(
                    "an image at positions {at}..{end} of a sequence at {} with room for {}",
                    self.pos, self.capacity
                ),
            });
        }
        if let Some((s, other)) = self
            .images
            .iter()
            .find(|(s, o)| *s < end && at < s + o.tokens)
        {
            return Err(Error::Request {
                field: "image",
                reason: format!(
                    "an image at positions {at}..{end} overlaps the one at {s}..{}",
                    s + other.tokens
                ),
            });
        }
        let i = self.images.partition_point(|(s, _)| *s < at);
        self.images.insert(i, (at, image));
        Ok(())
    }

    /// Places each image of `places` (first position, embeddings: what
    /// `ImageEncoder::places` found in the prompt this session holds and will hold, from
    /// position 0). An image over positions already run (a reused cache's prefix) must be the one
    /// the session ran there.
    pub fn place_images(&mut self, places: &[(usize, &Arc<ImageEmbeds>)]) -> Result<()> {
        for &(at, image) in places {
            if at < self.pos {
                match self.image_at(at) {
                    Some((s, held)) if s == at && held.digest == image.digest => continue,
                    _ => {
                        return Err(Error::Internal(format!(
                            "the cache resumed at {} holds another image at {at}",
                            self.pos
                        )));
                    }
                }
            }
            self.place_image(at, image.clone())?;
        }
        Ok(())
    }

    /// The image placed over position `p`, with its first position.
    pub fn image_at(&self, p: usize) -> Option<(usize, &Arc<ImageEmbeds>)> {
        self.images
            .iter()
            .find(|(s, im)| *s <= p && p < s + im.tokens)
            .map(|(s, im)| (*s, im))
    }

    /// The images placed in this sequence: (first position, embeddings), in order.
    pub fn images(&self) -> &[(usize, Arc<ImageEmbeds>)] {
        &self.images
    }

    /// Where a pass over positions `from..to` must end so that it splits no image (an image's
    /// rows attend to each other, so they go through the model together): `to`, or the start of
    /// the image `to` would cut, or its end where the image starts at `from`.
    pub fn pass_end(&self, from: usize, to: usize) -> usize {
        match self.image_at(to.saturating_sub(1)) {
            Some((s, im)) if s + im.tokens > to => {
                if s > from {
                    s
                } else {
                    s + im.tokens
                }
            }
            _ => to,
        }
    }

    /// Forgets everything after position `pos` (keeps a shared prompt prefix) and returns the
    /// position kept. Recurrent state (a convolution's last inputs, a delta-rule state) holds no history
    /// to rewind to: a session with such layers goes back to position 0, its state cleared,
    /// whenever `pos` is before its current position. Truncating to 0 always starts afresh.
    /// An image is kept whole or not at all: a `pos` inside one keeps the positions before it.
    pub fn truncate(&mut self, pos: usize) -> usize {
        let pos = match self.image_at(pos) {
            Some((s, _)) if s < pos => s,
            _ => pos,
        };
        if pos >= self.pos {
            self.images.retain(|(s, _)| *s < self.pos);
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
        for c in &mut self.kv {
            c.shrink(self.pos);
        }
        let kept = self.pos;
        self.images.retain(|(s, _)| *s < kept);
        self.pos
    }

    /// Allocates the KV cache's blocks for positions `..end` (the forward pass does it before a
    /// batch); refuses, naming the budget, when they do not fit.
    pub fn grow(&mut self, end: usize) -> crate::Result<()> {
        for c in &mut self.kv {
            c.grow(end)?;
        }
        Ok(())
    }

    /// Bytes of KV cache this session holds now (its allocated blocks).
    pub fn cache_bytes(&self) -> usize {
        self.kv.iter().map(LayerCache::bytes).sum()
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

    /// The cached keys of `layer` for positions `< pos`, as f32 (tests compare caches).
    pub fn keys(&self, layer: usize) -> Vec<f32> {
        self.kv[layer].to_f32(self.pos, false)
    }

    /// The cached values of `layer` for positions `< pos`, as f32.
    pub fn values(&self, layer: usize) -> Vec<f32> {
        self.kv[layer].to_f32(self.pos, true)
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
