//! Prompt-prefix reuse. A finished sequence's KV cache goes back to the pool together with the
//! tokens it holds, so a later request whose prompt starts the same way (the same system prompt,
//! the earlier turns of a chat) starts from that cache instead of recomputing it. A request takes
//! the free cache that shares the longest prefix with its prompt; without one, the least recently
//! used cache, so the prefixes used last stay longest.
//!
//! Attention layers rewind: their cache is simply cut at the shared prefix. Recurrent layers (a
//! short convolution, a gated DeltaNet) hold one state, not a history, so they are resumed only
//! at positions whose state is known: the cache's own end (the whole earlier exchange was
//! shared), or the checkpoint taken when the earlier prompt had been read.
//!
//! An image's tokens are the same for every image, so a cache holding an image is reused only up
//! to the first image that is not the same content at the same place.
//!
//! The reused positions hold exactly what a cold run would compute for them (each row of a batch
//! gets its numbers alone), so a warm request's logits are the cold ones bit for bit.

use onebit_runtime::image_input::image_prefix;
use onebit_runtime::model::{Checkpoint, Model, Session};

/// A free cache and what it holds.
struct Cached {
    session: Session,
    /// The tokens whose keys and values the cache holds: `session.pos` of them.
    tokens: Vec<u32>,
    /// The recurrent state at the end of the prompt that filled the cache (models with recurrent
    /// layers only).
    checkpoint: Option<Checkpoint>,
    /// When it was last handed out (larger: more recent).
    used: u64,
}

/// Where a reused cache resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resume {
    /// Cut the cache at this many tokens (no recurrent state, or the recurrent state's own end).
    Cut(usize),
    /// Restore the prompt-end checkpoint.
    Checkpoint(usize),
}

impl Resume {
    fn tokens(self) -> usize {
        match self {
            Resume::Cut(n) | Resume::Checkpoint(n) => n,
        }
    }
}

/// A cache handed to a request: start feeding its prompt at `reused`.
pub(crate) struct Taken {
    /// The cache, at position `reused`.
    pub session: Session,
    /// Prompt tokens whose cache was reused (not recomputed).
    pub reused: usize,
}

/// Every free cache, each with the tokens it holds.
pub(crate) struct Pool {
    free: Vec<Cached>,
    clock: u64,
    /// Off: every request starts afresh.
    reuse: bool,
}

impl Pool {
    /// `slots` caches of `ctx` tokens, empty until their sequences fill them; `reuse` false
    /// starts every request afresh.
    pub fn new(model: &Model, slots: usize, ctx: usize, reuse: bool) -> Pool {
        Pool {
            free: (0..slots)
                .map(|_| Cached {
                    session: model.session(ctx),
                    tokens: Vec::new(),
                    checkpoint: None,
                    used: 0,
                })
                .collect(),
            clock: 0,
            reuse,
        }
    }

    /// The free cache that shares the longest prefix with `prompt`, positioned to resume there
    /// (always at least one prompt token left to feed: its logits start the answer); `None`
    /// when no cache is free.
    pub fn take(&mut self, prompt: &[u32]) -> Option<Taken> {
        self.take_with_images(prompt, &[])
    }

    /// [`Pool::take`] for a prompt whose `images` (first position, content digest) go over its
    /// image tokens: a cache is reused only up to the first image it holds that is not the same
    /// image at the same place (the image tokens themselves are the same for every image).
    pub fn take_with_images(
        &mut self,
        prompt: &[u32],
        images: &[(usize, [u8; 32])],
    ) -> Option<Taken> {
        let best = self
            .free
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let at = if self.reuse {
                    resume_at(c, prompt, images)
                } else {
                    Resume::Cut(0)
                };
                (i, at)
            })
            // The longest reuse; among equals the least recently used.
            .max_by_key(|&(i, r)| (r.tokens(), std::cmp::Reverse(self.free[i].used)))?;
        let (i, resume) = best;
        let mut c = self.free.swap_remove(i);
        let reused = match resume {
            Resume::Cut(n) => c.session.truncate(n),
            Resume::Checkpoint(n) => match &c.checkpoint {
                Some(cp) if c.session.restore(cp) => n,
                _ => c.session.truncate(0),
            },
        };
        Some(Taken {
            session: c.session,
            reused,
        })
    }

    /// Returns a cache to the pool. `tokens` are the tokens fed to it in order (its first
    /// `session.pos` are what it holds); `checkpoint` is its state at the end of its prompt.
    pub fn give(&mut self, session: Session, mut tokens: Vec<u32>, checkpoint: Option<Checkpoint>) {
        tokens.truncate(session.pos);
        let checkpoint = checkpoint.filter(|c| c.pos <= tokens.len());
        self.clock += 1;
        self.free.push(Cached {
            session,
            tokens,
            checkpoint,
            used: self.clock,
        });
    }

    /// Empties every free cache: their blocks go back to the budget (a request needs the room).
    /// Their prefixes are lost, so later requests recompute them.
    pub fn release(&mut self) {
        for c in &mut self.free {
            c.session.truncate(0);
            c.tokens.clear();
            c.checkpoint = None;
        }
    }

    /// Returns a cache whose contents are unknown (a forward pass failed inside it): it starts
    /// afresh.
    pub fn give_cleared(&mut self, mut session: Session) {
        session.truncate(0);
        self.give(session, Vec::new(), None);
    }
}

/// Where `c` can resume for `prompt` with `images`: the shared prefix (up to the first image
/// that differs), at most all but the prompt's last token, and for recurrent state only at a
/// position whose state is known.
fn resume_at(c: &Cached, prompt: &[u32], images: &[(usize, [u8; 32])]) -> Resume {
    let shared = c
        .tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1));
    let shared = image_prefix(c.session.images(), images, shared);
    if !c.session.has_recurrent_state() {
        return Resume::Cut(shared);
    }
    if c.tokens.len() <= shared {
        return Resume::Cut(c.tokens.len());
    }
    match &c.checkpoint {
        Some(cp) if cp.pos > 0 && cp.pos <= shared => Resume::Checkpoint(cp.pos),
        _ => Resume::Cut(0),
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
