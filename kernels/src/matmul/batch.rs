//! Products over a batch of tokens: the activations quantized once per call, the row blocks of
//! every matrix spread over rayon's threads, each task writing its own rows of the outputs.

use rayon::prelude::*;

use super::activations::BlockOrder;
use super::{Activations, Codes, KernelPath, QMatrix};

/// Several products of the same activations at once (q/k/v, gate/up): one pass over `x` for
/// the padded copy and group sums, one parallel dispatch over the row blocks of every matrix.
/// Each matrix's arithmetic is exactly that of [`QMatrix::matmul`]. All matrices must share K
/// and the tile width; `ys[i]` is `n × mats[i].rows`.
pub fn matmul_many(
    path: KernelPath,
    mats: &[QMatrix<'_>],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) {
    let Some(first) = mats.first() else {
        return;
    };
    if n == 0 {
        // No rows: nothing to read, nothing to write (a batch may carry no row of a product).
        return;
    }
    assert_eq!(mats.len(), ys.len(), "one output per matrix");
    let (k, kp) = (first.k, first.k_padded());
    for (m, y) in mats.iter().zip(ys.iter()) {
        assert!(m.k == k && m.k_padded() == kp, "matmul_many needs one K");
        assert_eq!(y.len(), n * m.rows, "output size");
    }
    assert_eq!(x.len(), n * k, "activation size");
    let acts = prepare(path, mats, x, n);
    // Tasks: (matrix, first row block, row blocks); see `row_tasks`.
    let mut tasks = Vec::new();
    for (i, m) in mats.iter().enumerate() {
        for (rb0, rb1) in row_tasks(m, 1, n) {
            tasks.push((i, rb0, rb1));
        }
    }
    if n == 1 {
        // One token: a task's rows are one contiguous run of its output, so each task writes
        // there directly (a whole-block scratch only for a last block cut short by `rows`).
        let mut jobs: Vec<(usize, usize, usize, &mut [f32])> = Vec::with_capacity(tasks.len());
        let mut rest: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
        for &(i, rb0, rb1) in &tasks {
            let m = &mats[i];
            let take = (rb1 * m.layout.rows).min(m.rows) - rb0 * m.layout.rows;
            let (head, tail) = std::mem::take(&mut rest[i]).split_at_mut(take);
            rest[i] = tail;
            jobs.push((i, rb0, rb1, head));
        }
        jobs.into_par_iter().for_each(|(i, rb0, rb1, out)| {
            let m = &mats[i];
            let r_tile = m.layout.rows;
            let nrows = (rb1 - rb0) * r_tile;
            out.fill(0.0);
            if out.len() == nrows {
                for rb in rb0..rb1 {
                    m.block(path, rb, &acts, out, nrows, (rb - rb0) * r_tile);
                }
            } else {
                let mut whole = vec![0f32; nrows];
                for rb in rb0..rb1 {
                    m.block(path, rb, &acts, &mut whole, nrows, (rb - rb0) * r_tile);
                }
                let take = out.len();
                out.copy_from_slice(&whole[..take]);
            }
        });
        return;
    }
    // Every task writes its own rows of its matrix's output: disjoint ranges, written through
    // raw pointers so that no two tasks hold a `&mut` to the same slice.
    let dst: Vec<Dest> = ys
        .iter_mut()
        .zip(mats)
        .map(|(y, m)| Dest::new(y, m.rows))
        .collect();
    tasks.into_par_iter().for_each(|(i, rb0, rb1)| {
        let m = &mats[i];
        in_scratch(path, &[m], &acts, (rb0, rb1), n, |out, nrows| {
            let r0 = rb0 * m.layout.rows;
            let take = nrows.min(m.rows - r0);
            for t in 0..n {
                // SAFETY: this task alone writes rows `r0 .. r0+take` of matrix `i` (the tasks'
                // row ranges of one matrix do not overlap), inside its `m.rows`.
                unsafe { dst[i].write(t, r0, &out[t * nrows..][..take]) };
            }
        });
    });
}

/// Row blocks `rb0 .. rb1` of each of `mats` (one row tiling) for all `n` tokens into this
/// thread's scratch, `n × nrows` per matrix one after another (token-major, `nrows` apart),
/// then `finish(scratch, nrows)`.
fn in_scratch(
    path: KernelPath,
    mats: &[&QMatrix<'_>],
    acts: &Activations,
    (rb0, rb1): (usize, usize),
    n: usize,
    finish: impl FnOnce(&mut [f32], usize),
) {
    let r_tile = mats[0].layout.rows;
    let nrows = (rb1 - rb0) * r_tile;
    SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        buf.clear();
        buf.resize(mats.len() * n * nrows, 0.0);
        for (m, part) in mats.iter().zip(buf.chunks_exact_mut(n * nrows)) {
            for rb in rb0..rb1 {
                m.block(path, rb, acts, part, nrows, (rb - rb0) * r_tile);
            }
        }
        finish(&mut buf, nrows);
    });
}

