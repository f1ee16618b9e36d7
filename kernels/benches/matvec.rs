//! Matrix-vector throughput of the host kernels on Gemma 3 270M's shapes, in GB/s of tile bytes,
//! against a named baseline run on the same bytes in the same process: one pass summing the
//! bytes as u64 words (the memory-read ceiling of this machine for that buffer).
//!
//! `cargo bench -p onebit-kernels --bench matvec` (threads: RAYON_NUM_THREADS; cases whose name
//! holds `ONEBIT_BENCH_ONLY`; paths in `ONEBIT_BENCH_PATHS`, e.g. `avx2,avx512`).

use std::hint::black_box;

use rayon::prelude::*;
use std::time::Instant;

use onebit_kernels::KernelPath;
use onebit_kernels::matmul::scan::{self, ScanMatrix};
use onebit_kernels::matmul::{QMatrix, TileLayout};

mod common;

use common::{median, random_tiles};

/// Times `product` (reading `data`, `macs` multiply-adds) against one pass summing `data` as u64
/// words on the same threads, alternated, and prints the medians.
fn report(name: &str, path: KernelPath, data: &[u8], macs: usize, mut product: impl FnMut()) {
    let reps = (400_000_000 / data.len()).clamp(3, 200);
    let mut t_kernel = Vec::new();
    let mut t_read = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        product();
        t_kernel.push(t0.elapsed().as_secs_f64());
        t_read.push(read_seconds(&[data]));
    }
    let (tk, tr) = (median(t_kernel), median(t_read));
    let gb = data.len() as f64 / 1e9;
    println!(
        "{name:<40} {:<11} {:>8.2} ms {:>6.2} GB/s ({:>6.1} GMAC/s) | read {:>6.2} GB/s | kernel/read {:>5.1} %",
        path.name(),
        tk * 1e3,
        gb / tk,
        macs as f64 / tk / 1e9,
        gb / tr,
        100.0 * tr / tk
    );
}

/// Seconds for one pass summing `parts` as u64 words on the pool's threads: the baseline every
/// product here is set beside.
fn read_seconds(parts: &[&[u8]]) -> f64 {
    let t0 = Instant::now();
    let s: u64 = parts
        .iter()
        .map(|d| {
            d.par_chunks(1 << 16)
                .map(|c| {
                    c.chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .fold(0u64, u64::wrapping_add)
                })
                .reduce(|| 0, u64::wrapping_add)
        })
        .fold(0u64, u64::wrapping_add);
    black_box(s);
    t0.elapsed().as_secs_f64()
}

/// The paths to compare: `ONEBIT_BENCH_PATHS` (comma-separated names), else every path this CPU
/// runs but the scalar one.
fn paths() -> Vec<KernelPath> {
    match std::env::var("ONEBIT_BENCH_PATHS") {
        Ok(v) => v.split(',').filter_map(KernelPath::by_name).collect(),
        Err(_) => KernelPath::available()
            .into_iter()
            .filter(|p| *p != KernelPath::Scalar)
            .collect(),
    }
}

