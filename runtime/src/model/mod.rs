//! The host forward pass: a decoder-only transformer driven by [`ModelSpec`] flags, on the pack's
//! own tiles, with a KV cache and batched prefill.
//!
//! ```text
//! mod.rs         Model: the layer loop (forward, forward_batch) and the head
//! load.rs        Model::load, the kernel self-check: from a verified pack to layers
//! mixer.rs       Mixing (the trait every mixer implements), Pass, Layer, the residual
//! attention.rs   attention with its KV cache
//! short_conv.rs  LFM2's gated short convolution
//! delta_net.rs   Qwen3.5's gated DeltaNet
//! ffn.rs         the gated FFN
//! session.rs     Session: KV cache and recurrent state per sequence
//! weight.rs      Weight, tensor binding, the products (tiles through the backend)
//! stats.rs       input statistics for calibration
//! ```
//!
//! Each layer is norm → mixer → residual → norm → FFN → residual; a batch holds rows of several
//! sequences at once, and each row's numbers are exactly those of its sequence run alone.

mod attention;
mod delta_net;
mod ffn;
mod load;
mod mixer;
mod session;
mod short_conv;
mod stats;
mod weight;

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::pack::Pack;
pub use load::{Residency, SELF_CHECK_TOLERANCE, SelfCheck};
use mixer::{Layer, Pass, add_branch};
use onebit_kernels::KernelPath;
use onebit_kernels::kv::{CacheMemory, CacheType, LayerCache};
use onebit_kernels::ops;
use onebit_pack::spec::ModelSpec;
pub use session::{Checkpoint, Session};
use stats::Collecting;
pub use stats::{ActStats, InputStats};
use weight::Weight;

/// A loaded model: the pack, its bound weights and the kernel path.
pub struct Model {
    /// The pack.
    pub pack: Pack,
    /// The model description.
    pub spec: ModelSpec,
    path: KernelPath,
    backend: Arc<dyn Backend>,
    embed: std::ops::Range<usize>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Weight,
    /// The exact head when the stored head is tiles of a tied embedding (see [`onebit_kernels::head`]).
    exact_head: Option<f32>,
    /// Candidates per token re-scored against the exact head (0 = none).
    rescore: usize,
    stats: std::sync::Mutex<Option<Collecting>>,
    /// The element type of every session's KV cache.
    cache_type: CacheType,
    /// What every session's KV cache holds, against its budget.
    cache_memory: Arc<CacheMemory>,
    /// The served vision tower, when the pack has one: images in prompts.
    images: Option<crate::image_input::ImageEncoder>,
}

/// Rows in a batch from which the element-wise steps (RoPE, the gate activation) run in parallel:
/// below it the hand-over costs more than the work.
const PARALLEL_ROWS: usize = 4;

/// Candidates per token that [`Model::load`] re-scores against the exact head by default. On
/// Gemma 3 270M's 4-bit pack top-1 agreement is the same from 8 candidates up and perplexity keeps
/// improving to 128 (23.26 at 8, 22.88 at 128); the 2-bit scan head's worst rank of the exact
/// choice on the essay is 105 (docs/runtime.md).
pub const DEFAULT_HEAD_RESCORE: usize = 128;

/// Rows per forward batch of a long prompt in [`Model::forward`]. The weights are read once per
/// batch, so larger is cheaper for them; past a few hundred rows that saving is small, while
/// every per-batch buffer (the FFN's activations are rows × FFN width floats) grows with it, and
/// buffers of tens of MB come fresh from the kernel, zeroed, for every layer. 512 is llama.cpp's
/// default physical batch as well.
pub const PREFILL_ROWS: usize = 512;

impl Model {
    /// The image side of the model: its served vision tower's encoder, or `None` for a model that
    /// takes text only (no tower, or one the pack does not serve: `manifest.json` says why).
    pub fn images(&self) -> Option<&crate::image_input::ImageEncoder> {
        self.images.as_ref()
    }

    /// [`Model::images`], or the refusal a request with images gets from a model that takes text
    /// only, naming why (the pack's reason its tower is not served, or that it has none).
    pub fn image_encoder(&self) -> Result<&crate::image_input::ImageEncoder> {
        self.images.as_ref().ok_or_else(|| {
            let why = self
                .pack
                .manifest
                .towers
                .iter()
                .find_map(|t| t.not_served.clone())
                .unwrap_or_else(|| "its pack has no vision tower".into());
            Error::Request {
                field: "image",
                reason: format!("this model takes text only: {why}"),
            }
        })
    }

