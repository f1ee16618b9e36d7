//! Attention with its KV cache: q/k/v projections (with biases, q/k norms before or after RoPE,
//! a gated output where the model has one), this pass's keys and values written into each
//! sequence's cache, causal attention over the cache (a sliding window where the layer has one,
//! GQA groups read together), and the output projection.

use rayon::prelude::*;

use super::mixer::{Mixing, Pass};
use super::weight::{Binder, Weight};
use super::{Model, PARALLEL_ROWS};
use crate::error::Result;
use onebit_kernels::attend;
use onebit_kernels::kv::{LayerCache, ReadRows, Row};
use onebit_kernels::ops;
use onebit_pack::spec::{ModelSpec, QkNorm};

/// The attention weights of one layer.
pub(super) struct Attention {
    q: Weight,
    k: Weight,
    v: Weight,
    o: Weight,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// Floats per token of the KV cache (K and V each).
    kv_rows: usize,
}

impl Attention {
    /// Binds layer `i`'s `self_attn.*` tensors.
    pub fn load(b: &Binder<'_>, i: usize, spec: &ModelSpec) -> Result<Attention> {
        let n = |s: &str| format!("model.layers.{i}.self_attn.{s}");
        let (h, qr, kvr) = (spec.hidden, spec.q_rows(), spec.kv_rows());
        let add1 = spec.norm_add_one;
        let qk = spec.qk_norm != QkNorm::Off;
        let q_rows = if spec.attn_output_gate { 2 * qr } else { qr };
        Ok(Attention {
            q: b.weight(&n("q_proj.weight"), q_rows, h)?,
            k: b.weight(&n("k_proj.weight"), kvr, h)?,
            v: b.weight(&n("v_proj.weight"), kvr, h)?,
            o: b.weight(&n("o_proj.weight"), h, qr)?,
            q_bias: b.opt_vector(&n("q_proj.bias"), false)?,
            k_bias: b.opt_vector(&n("k_proj.bias"), false)?,
            v_bias: b.opt_vector(&n("v_proj.bias"), false)?,
            q_norm: if qk {
                Some(b.vector(&n("q_norm.weight"), add1)?)
            } else {
                None
            },
            k_norm: if qk {
                Some(b.vector(&n("k_norm.weight"), add1)?)
            } else {
                None
            },
            kv_rows: kvr,
        })
    }
}

/// Query vectors per attention task in a prefill: the rows of a task times the heads of a KV
/// group come to about this many, each key and value read once for all of them. Tasks go
/// out KV head by KV head, so a thread's consecutive tasks read the same head's keys and values
/// (from its L2, not from memory). 4,096-token prefill, 2 threads, AVX-512 path, one run each:
/// 16 → 32 → 64 → 128 query vectors gave Qwen3-1.7B 94.1 / 99.7 / 100.7 / 101.1 tok/s and the
/// Hunyuan-1.8B shape 87.6 / 88.1 / 97.0 / 94.5 (16 with the tasks row block by row block, as
/// before: 89.8 and 85.7).
const TASK_QUERIES: usize = 64;

/// One task's queries (rows of one sequence × heads of one KV group), their causal ranges, and
/// where their outputs go: the softmax-weighted sums over the cached keys and values of
/// positions `first..`, read in the cache's own type.
struct Block<'a, 'o> {
    queries: &'a [&'a [f32]],
    ranges: &'a [(usize, usize)],
    first: usize,
    scale: f32,
    softcap: Option<f32>,
    outs: &'a mut [&'o mut [f32]],
}

impl ReadRows for Block<'_, '_> {
    fn rows<R: Row>(self, keys: &[R], values: &[R]) {
        let len = self.queries.len() * keys.len();
        SCORES.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            self.attend(keys, values, &mut buf[..len]);
            if buf.len() > SCORE_FLOATS {
                // Kept between tasks up to the size tasks are cut to; a larger one (a few rows
                // at a long context) goes back.
                *buf = Vec::new();
            }
        });
    }
}

/// Floats of one task's scores (queries × keys) that tasks are cut to where they can be: 1 MiB,
/// 64 query vectors × 4,096 keys.
const SCORE_FLOATS: usize = 1 << 18;

thread_local! {
    /// A task's scores, kept between tasks: a fresh buffer per task (up to [`SCORE_FLOATS`])
    /// cost an allocation and its zeroing each time; every element is written by
    /// `attend::scores` before it is read.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Block<'_, '_> {
    /// Scores, softmax and weighted sums with `sc` (queries × keys) as the scores' room.
    fn attend<R: Row>(self, keys: &[R], values: &[R], sc: &mut [f32]) {
        let (first, span) = (self.first, keys.len());
        attend::scores(self.queries, keys, sc);
        for (row, &(lo, p)) in sc.chunks_exact_mut(span).zip(self.ranges) {
            let own = &mut row[lo - first..=p - first];
            for s in own.iter_mut() {
                *s *= self.scale;
                if let Some(cap) = self.softcap {
                    *s = cap * (*s / cap).tanh();
                }
            }
            ops::softmax(own);
        }
        let weights: Vec<&[f32]> = sc.chunks_exact(span).collect();
        attend::weighted_sums(&weights, self.ranges, first, values, self.outs);
    }
}