fn main() {
    let threads = rayon::current_num_threads();
    println!(
        "best kernel path {}, {threads} threads; baseline: the same bytes summed as u64 words on as many threads",
        KernelPath::detect().name()
    );
    let only = std::env::var("ONEBIT_BENCH_ONLY").unwrap_or_default();
    let mut cases: Vec<(String, &str, usize, usize, usize)> = vec![
        (
            "gemma270m lm_head 262144x640".into(),
            "Q41_1280",
            262_144,
            640,
            1,
        ),
        (
            "gemma270m ffn_gate 2048x640".into(),
            "Q41_1280",
            2048,
            640,
            1,
        ),
        (
            "gemma270m ffn_down 640x2048".into(),
            "Q41_1280",
            640,
            2048,
            1,
        ),
        (
            "gemma270m ffn_gate 2048x640 x64".into(),
            "Q41_1280",
            2048,
            640,
            64,
        ),
    ];
    // Hunyuan-1.8B's largest products (hidden 2048, FFN 6144) in every tile kind, one token and
    // a 128-token prefill.
    for kind in [
        "Q40_4608", "Q41_5120", "Q40_5120", "Q41_2560", "Q41_1280", "Q8C_8704", "Q8L_8704",
        "Q8H_5120",
    ] {
        for (what, rows, k) in [
            ("ffn_up 6144x2048", 6144, 2048),
            ("ffn_down 2048x6144", 2048, 6144),
        ] {
            cases.push((format!("hy1.8b {what} {kind}"), kind, rows, k, 1));
        }
        cases.push((
            format!("hy1.8b ffn_up 6144x2048 {kind} x128"),
            kind,
            6144,
            2048,
            128,
        ));
    }
    cases.push((
        "hy1.8b lm_head 120818x2048 Q40_4608".into(),
        "Q40_4608",
        120_818,
        2048,
        1,
    ));
    for (name, kind, rows, k, n) in cases {
        if !name.contains(only.as_str()) {
            continue;
        }
        let layout = TileLayout::by_name(kind).expect("layout");
        let data = random_tiles(layout, rows, k);
        let m = QMatrix::new(layout, rows, k, &data).expect("sizes");
        let x: Vec<f32> = (0..n * k).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
        let mut y = vec![0f32; n * rows];
        for path in paths() {
            report(&name, path, &data, rows * k * n, || {
                m.matmul(path, black_box(&x), n, &mut y)
            });
        }
    }
    if "hy1.8b decode layers".contains(only.as_str()) {
        decode_layers();
    }
    if !"scan head".contains(only.as_str()) {
        return;
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
    for path in paths() {
        report(
            "scan head 262144x640 (2-bit)",
            path,
            &data,
            rows * k,
            || m.matmul(path, black_box(&x), 1, &mut y),
        );
    }
}

/// One decode step's products over all 32 layers of the Hunyuan-1.8B shape (q/k/v together, o,
/// gate/up together, down; 884 MB of Q40_4608 tiles, so every step streams from memory as a real
/// decode does), against one read of the same bytes on the same threads. `ONEBIT_BENCH_KIND`
/// names another 4-bit kind for the same shapes (`Q41_5120`: the kind Q4_0 models of the Qwen,
/// Llama, LFM2 and SmolLM2 families are written in).
fn decode_layers() {
    let kind = std::env::var("ONEBIT_BENCH_KIND").unwrap_or_else(|_| "Q40_4608".into());
    let layout = TileLayout::by_name(&kind).expect("layout");
    let (h, kv, ffn) = (2048, 512, 6144);
    let shapes = [
        (h, h),
        (kv, h),
        (kv, h),
        (h, h),
        (ffn, h),
        (ffn, h),
        (h, ffn),
    ];
    let layers: Vec<Vec<Vec<u8>>> = (0..32)
        .map(|_| {
            shapes
                .iter()
                .map(|&(r, k)| random_tiles(layout, r, k))
                .collect()
        })
        .collect();
    let bytes: usize = layers.iter().flatten().map(Vec::len).sum();
    // ONEBIT_BENCH_HUGE=1: the same bytes in one anonymous mapping advised to huge pages.
    let mut huge = None;
    if std::env::var_os("ONEBIT_BENCH_HUGE").is_some() {
        let mut m = memmap2::MmapOptions::new()
            .len(bytes)
            .map_anon()
            .expect("anon map");
        #[cfg(target_os = "linux")]
        m.advise(memmap2::Advice::HugePage).expect("advise");
        let mut at = 0;
        for d in layers.iter().flatten() {
            m[at..at + d.len()].copy_from_slice(d);
            at += d.len();
        }
        huge = Some(m);
    }
    let layers: Vec<Vec<&[u8]>> = match &huge {
        Some(m) => {
            let mut at = 0;
            layers
                .iter()
                .map(|l| {
                    l.iter()
                        .map(|d| {
                            let s = &m[at..at + d.len()];
                            at += d.len();
                            s
                        })
                        .collect()
                })
                .collect()
        }
        None => layers
            .iter()
            .map(|l| l.iter().map(|d| &d[..]).collect())
            .collect(),
    };
    let x: Vec<f32> = (0..ffn).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    for path in paths() {
        let mut times = Vec::new();
        let mut reads = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            for l in &layers {
                let m: Vec<QMatrix<'_>> = l
                    .iter()
                    .zip(&shapes)
                    .map(|(d, &(r, k))| QMatrix::new(layout, r, k, d).expect("sizes"))
                    .collect();
                let (mut q, mut k, mut v) = (vec![0f32; h], vec![0f32; kv], vec![0f32; kv]);
                onebit_kernels::matmul::matmul_many(
                    path,
                    &m[0..3],
                    &x[..h],
                    1,
                    &mut [&mut q[..], &mut k[..], &mut v[..]],
                );
                let mut o = vec![0f32; h];
                m[3].matmul(path, black_box(&q), 1, &mut o);
                let (mut g, mut u) = (vec![0f32; ffn], vec![0f32; ffn]);
                onebit_kernels::matmul::matmul_many(
                    path,
                    &m[4..6],
                    &o,
                    1,
                    &mut [&mut g[..], &mut u[..]],
                );
                let mut d = vec![0f32; h];
                m[6].matmul(path, black_box(&g), 1, &mut d);
                black_box(&d);
            }
            times.push(t0.elapsed().as_secs_f64());
            let all: Vec<&[u8]> = layers.iter().flatten().copied().collect();
            reads.push(read_seconds(&all));
        }
        let (tk, tr) = (median(times), median(reads));
        let gb = bytes as f64 / 1e9;
        println!(
            "{:<40} {:<11} {:>8.2} ms {:>6.2} GB/s | read {:>6.2} GB/s | kernel/read {:>5.1} %",
            format!("hy1.8b decode layers {kind}"),
            path.name(),
            tk * 1e3,
            gb / tk,
            gb / tr,
            100.0 * tr / tk
        );
    }
}
