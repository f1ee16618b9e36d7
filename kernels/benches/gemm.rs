//! The image encoder's products at Gemma 3 4B's SigLIP shapes (hidden 1152, MLP 4304, 16 heads
//! of 72; 4,096 patches an image), on `ROWS` patches: a projection (`x · Wᵀ`, the MLP's up
//! projection, `W` bf16 in its 256×64 MM blocks) and one head's attention scores (`Q · Kᵀ`) and
//! values (`P · V`), through `onebit_kernels::gemm` against the named baseline,
//! `matrixmultiply`'s sgemm (the encoder's earlier path: AVX2 kernels, `W` widened to f32 ahead,
//! rows spread over rayon in blocks), side by side in one process on the same values.
//!
//! `cargo bench -p onebit-kernels --bench gemm` prints, per product, each side's median time of
//! `REPS` runs, its GFLOP/s and the ratio; ours at f32 and, where the CPU has AVX-512-BF16, at
//! bf16 (`Precision::Bf16`: operands rounded to bf16, hence its larger difference). `ONEBIT_BENCH_ROWS` sets the patches (default 1024).

use std::time::Instant;

use onebit_kernels::gemm::{
    Bf16Blocked, F32Cols, F32Rows, Operands, Packed, Precision, Weights, gemm,
};
use onebit_pack::mm_block::MmBlock;
use rayon::prelude::*;

const REPS: usize = 5;

fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median time of `REPS` runs of `f` into one output buffer (faulted in by a first,
/// untimed run: a fresh 70 MB output costs its page faults, which the encoder's reused buffers
/// do not), and that output.
fn time(f: &mut dyn FnMut(&mut Vec<f32>)) -> (f64, Vec<f32>) {
    let mut out = Vec::new();
    f(&mut out);
    let runs = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f(&mut out);
            t.elapsed().as_secs_f64()
        })
        .collect();
    (median(runs), out)
}

/// The baseline: `c = a · b` with `b` given by strides (`rsb`, `csb`), blocks of rows over rayon.
#[allow(clippy::too_many_arguments)]
fn sgemm(
    c: &mut Vec<f32>,
    a: &[f32],
    m: usize,
    k: usize,
    b: &[f32],
    n: usize,
    rsb: isize,
    csb: isize,
) {
    c.resize(m * n, 0.0);
    let rows = m.div_ceil(rayon::current_num_threads() * 4).clamp(16, 256);
    c.par_chunks_mut(rows * n).enumerate().for_each(|(i, cb)| {
        let mr = cb.len() / n;
        // SAFETY: a's rows i·rows.. and all of b, c's block: in bounds by construction.
        unsafe {
            matrixmultiply::sgemm(
                mr,
                k,
                n,
                1.0,
                a.as_ptr().add(i * rows * k),
                k as isize,
                1,
                b.as_ptr(),
                rsb,
                csb,
                0.0,
                cb.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    });
}

/// Ours, `y = x · Wᵀ` at `precision` (the output zeroed first: the product adds into it).
fn ours(y: &mut Vec<f32>, w: &dyn Weights, x: &[f32], m: usize, precision: Precision) {
    y.clear();
    let (n, k) = w.shape();
    y.resize(m * n, 0.0);
    let (ldx, ldy) = (k, n);
    gemm(w, Operands { x, m, ldx, y, ldy }, true, precision);
}

/// The precisions ours runs at here: f32, and bf16 where the CPU multiplies bf16.
fn precisions() -> Vec<Precision> {
    let mut p = vec![Precision::F32];
    if Precision::Bf16.native() {
        p.push(Precision::Bf16);
    }
    p
}

/// One line per precision: the baseline's and ours's time and rate, the ratio, and the largest
/// difference relative to the baseline's values.
fn report(
    name: &str,
    flops: f64,
    base: &(f64, Vec<f32>),
    precision: Precision,
    ours: (f64, Vec<f32>),
) {
    let diff = base
        .1
        .iter()
        .zip(&ours.1)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
        .fold(0.0f32, f32::max);
    println!(
        "{name:<22} sgemm {:>8.1} ms {:>6.1} GFLOP/s | ours {:<4} {:>8.1} ms {:>6.1} GFLOP/s | {:>5.2}x | max rel diff {diff:.1e}",
        base.0 * 1e3,
        flops / base.0 / 1e9,
        precision.name(),
        ours.0 * 1e3,
        flops / ours.0 / 1e9,
        base.0 / ours.0
    );
}

fn main() {
    let m: usize = std::env::var("ONEBIT_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    println!(
        "image encoder products, {m} patches, {} threads, path {} (baseline: matrixmultiply sgemm on f32 weights)",
        rayon::current_num_threads(),
        onebit_kernels::KernelPath::detect().name()
    );
    // The MLP's up projection: W bf16 in MM blocks, read from its bytes; the baseline on the
    // same values widened to f32.
    let (n, k) = (4304, 1152);
    let block = MmBlock {
        mm_k: 256,
        mm_n: 64,
    };
    let bits: Vec<u16> = values(n * k, 2)
        .iter()
        .map(|v| half::bf16::from_f32(*v * 0.05).to_bits())
        .collect();
    let widened: Vec<f32> = bits
        .iter()
        .map(|b| f32::from_bits(u32::from(*b) << 16))
        .collect();
    let bytes = block.encode(n as u64, k as u64, &bits);
    let blocks_k = block.declared_shape(n as u64, k as u64)[1] as usize;
    let x = values(m * k, 1);
    let w = Bf16Blocked {
        bytes: &bytes,
        block,
        blocks_k,
        n,
        k,
    };
    let base = time(&mut |y| sgemm(y, &x, m, k, &widened, n, 1, k as isize));
    for p in precisions() {
        let flops = 2.0 * (m * n * k) as f64;
        report(
            "mlp up 1152->4304",
            flops,
            &base,
            p,
            time(&mut |y| ours(y, &w, &x, m, p)),
        );
    }

    // One head's scores over every patch (Q·Kᵀ, 72 deep) and its values (P·V, 72 wide).
    let hd = 72;
    let (q, keys) = (values(m * hd, 3), values(m * hd, 4));
    // Ours packs a head's keys and values once (as the encoder does), inside the timing.
    let base = time(&mut |y| sgemm(y, &q, m, hd, &keys, m, 1, hd as isize));
    for p in precisions() {
        let ours = time(&mut |y| {
            let w = F32Rows {
                data: &keys,
                n: m,
                k: hd,
                stride: hd,
            };
            ours(y, &Packed::new(&w, p), &q, m, p)
        });
        report(
            "scores Q.K^T (72)",
            2.0 * (m * m * hd) as f64,
            &base,
            p,
            ours,
        );
    }
    let probs = values(m * m, 5);
    let base = time(&mut |y| sgemm(y, &probs, m, m, &keys, hd, hd as isize, 1));
    for p in precisions() {
        let ours = time(&mut |y| {
            let w = F32Cols {
                data: &keys,
                n: hd,
                k: m,
                stride: hd,
            };
            ours(y, &Packed::new(&w, p), &probs, m, p)
        });
        report("values P.V (72)", 2.0 * (m * m * hd) as f64, &base, p, ours);
    }
}