/// A pass's projections, row-major: queries, keys, values, and the output gates (empty without a
/// gated output).
struct Projected {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
}

impl Attention {
    /// q, k and v of every row (with their biases) and, with a gated output, the gates: q_proj's
    /// rows are all q, then all gates (the pack's stacked order).
    fn project(&self, m: &Model, hbuf: &[f32], n: usize) -> Result<Projected> {
        let sp = &m.spec;
        let (qr, kvr) = (sp.q_rows(), sp.kv_rows());
        let (mut q, mut k, mut v) = (vec![0f32; n * qr], vec![0f32; n * kvr], vec![0f32; n * kvr]);
        let mut gate = Vec::new();
        if sp.attn_output_gate {
            let mut qg = vec![0f32; n * 2 * qr];
            m.matmul_many(
                &[&self.q, &self.k, &self.v],
                hbuf,
                n,
                &mut [&mut qg[..], &mut k[..], &mut v[..]],
            )?;
            gate.resize(n * qr, 0.0);
            for ((row, qt), gt) in qg
                .chunks_exact(2 * qr)
                .zip(q.chunks_exact_mut(qr))
                .zip(gate.chunks_exact_mut(qr))
            {
                qt.copy_from_slice(&row[..qr]);
                gt.copy_from_slice(&row[qr..]);
            }
        } else {
            m.matmul_many(
                &[&self.q, &self.k, &self.v],
                hbuf,
                n,
                &mut [&mut q[..], &mut k[..], &mut v[..]],
            )?;
        }
        for (buf, bias) in [
            (&mut q, &self.q_bias),
            (&mut k, &self.k_bias),
            (&mut v, &self.v_bias),
        ] {
            if let Some(b) = bias {
                for row in buf.chunks_exact_mut(b.len()) {
                    for (a, &bb) in row.iter_mut().zip(b) {
                        *a += bb;
                    }
                }
            }
        }
        Ok(Projected { q, k, v, gate })
    }

    /// RoPE on the rows' queries and keys, with their q/k norms before or after it.
    fn position(
        &self,
        sp: &ModelSpec,
        li: usize,
        pass: &mut Pass<'_, '_>,
        q: &mut [f32],
        k: &mut [f32],
    ) {
        let ls = &sp.layers[li];
        let (d, qr, kvr) = (sp.head_dim, sp.q_rows(), sp.kv_rows());
        let rope = &sp.ropes[ls.rope];
        let norm_heads = |buf: &mut [f32], w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                ops::rmsnorm_inplace(buf, w, sp.eps);
            }
        };
        if sp.qk_norm == QkNorm::BeforeRope {
            norm_heads(q, &self.q_norm);
            norm_heads(k, &self.k_norm);
        }
        let seq_pos = &pass.seq_pos;
        let angles = pass.angles[ls.rope].get_or_insert_with(|| {
            seq_pos
                .iter()
                .map(|&(_, p)| ops::rope_angles(p, &rope.inv_freq, rope.attention_factor))
                .collect()
        });
        let rotate = |((qt, kt), a): ((&mut [f32], &mut [f32]), &ops::RopeAngles)| {
            for head in qt.chunks_exact_mut(d).chain(kt.chunks_exact_mut(d)) {
                a.rotate(head);
            }
        };
        if seq_pos.len() >= PARALLEL_ROWS {
            q.par_chunks_exact_mut(qr)
                .zip(k.par_chunks_exact_mut(kvr))
                .zip(angles.par_iter())
                .for_each(rotate);
        } else {
            q.chunks_exact_mut(qr)
                .zip(k.chunks_exact_mut(kvr))
                .zip(angles.iter())
                .for_each(rotate);
        }
        if sp.qk_norm == QkNorm::AfterRope {
            norm_heads(q, &self.q_norm);
            norm_heads(k, &self.k_norm);
        }
    }
}

/// Runs, rows by rows, of consecutive positions of one sequence, at most `rows` long: the row
/// blocks of the attention tasks.
fn row_blocks(seq_pos: &[(usize, usize)], rows: usize) -> Vec<(usize, usize)> {
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    for t in 0..seq_pos.len() {
        match blocks.last_mut() {
            Some((t0, t1))
                if *t1 == t
                    && t - *t0 < rows
                    && seq_pos[t].0 == seq_pos[t - 1].0
                    && seq_pos[t].1 == seq_pos[t - 1].1 + 1 =>
            {
                *t1 = t + 1
            }
            _ => blocks.push((t, t + 1)),
        }
    }
    blocks
}

