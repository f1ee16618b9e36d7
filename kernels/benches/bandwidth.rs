//! The machine's read bandwidth: a 2 GiB buffer summed as u64 words by 1, 2, … threads (the
//! pool sizes in `ONEBIT_BW_THREADS`, default 1 and all cores), best of five passes each. A
//! decode step reads every weight once, so this divided by a model's bytes per token is its
//! decode ceiling; `scripts/bench-host.sh` prints each side's fraction of it.
//!
//! `cargo bench -p onebit-kernels --bench bandwidth` prints one line per pool size:
//! `read_bandwidth threads=N gb_per_s=X`.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

fn main() {
    let words = (2usize << 30) / 8;
    // Distinct values so no page is shared or zero-filled on read.
    let buf: Vec<u64> = (0..words as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pools: Vec<usize> = match std::env::var("ONEBIT_BW_THREADS") {
        Ok(v) => v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => {
            let mut v = vec![1, all];
            v.dedup();
            v
        }
    };
    for threads in pools {
        let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
            continue;
        };
        let best = pool.install(|| {
            (0..5)
                .map(|_| {
                    let t0 = Instant::now();
                    let s = buf
                        .par_chunks(1 << 14)
                        .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                        .reduce(|| 0, u64::wrapping_add);
                    black_box(s);
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        });
        println!(
            "read_bandwidth threads={threads} gb_per_s={:.2}",
            (words * 8) as f64 / best / 1e9
        );
    }
}
