//! Matrix-vector throughput of the host kernels on Gemma 3 270M's shapes, in GB/s of tile bytes,
//! against a named baseline run on the same bytes in the same process: one pass summing the
//! bytes as u64 words (the memory-read ceiling of this machine for that buffer).
//!
//! `cargo bench -p onebit-runtime --bench matvec` (threads: RAYON_NUM_THREADS).

use std::hint::black_box;
use std::time::Instant;

use onebit_runtime::kernels::scan::{self, ScanMatrix};
use onebit_runtime::kernels::{Path, QMatrix, TileLayout};

mod common;

use common::{median, random_tiles};

/// Times `product` (reading `data`, `macs` multiply-adds) against one single-thread pass summing
/// `data` as u64 words, alternated, and prints the medians.
fn report(name: &str, data: &[u8], macs: usize, mut product: impl FnMut()) {
    let reps = (400_000_000 / data.len()).clamp(3, 200);
    let mut t_kernel = Vec::new();
    let mut t_read = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        product();
        t_kernel.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        let s: u64 = data
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .fold(0u64, u64::wrapping_add);
        black_box(s);
        t_read.push(t0.elapsed().as_secs_f64());
    }
    let (tk, tr) = (median(t_kernel), median(t_read));
    let gb = data.len() as f64 / 1e9;
    println!(
        "{name:<44} {:>7.2} ms  {:>6.2} GB/s weights ({:>6.1} GMAC/s) | baseline read 1 thread {:>6.2} GB/s | kernel/read {:>5.1} %",
        tk * 1e3,
        gb / tk,
        macs as f64 / tk / 1e9,
        gb / tr,
        100.0 * tr / tk
    );
}

fn main() {
    let path = Path::detect();
    let threads = rayon::current_num_threads();
    println!("kernel path {}, {threads} threads", path.name());
    for (name, kind, rows, k, n) in [
        ("lm_head 262144x640", "Q41_1280", 262_144, 640, 1),
        ("ffn_gate 2048x640", "Q41_1280", 2048, 640, 1),
        ("ffn_down 640x2048", "Q41_1280", 640, 2048, 1),
        ("ffn_gate 2048x640 Q8C_8704", "Q8C_8704", 2048, 640, 1),
        ("ffn_down 640x2048 Q8C_8704", "Q8C_8704", 640, 2048, 1),
        (
            "lm_head 262144x640 Q41_5120 (K padded 768)",
            "Q41_5120",
            262_144,
            640,
            1,
        ),
        ("ffn_gate 2048x640, 64 tokens", "Q41_1280", 2048, 640, 64),
        (
            "ffn_gate 2048x640 Q8C_8704, 64 tokens",
            "Q8C_8704",
            2048,
            640,
            64,
        ),
    ] {
        let layout = TileLayout::by_name(kind).expect("layout");
        let data = random_tiles(layout, rows, k);
        let m = QMatrix::new(layout, rows, k, &data).expect("sizes");
        let x: Vec<f32> = (0..n * k).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
        let mut y = vec![0f32; n * rows];
        report(name, &data, rows * k * n, || {
            m.matmul(path, black_box(&x), n, &mut y)
        });
    }
    // The 2-bit scan head on the same shape (random bf16 rows encoded as the repack stage does).
    let (rows, k) = (262_144, 640);
    let src: Vec<u8> = (0..rows * k)
        .flat_map(|i| half::bf16::from_f32(((i * 7919 % 1013) as f32 - 506.0) * 1e-4).to_le_bytes())
        .collect();
    let data = scan::encode_bf16(&src, rows, k, 1.0);
    drop(src);
    let m = ScanMatrix::new(rows, k, &data).expect("sizes");
    let x: Vec<f32> = (0..k).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let mut y = vec![0f32; rows];
    report("scan head 262144x640 (2-bit)", &data, rows * k, || {
        m.matmul(path, black_box(&x), 1, &mut y)
    });
}
