//! Dequant throughput per tile kind, in GB/s of tile bytes, side by side with the ceiling: a plain
//! memcpy of the same bytes. `rows` is the row-major reference decoder, `cols` the column-major
//! fast path, on one core (1c) and on all cores (all).
//!
//! Run: `cargo bench -p onebit-stages --bench tiles` (`ONEBIT_BENCH_MIB` sets the tile bytes per
//! kind, default 64).

use std::time::{Duration, Instant};

use onebit_stages::format::tiles::{ALL_KINDS, TileCodec, TileKind};
use rayon::prelude::*;

/// Deterministic tiles with finite scales, so the timing covers real arithmetic.
fn tiles(kind: TileKind, bytes: usize) -> Vec<u8> {
    let w = kind.bytes();
    let n = bytes / w;
    let mut v = vec![0u8; n * w];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 32) as u8;
    }
    for t in v.chunks_exact_mut(w) {
        // bf16 scale planes at the front: moderate positive values (Q4K/MXFP4 bytes are u8 anyway).
        for s in 0..256.min(w / 2) {
            t[2 * s] = (s % 127) as u8;
            t[2 * s + 1] = 0x3C;
        }
    }
    v
}

fn best(mut f: impl FnMut() -> Duration) -> Duration {
    (0..5).map(|_| f()).min().unwrap_or_default()
}

fn main() {
    let mib: usize = std::env::var("ONEBIT_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let threads = rayon::current_num_threads();
    println!(
        "tiles: {mib} MiB of tile bytes per kind; GB/s of tile bytes; {threads} threads for 'all'"
    );
    println!(
        "{:<11} {:>8} {:>10} {:>10} {:>10} {:>11} {:>11}",
        "kind", "memcpy", "rows 1c", "cols 1c", "cols all", "cols 1c/mc", "cols all/mc"
    );
    for kind in ALL_KINDS {
        let data = tiles(kind, mib << 20);
        let w = kind.bytes();
        let gb = data.len() as f64 / 1e9;
        let mut dst = vec![0u8; w];
        let memcpy = best(|| {
            let t = Instant::now();
            for tile in data.chunks_exact(w) {
                dst.copy_from_slice(tile);
                std::hint::black_box(&dst);
            }
            t.elapsed()
        });
        let mut out = vec![0f32; kind.rows() * kind.cols()];
        let one = best(|| {
            let t = Instant::now();
            for tile in data.chunks_exact(w) {
                kind.decode(tile, &mut out);
                std::hint::black_box(&out);
            }
            t.elapsed()
        });
        let cols = best(|| {
            let t = Instant::now();
            for tile in data.chunks_exact(w) {
                kind.decode_cols(tile, &mut out);
                std::hint::black_box(&out);
            }
            t.elapsed()
        });
        let all = best(|| {
            let t = Instant::now();
            data.par_chunks(w * 64).for_each_init(
                || vec![0f32; kind.rows() * kind.cols()],
                |out, chunk| {
                    for tile in chunk.chunks_exact(w) {
                        kind.decode_cols(tile, out);
                        std::hint::black_box(&out);
                    }
                },
            );
            t.elapsed()
        });
        let rate = |d: Duration| gb / d.as_secs_f64();
        println!(
            "{:<11} {:>8.2} {:>10.2} {:>10.2} {:>10.2} {:>10.1}% {:>10.1}%",
            kind.name(),
            rate(memcpy),
            rate(one),
            rate(cols),
            rate(all),
            100.0 * rate(cols) / rate(memcpy),
            100.0 * rate(all) / rate(memcpy)
        );
    }
}