/// The activations of `x` in the forms `path` reads for `mats`.
fn prepare(path: KernelPath, mats: &[QMatrix<'_>], x: &[f32], n: usize) -> Activations {
    let (k, kp) = (mats[0].k, mats[0].k_padded());
    let mut acts = Activations::new(x, n, k, kp);
    if path.has_avx2() && mats.iter().any(|m| m.layout.codes == Codes::Signed8) {
        acts.widen();
    }
    if n >= 16 && mats.iter().any(|m| m.layout.codes != Codes::Signed8) {
        match path {
            KernelPath::Amx => acts.tile_order(BlockOrder::GroupMajor),
            KernelPath::Avx512Vnni => acts.tile_order(BlockOrder::BlockMajor),
            _ => {}
        }
    }
    acts
}

/// Tiles per task for a few tokens: enough rows that a task is worth its dispatch, few enough
/// that two threads get an even share of a decode step's small matrices.
const TASK_BYTES: usize = 64 << 10;

/// Tiles per task for 16 tokens and more: each task copies its rows of every token out of its
/// scratch, and longer runs per token copy faster (a Hunyuan-1.8B `ffn_up` at 128 tokens: 7.5–7.9
/// ms against 8.4–8.6 at 64 KiB, one thread).
const BATCH_TASK_BYTES: usize = 256 << 10;

/// Most bytes of one matrix's rows a task keeps for every token in its thread's scratch (which
/// stays allocated between calls): a long prompt gets tasks of fewer rows.
const SCRATCH_BYTES: usize = 1 << 20;

/// A matrix's row blocks in tasks of [`TASK_BYTES`] or, for `n ≥ 16` tokens,
/// [`BATCH_TASK_BYTES`] of tiles (`share` matrices read per task), and at most
/// [`SCRATCH_BYTES`] of rows per matrix.
fn row_tasks(m: &QMatrix<'_>, share: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    let rbs = m.row_blocks();
    let bytes = if n >= 16 {
        BATCH_TASK_BYTES
    } else {
        TASK_BYTES
    };
    let by_tiles = bytes / (share * m.ct * m.layout.bytes);
    let by_scratch = SCRATCH_BYTES / (n.max(1) * m.layout.rows * 4);
    let per_task = by_tiles.min(by_scratch).clamp(1, 64);
    (0..rbs)
        .step_by(per_task)
        .map(move |rb0| (rb0, (rb0 + per_task).min(rbs)))
}

/// A gated pair of products in one pass: `h[t][r] = f(g, u)` row by row, where `g = gate·x`
/// and `u = up·x` (an FFN's `act(g) ⊙ u`, with `f` writing its result over `g`). Each task
/// computes the same rows of both matrices and gates them while they are in its cache, so the
/// intermediate products never reach memory and the gate needs no pass of its own. `f` must
/// work element by element (the results are then those of both products followed by `f` over
/// whole rows). `None` when the two matrices differ in shape or layout: the caller runs them
/// apart.
pub fn matmul_gated(
    path: KernelPath,
    gate: &QMatrix<'_>,
    up: &QMatrix<'_>,
    x: &[f32],
    n: usize,
    h: &mut [f32],
    f: &(dyn Fn(&mut [f32], &[f32]) + Sync),
) -> Option<()> {
    if (gate.layout, gate.rows, gate.k) != (up.layout, up.rows, up.k) {
        return None;
    }
    assert_eq!(x.len(), n * gate.k, "activation size");
    assert_eq!(h.len(), n * gate.rows, "output size");
    if n == 0 {
        return Some(());
    }
    let acts = prepare(path, &[*gate, *up], x, n);
    let tasks: Vec<(usize, usize)> = row_tasks(gate, 2, n).collect();
    let rows = gate.rows;
    let dst = Dest::new(h, rows);
    tasks.into_par_iter().for_each(|(rb0, rb1)| {
        in_scratch(path, &[gate, up], &acts, (rb0, rb1), n, |buf, nrows| {
            let (g, u) = buf.split_at_mut(n * nrows);
            let r0 = rb0 * gate.layout.rows;
            let take = nrows.min(rows - r0);
            for t in 0..n {
                let row = &mut g[t * nrows..][..take];
                f(row, &u[t * nrows..][..take]);
                // SAFETY: this task alone writes rows `r0 .. r0+take`, inside `rows`.
                unsafe { dst.write(t, r0, row) };
            }
        });
    });
    Some(())
}

/// A matrix's output (`n × rows`) as a raw pointer, shared by the tasks that write its disjoint
/// row ranges.
struct Dest {
    ptr: *mut f32,
    len: usize,
    rows: usize,
}

impl Dest {
    /// `y`, `rows` wide; it stays mutably borrowed by the call for as long as tasks write.
    fn new(y: &mut [f32], rows: usize) -> Dest {
        Dest {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            rows,
        }
    }

    /// `src` into token `t`'s rows from `r0`.
    ///
    /// # Safety
    /// No other task writes those rows of token `t` meanwhile; `r0 + src.len() ≤ rows`.
    unsafe fn write(&self, t: usize, r0: usize, src: &[f32]) {
        let at = t * self.rows + r0;
        assert!(
            r0 + src.len() <= self.rows && at + src.len() <= self.len,
            "inside the output"
        );
        // SAFETY: inside the output (asserted above); the caller owns these elements for now.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) };
    }
}

// SAFETY: tasks write disjoint elements through it while the output is mutably borrowed by the
// call that made it (see `matmul_many`).
unsafe impl Sync for Dest {}

thread_local! {
    /// A task's rows for every token, kept between calls (a fresh buffer per task cost page
    /// faults and a serial copy afterwards).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
