//! The vision encoder's products at Gemma 3 4B's SigLIP shapes (hidden 1152, MLP 4304, 16 heads
//! of 72; 4,096 patches an image), on `ROWS` patches: a projection (`x · Wᵀ`, the MLP's up
//! projection) and one head's attention scores (`Q · Kᵀ`), through `onebit_runtime::sgemm`
//! against the named baseline, the row-by-row dot products the encoder used before (each output
//! a sequential f32 sum), side by side in one process on the same values.
//!
//! `cargo bench -p onebit-runtime --bench vision` prints, per product, each side's median time of
//! `REPS` runs, its GFLOP/s and the ratio. `ONEBIT_BENCH_ROWS` sets the patches (default 512).

use std::time::Instant;

use onebit_runtime::sgemm::{Rows, matmul_t};
use rayon::prelude::*;

const REPS: usize = 5;

/// The encoder's earlier product: each output a sequential sum over one row of each operand.
fn baseline(x: &[f32], w: &[f32], n: usize, out: usize, inp: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; n * out];
    y.par_chunks_mut(out)
        .zip(x.par_chunks(inp))
        .for_each(|(yr, xr)| {
            for (o, yo) in yr.iter_mut().enumerate() {
                let wr = &w[o * inp..(o + 1) * inp];
                *yo = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
            }
        });
    y
}

fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(f: &mut dyn FnMut() -> Vec<f32>) -> (f64, Vec<f32>) {
    let mut last = Vec::new();
    let runs = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            last = f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    (median(runs), last)
}

fn main() {
    let n: usize = std::env::var("ONEBIT_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    println!(
        "vision products, {n} patches, {} threads (baseline: row-by-row sequential dot products)",
        rayon::current_num_threads()
    );
    for (name, out, inp) in [
        ("mlp up 1152->4304", 4304, 1152),
        ("scores 72-dim head", n, 72),
    ] {
        let (x, w) = (values(n * inp, 1), values(out * inp, 2));
        let flops = 2.0 * (n * out * inp) as f64;
        let (tb, yb) = time(&mut || baseline(&x, &w, n, out, inp));
        let (ts, ys) = time(&mut || {
            let mut y = vec![0.0f32; n * out];
            let rows = |data, rows, cols| Rows {
                data,
                rows,
                cols,
                stride: cols,
            };
            matmul_t(rows(&x, n, inp), rows(&w, out, inp), &mut y, out);
            y
        });
        let diff = yb
            .iter()
            .zip(&ys)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
            .fold(0.0f32, f32::max);
        println!(
            "{name:<20} baseline {:>8.1} ms {:>6.1} GFLOP/s | sgemm {:>8.1} ms {:>6.1} GFLOP/s | {:>5.1}x | max rel diff {diff:.1e}",
            tb * 1e3,
            flops / tb / 1e9,
            ts * 1e3,
            flops / ts / 1e9,
            tb / ts
        );
    }
}
