//! Attention's two products on one thread, as a long prefill runs them: one task's 16 query
//! vectors (4 rows × a GQA group of 4 heads, head size 128) against `N` cached keys and values
//! in f16, for N = 512, 2,048 and 4,096. Reports GFLOP/s of `attend::scores` (the 16 queries at once) and of `attend::weighted_sums` (the 16 at once), medians of 7 runs; the figure
//! to compare is the core's FMA peak (16 lanes × 2 ports × 2 FLOP per cycle on AVX-512).
//!
//! `cargo bench -p onebit-kernels --bench attend` (`ONEBIT_KERNELS=avx2` for the 8-float path).

use std::time::Instant;

use onebit_kernels::attend;
use onebit_kernels::kv::F16Row;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const D: usize = 128;
const QUERIES: usize = 16;
/// Calls per timed sample.
const REPEAT: usize = 20;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn main() {
    println!("| keys | scores GFLOP/s | weighted sums GFLOP/s |");
    println!("|---|---|---|");
    for n in [512usize, 2048, 4096] {
        let keys: Vec<u16> = values(n * D, 1)
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let vals: Vec<u16> = values(n * D, 2)
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let krows: Vec<F16Row<'_>> = keys.chunks_exact(D).map(F16Row).collect();
        let vrows: Vec<F16Row<'_>> = vals.chunks_exact(D).map(F16Row).collect();
        let q = values(QUERIES * D, 3);
        let queries: Vec<&[f32]> = q.chunks_exact(D).collect();
        let mut sc = vec![0f32; QUERIES * n];
        let w = values(QUERIES * n, 4);
        let weights: Vec<&[f32]> = w.chunks_exact(n).collect();
        let ranges = vec![(0, n - 1); QUERIES];
        let mut outs = vec![0f32; QUERIES * D];
        let flop = 2.0 * (QUERIES * n * D) as f64;
        let (mut ts, mut tw) = (Vec::new(), Vec::new());
        for _ in 0..7 {
            let t0 = Instant::now();
            for _ in 0..REPEAT {
                attend::scores(&queries, &krows, &mut sc);
            }
            ts.push(t0.elapsed().as_secs_f64() / REPEAT as f64);
            let t0 = Instant::now();
            for _ in 0..REPEAT {
                let mut o: Vec<&mut [f32]> = outs.chunks_exact_mut(D).collect();
                attend::weighted_sums(&weights, &ranges, 0, &vrows, &mut o);
            }
            tw.push(t0.elapsed().as_secs_f64() / REPEAT as f64);
        }
        std::hint::black_box((&sc, &outs));
        println!(
            "| {n} | {:.1} | {:.1} |",
            flop / median(ts) / 1e9,
            flop / median(tw) / 1e9
        );
    }
}