    /// Re-scores the `k` best candidates of each token's tiled head against the exact head (the
    /// bf16 embedding of a tied model; see [`onebit_kernels::head`]); 0 turns it off. Returns the count in
    /// effect: 0 when the head is not tiles of a tied embedding, where nothing is approximate or
    /// nothing exact is in the pack.
    pub fn set_head_rescore(&mut self, k: usize) -> usize {
        self.rescore = if self.exact_head.is_some() {
            k.min(self.spec.vocab)
        } else {
            0
        };
        self.rescore
    }

    /// Candidates per token re-scored against the exact head (0 = none).
    pub fn head_rescore(&self) -> usize {
        self.rescore
    }

    /// The host kernel path in use (embedding-sized bf16 products and the self-check).
    pub fn kernel_path(&self) -> KernelPath {
        self.path
    }

    /// Runs the tiled products on `backend` from now on (the NPU backend, or its emulation).
    pub fn set_backend(&mut self, backend: Arc<dyn Backend>) {
        self.backend = backend;
    }

    /// The backend running the tiled products.
    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    /// `requested` as a session's context, checked: at least 2 tokens (a prompt token and a
    /// generated one), at most the model's context, and a KV cache whose size fits the address
    /// space. Every refusal names `ctx-size` and both numbers.
    pub fn checked_context(&self, requested: usize) -> Result<usize> {
        let refuse = |reason: String| Error::Request {
            field: "ctx-size",
            reason,
        };
        if requested < 2 {
            return Err(refuse(format!(
                "{requested} tokens leave no room for a prompt token and an answer (at least 2)"
            )));
        }
        if requested > self.spec.context {
            return Err(refuse(format!(
                "{requested} tokens exceed the model's {}-token context",
                self.spec.context
            )));
        }
        let per_token: usize = self
            .layers
            .iter()
            .map(|l| 2 * self.cache_type.bytes(l.mixing.kv_rows()))
            .sum();
        per_token
            .checked_mul(requested)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                refuse(format!(
                    "a {requested}-token KV cache does not fit in memory"
                ))
            })?;
        Ok(requested)
    }

    /// Bytes of KV cache and recurrent state a session holds once `capacity` positions are
    /// filled (its cache grows to this as tokens arrive).
    pub fn session_bytes(&self, capacity: usize) -> usize {
        self.layers
            .iter()
            .map(|l| {
                let m = &l.mixing;
                2 * self.cache_type.bytes(capacity * m.kv_rows())
                    + 4 * (m.conv_state() + m.ssm_state())
            })
            .sum()
    }

    /// Sets the KV cache's element type for sessions made from now on; refuses, naming
    /// `cache-type`, a type the model's heads cannot be held in.
    pub fn set_cache_type(&mut self, ty: CacheType) -> Result<()> {
        if let Some(reason) = ty.refusal(self.spec.head_dim) {
            return Err(Error::Request {
                field: "cache-type",
                reason,
            });
        }
        self.cache_type = ty;
        Ok(())
    }

    /// The KV cache's element type.
    pub fn cache_type(&self) -> CacheType {
        self.cache_type
    }

    /// Counts every session's KV cache, made from now on, in `memory` (and holds them to its
    /// budget).
    pub fn set_cache_memory(&mut self, memory: Arc<CacheMemory>) {
        self.cache_memory = memory;
    }

    /// What the sessions' KV caches hold now, at most, and may hold.
    pub fn cache_memory(&self) -> &Arc<CacheMemory> {
        &self.cache_memory
    }

    /// A fresh sequence with room for `capacity` tokens. Its KV cache holds no memory until
    /// tokens arrive: it grows in blocks as the forward pass writes them.
    pub fn session(&self, capacity: usize) -> Session {
        Session {
            pos: 0,
            capacity,
            kv: self
                .layers
                .iter()
                .map(|l| {
                    let w = l.mixing.kv_rows();
                    LayerCache::new(self.cache_type, w, capacity, self.cache_memory.clone())
                })
                .collect(),
            conv: self
                .layers
                .iter()
                .map(|l| vec![0f32; l.mixing.conv_state()])
                .collect(),
            ssm: self
                .layers
                .iter()
                .map(|l| vec![0f32; l.mixing.ssm_state()])
                .collect(),
            reads_top: 0,
            allowed: None,
            images: Vec::new(),
        }
    }

    /// Runs `tokens` at positions `s.pos..`, appending to the cache. Returns the logits of every
    /// token (`all`) or of the last one, row-major `[tokens][vocab]`. A long prompt goes through
    /// in batches of [`PREFILL_ROWS`] rows, each row's numbers the same as in one batch.
    pub fn forward(&self, s: &mut Session, tokens: &[u32], all: bool) -> Result<Vec<f32>> {
        let n = tokens.len();
        let mut logits = Vec::new();
        let mut done = 0;
        while done < n {
            // A pass ends where it splits no image placed in the session.
            let end = s.pass_end(s.pos, s.pos + (n - done).min(PREFILL_ROWS)) - s.pos;
            let chunk = &tokens[done..done + end.min(n - done)];
            let rows: Vec<(usize, u32)> = chunk.iter().map(|&t| (0, t)).collect();
            done += chunk.len();
            let want: Vec<usize> = match (all, done == n) {
                (true, _) => (0..chunk.len()).collect(),
                (false, true) => vec![chunk.len() - 1],
                (false, false) => Vec::new(),
            };
            logits.extend(self.forward_batch(&mut [&mut *s], &rows, &want)?);
        }
        Ok(logits)
    }

    /// Runs one batch of rows from several sequences at once: row `(i, token)` appends `token`
    /// to `sessions[i]` at its next position (rows of one sequence in order). Every matrix is read
    /// once for the whole batch, so decoding many sequences together costs little more than one
    /// (continuous batching), and a prompt chunk can ride along with other sequences' decode rows.
    /// Returns the logits of the rows in `want`, row-major `[want][vocab]`; each row's numbers are
    /// exactly what a single-sequence [`Model::forward`] gives it.
    pub fn forward_batch(
        &self,
        sessions: &mut [&mut Session],
        rows: &[(usize, u32)],
        want: &[usize],
    ) -> Result<Vec<f32>> {
        self.forward_batch_with(sessions, rows, want, &[])
            .map(|(logits, _)| logits)
    }

    /// [`Model::forward_batch`], also returning the final hidden states (after the last norm,
    /// what the head reads) of the rows in `hidden`, row-major `[hidden][hidden size]`: an
    /// embedding request's rows ride in the batch with everybody else's.
    pub fn forward_batch_with(
        &self,
        sessions: &mut [&mut Session],
        rows: &[(usize, u32)],
        want: &[usize],
        hidden: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        if rayon::current_thread_index().is_some() {
            return self.forward_batch_here(sessions, rows, want, hidden);
        }
        // Run the whole pass on a worker of the pool: the ~4 parallel products per layer then
        // start there instead of each handing work over from this thread and waking it again.
        let mut out = None;
        rayon::scope(|s| {
            s.spawn(|_| out = Some(self.forward_batch_here(sessions, rows, want, hidden)))
        });
        out.unwrap_or_else(|| Err(Error::Internal("the forward pass did not run".into())))
    }

    fn forward_batch_here(
        &self,
        sessions: &mut [&mut Session],
        rows: &[(usize, u32)],
        want: &[usize],
        hidden: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let sp = &self.spec;
        let n = rows.len();
        if n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        // Each row's sequence and position; refuse before touching any cache.
        let mut next: Vec<usize> = sessions.iter().map(|s| s.pos).collect();
        let mut seq_pos = Vec::with_capacity(n);
        for &(i, _) in rows {
            let p = next.get_mut(i).ok_or_else(|| Error::Request {
                field: "batch",
                reason: format!("row names sequence {i} of {}", sessions.len()),
            })?;
            seq_pos.push((i, *p));
            *p += 1;
        }
        for (s, &end) in sessions.iter().zip(&next) {
            if end > s.capacity {
                return Err(Error::Request {
                    field: "context",
                    reason: format!(
                        "{} tokens in context plus {} new exceed the {}-token context",
                        s.pos,
                        end - s.pos,
                        s.capacity
                    ),
                });
            }
        }
        if let Some(&w) = want.iter().chain(hidden).find(|&&w| w >= n) {
            return Err(Error::Request {
                field: "batch",
                reason: format!("logits asked for row {w} of {n}"),
            });
        }
        for (s, &end) in sessions.iter_mut().zip(&next) {
            s.grow(end)?;
        }
        let ends = image_ends(sessions, &seq_pos, &next)?;
        let x = self.embed_rows(sessions, rows, &seq_pos)?;
        let h = sp.hidden;
        let mut x = x;
        let mut hbuf = vec![0f32; n * h];
        let mut o = vec![0f32; n * h];
        let mut ffn = ffn::Scratch::new(n, sp.ffn);
        let mut pass = Pass::new(sessions, seq_pos, ends, sp.ropes.len());
        for (li, l) in self.layers.iter().enumerate() {
            ops::rmsnorm(&x, &l.attn_norm, sp.eps, &mut hbuf);
            l.mixing.forward(self, li, &hbuf, &mut pass, &mut o)?;
            add_branch(&mut x, &mut o, l.post_attn_norm.as_deref(), sp.eps);
            ops::rmsnorm(&x, &l.ffn_norm, sp.eps, &mut hbuf);
            l.ffn.forward(self, li, &hbuf, n, &mut ffn, &mut o)?;
            add_branch(&mut x, &mut o, l.post_ffn_norm.as_deref(), sp.eps);
        }
        pass.commit();
        for (s, &end) in sessions.iter_mut().zip(&next) {
            s.pos = end;
        }
        let mut states = Vec::with_capacity(hidden.len() * h);
        for &t in hidden {
            states.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        ops::rmsnorm_inplace(&mut states, &self.norm, sp.eps);
        if want.is_empty() {
            // A prompt chunk that needs no logits (its prompt goes on in a later pass): the
            // caches and states above are all it produces.
            return Ok((Vec::new(), states));
        }
        let mut xs = Vec::with_capacity(want.len() * h);
        for &t in want {
            xs.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        ops::rmsnorm_inplace(&mut xs, &self.norm, sp.eps);
        if self.recording() {
            // Collecting statistics needs the head's inputs, not its outputs: skip the product.
            self.record(&["lm_head.weight".to_string()], &xs, want.len());
            return Ok((Vec::new(), states));
        }
        let reads: Vec<usize> = want
            .iter()
            .map(|&w| sessions[rows[w].0].reads_top)
            .collect();
        let allowed: Vec<Option<&[u32]>> = want
            .iter()
            .map(|&w| sessions[rows[w].0].allowed.as_deref())
            .collect();
        Ok((self.head_logits(&reads, &allowed, &xs)?, states))
    }

    /// The pass's input rows, `[rows][hidden]`: each token's embedding row (scaled as the family
    /// scales it), or, at a position an image is placed over, the image's embedding row as the
    /// tower made it.
    fn embed_rows(
        &self,
        sessions: &[&mut Session],
        rows: &[(usize, u32)],
        seq_pos: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let sp = &self.spec;
        let h = sp.hidden;
        let mut row = vec![0u8; h * 2];
        let mut x = vec![0f32; rows.len() * h];
        for (t, (&(_, tok), &(i, p))) in rows.iter().zip(seq_pos).enumerate() {
            let out = &mut x[t * h..(t + 1) * h];
            if let Some((start, image)) = sessions[i].image_at(p) {
                if image.values.len() != image.tokens * h {
                    return Err(Error::Request {
                        field: "image",
                        reason: format!(
                            "{} image values for {} tokens of a {h}-wide model",
                            image.values.len(),
                            image.tokens
                        ),
                    });
                }
                out.copy_from_slice(&image.values[(p - start) * h..(p - start + 1) * h]);
                continue;
            }
            let id = tok as usize;
            if id >= sp.vocab {
                return Err(Error::Request {
                    field: "tokens",
                    reason: format!("token id {id} is outside the {}-token vocabulary", sp.vocab),
                });
            }
            self.embedding_row(id, &mut row);
            for (j, c) in row.chunks_exact(2).enumerate() {
                out[j] = half::bf16::from_le_bytes([c[0], c[1]]).to_f32() * sp.embed_scale;
            }
        }
        Ok(x)
    }

    /// Row `r` of the bf16 embedding into `out` (`2 × hidden` bytes), read from the file where
    /// it is not in the resident copy ([`Pack::read_into`]).
    fn embedding_row(&self, r: usize, out: &mut [u8]) {
        let w = 2 * self.spec.hidden;
        let at = self.embed.start + r * w;
        self.pack.read_into(at..at + w, out);
    }

    /// The head's logits for `reads.len()` final hidden states `xs`, row-major `[row][vocab]`.
    /// Each row is ranked by what its own reader needs: a reader that only uses the `reads[i]`
    /// best candidates (at most the re-scored count) gets the scan head's ranking with exact
    /// candidates, every other row the full head. The rows of each kind run as one product, and
    /// a row's numbers never depend on the other rows of the batch.
    /// A row ranked by the scan head with `allowed` tokens (a grammar's mask) ranks only those,
    /// so its re-scored candidates are allowed ones; other rows are masked by their sampler.
    fn head_logits(
        &self,
        reads: &[usize],
        allowed: &[Option<&[u32]>],
        xs: &[f32],
    ) -> Result<Vec<f32>> {
        let (h, vocab) = (self.spec.hidden, self.spec.vocab);
        let n = reads.len();
        let mut logits = vec![0f32; n * vocab];
        let scan = self.pack.head_scan();
        let by_scan: Vec<bool> = reads
            .iter()
            .map(|&k| scan.is_some() && k > 0 && k <= self.rescore)
            .collect();
        for kind in [true, false] {
            let idx: Vec<usize> = (0..n).filter(|&i| by_scan[i] == kind).collect();
            if idx.is_empty() {
                continue;
            }
            // The common case, every row of one kind, runs in place; a mix gathers each kind.
            let whole = idx.len() == n;
            let gathered: Vec<f32>;
            let gx = if whole {
                xs
            } else {
                gathered = idx
                    .iter()
                    .flat_map(|&i| &xs[i * h..(i + 1) * h])
                    .copied()
                    .collect();
                &gathered[..]
            };
            let mut part = if whole {
                std::mem::take(&mut logits)
            } else {
                vec![0f32; idx.len() * vocab]
            };
            match scan.filter(|_| kind) {
                Some(scan) => scan.matmul(self.path, gx, idx.len(), &mut part),
                None => self.matmul(&self.head, gx, idx.len(), &mut part)?,
            }
            for (j, &i) in idx.iter().enumerate().filter(|_| kind) {
                if let Some(a) = allowed[i] {
                    onebit_kernels::head::forbid_outside(a, &mut part[j * vocab..(j + 1) * vocab]);
                }
            }
            if let (Some(scale), k) = (self.exact_head, self.rescore) {
                let read = |r: usize, out: &mut [u8]| self.embedding_row(r, out);
                let exact = onebit_kernels::head::ExactHead {
                    rows: &read,
                    k: h,
                    scale,
                };
                onebit_kernels::head::rescore(&mut part, gx, idx.len(), exact, k, kind);
            }
            if whole {
                logits = part;
            } else {
                for (j, &i) in idx.iter().enumerate() {
                    logits[i * vocab..(i + 1) * vocab]
                        .copy_from_slice(&part[j * vocab..(j + 1) * vocab]);
                }
            }
        }
        if let Some(cap) = self.spec.final_softcap {
            for v in logits.iter_mut() {
                *v = cap * (*v / cap).tanh();
            }
        }
        Ok(logits)
    }
}

/// Per row, the last position its attention reads: its own (causal), or the last of the image
/// it belongs to (an image's rows attend to each other both ways). Refuses a pass that holds
/// only part of an image: its rows would attend to positions not yet (or no longer) written.
/// `next[i]` is where sequence `i`'s rows of this pass end.
fn image_ends(
    sessions: &[&mut Session],
    seq_pos: &[(usize, usize)],
    next: &[usize],
) -> Result<Vec<usize>> {
    seq_pos
        .iter()
        .map(|&(i, p)| {
            let s = &sessions[i];
            let Some((start, image)) = s.image_at(p) else {
                return Ok(p);
            };
            let end = start + image.tokens;
            if start < s.pos || end > next[i] {
                return Err(Error::Request {
                    field: "image",
                    reason: format!(
                        "an image's {} tokens (positions {start}..{end}) must go through the \
                         model in one pass; this one holds positions {}..{}",
                        image.tokens, s.pos, next[i]
                    ),
                });
            }
            Ok(end - 1)
        })
        .collect()
}