/// Causal attention of every row's queries `q` over its sequence's cache of layer `li`, into
/// `att` (rows × heads × head_dim); a row reads keys up to `ends[row]` (past its own position
/// inside an image).
///
/// Tasks: up to `rows` consecutive rows of one sequence × one KV head × some heads of its
/// group, KV head by KV head. The keys and values of the block are read once for all its query
/// vectors ([`Block`]): about 64 of them, so 16 rows of a group of 4 heads and 32 of a group of
/// 2; with fewer tasks than threads (decode of one sequence) the group's heads split across
/// tasks. A query's arithmetic is the same in any task shape.
fn attend_rows(
    sp: &ModelSpec,
    li: usize,
    seq_pos: &[(usize, usize)],
    ends: &[usize],
    caches: &[&LayerCache],
    q: &[f32],
    att: &mut [f32],
) {
    let ls = &sp.layers[li];
    let (d, nh, nkv, qr) = (sp.head_dim, sp.heads, sp.kv_heads, sp.q_rows());
    let group = (nh / nkv.max(1)).max(1);
    // At long contexts fewer rows, so that a task's scores stay within SCORE_FLOATS.
    let span = seq_pos.iter().map(|&(_, p)| p + 1).max().unwrap_or(1);
    let span = ls.window.map_or(span, |w| span.min(w + TASK_QUERIES));
    let rows = (TASK_QUERIES / group)
        .min(SCORE_FLOATS / (group * span))
        .clamp(4, TASK_QUERIES);
    let blocks = row_blocks(seq_pos, rows);
    let base = blocks.len() * nkv.max(1);
    let split = rayon::current_num_threads().div_ceil(base).clamp(1, group);
    let per_task = group.div_ceil(split);
    let mut slots: Vec<Option<&mut [f32]>> = att.chunks_mut(d).map(Some).collect();
    let mut tasks = Vec::new();
    for kvh in 0..nkv.max(1) {
        for &(t0, t1) in &blocks {
            for h_lo in (kvh * group..(kvh + 1) * group).step_by(per_task) {
                let h_hi = (h_lo + per_task).min((kvh + 1) * group);
                let outs: Vec<&mut [f32]> = (t0..t1)
                    .flat_map(|t| (h_lo..h_hi).map(move |h| t * nh + h))
                    .filter_map(|at| slots[at].take())
                    .collect();
                tasks.push((t0, t1, kvh, h_lo, h_hi, outs));
            }
        }
    }
    tasks
        .into_par_iter()
        .for_each(|(t0, t1, kvh, h_lo, h_hi, mut outs)| {
            let (i, _) = seq_pos[t0];
            let mut queries: Vec<&[f32]> = Vec::new();
            let mut ranges: Vec<(usize, usize)> = Vec::new();
            for (t, &(_, p)) in seq_pos.iter().enumerate().take(t1).skip(t0) {
                // The window bounds the keys before a row, not its image's rows after it
                // (Gemma 3: AND(window, OR(causal, same image))).
                let lo = ls.window.map(|w| (p + 1).saturating_sub(w)).unwrap_or(0);
                for hh in h_lo..h_hi {
                    queries.push(&q[t * qr + hh * d..][..d]);
                    ranges.push((lo, ends[t]));
                }
            }
            let first = ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let last = ranges.iter().map(|r| r.1).max().unwrap_or(0);
            let block = Block {
                queries: &queries,
                ranges: &ranges,
                first,
                scale: sp.attn_scale,
                softcap: sp.attn_softcap,
                outs: &mut outs,
            };
            caches[i].read(first, last, kvh * d, d, block);
        });
}

impl Mixing for Attention {
    fn forward(
        &self,
        m: &Model,
        li: usize,
        hbuf: &[f32],
        pass: &mut Pass<'_, '_>,
        out: &mut [f32],
    ) -> Result<()> {
        let sp = &m.spec;
        let n = pass.rows();
        let (qr, kvr) = (sp.q_rows(), sp.kv_rows());
        let lname = |s: &str| format!("model.layers.{li}.self_attn.{s}");
        let rec = m.recording();
        if rec {
            m.record(
                &[
                    lname("q_proj.weight"),
                    lname("k_proj.weight"),
                    lname("v_proj.weight"),
                ],
                hbuf,
                n,
            );
        }
        let Projected {
            mut q,
            mut k,
            v,
            gate,
        } = self.project(m, hbuf, n)?;
        self.position(sp, li, pass, &mut q, &mut k);
        for (t, &(i, p)) in pass.seq_pos.iter().enumerate() {
            let s = &mut pass.sessions[i];
            s.kv[li].write(p, &k[t * kvr..(t + 1) * kvr], &v[t * kvr..(t + 1) * kvr]);
        }
        let caches: Vec<&LayerCache> = pass.sessions.iter().map(|s| &s.kv[li]).collect();
        let mut att = vec![0f32; n * qr];
        attend_rows(sp, li, &pass.seq_pos, &pass.ends, &caches, &q, &mut att);
        if sp.attn_output_gate {
            for (a, &g) in att.iter_mut().zip(gate.iter()) {
                *a *= ops::sigmoid(g);
            }
        }
        if rec {
            m.record(&[lname("o_proj.weight")], &att, n);
        }
        m.matmul(&self.o, &att, n, out)
    }

    fn weights(&self) -> Vec<&Weight> {
        vec![&self.q, &self.k, &self.v, &self.o]
    }

    fn kv_rows(&self) -> usize {
        self.kv_rows
    }
}
