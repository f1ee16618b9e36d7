//! The tests of the products (`gemm/`).
use super::*;
use onebit_pack::mm_block::MmBlock;

fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|x| half::bf16::from_f32(*x).to_bits())
        .collect()
}

/// `x · Wᵀ` as sequential f64 sums, on `w(j, t)`.
fn reference(x: &[f32], m: usize, k: usize, n: usize, w: impl Fn(usize, usize) -> f32) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..k)
                .map(|t| f64::from(x[i * k + t]) * f64::from(w(j, t)))
                .sum::<f64>() as f32;
        }
    }
    y
}

fn close(ours: &[f32], want: &[f32], k: usize) {
    let scale = (k as f32).sqrt() * 1e-6 * 8.0;
    for (i, (a, b)) in ours.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= scale * (1.0 + b.abs()),
            "y[{i}] = {a}, want {b}"
        );
    }
}

fn run(w: &dyn Weights, x: &[f32], m: usize, parallel: bool) -> Vec<f32> {
    run_at(w, x, m, parallel, Precision::F32)
}

fn run_at(w: &dyn Weights, x: &[f32], m: usize, parallel: bool, precision: Precision) -> Vec<f32> {
    let (n, k) = w.shape();
    let mut y = vec![0.0f32; m * n];
    let (ldx, ldy) = (k, n);
    gemm(
        w,
        Operands {
            x,
            m,
            ldx,
            y: &mut y,
            ldy,
        },
        parallel,
        precision,
    );
    y
}

/// Every path this CPU runs, against f64 sums, on MM-blocked bf16 weights whose sizes are not
/// multiples of a block, a panel or a tile (the real towers' 1152 and 4304 are not either).
#[test]
fn blocked_bf16_products_match_the_sums_on_every_path() {
    let (m, n, k) = (13, 70, 300);
    let block = MmBlock {
        mm_k: 256,
        mm_n: 64,
    };
    let w = values(n * k, 7);
    let bits = bf16_bits(&w);
    let bytes = block.encode(n as u64, k as u64, &bits);
    let blocks_k = block.declared_shape(n as u64, k as u64)[1] as usize;
    let x = values(m * k, 3);
    let widened: Vec<f32> = bits
        .iter()
        .map(|b| f32::from_bits(u32::from(*b) << 16))
        .collect();
    let want = reference(&x, m, k, n, |j, t| widened[j * k + t]);
    let weights = Bf16Blocked {
        bytes: &bytes,
        block,
        blocks_k,
        n,
        k,
    };
    for path in [Path::Avx512, Path::Avx2, Path::Scalar] {
        if path == Path::Avx512 && !cfg!(target_arch = "x86_64") {
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if (path == Path::Avx512 && !std::is_x86_feature_detected!("avx512f"))
            || (path == Path::Avx2 && !std::is_x86_feature_detected!("fma"))
        {
            continue;
        }
        let mut y = vec![0.0f32; m * n];
        let mut panel = vec![0.0f32; KB * NB];
        for n0 in (0..n).step_by(NB) {
            let nc = NB.min(n - n0);
            for k0 in (0..k).step_by(KB) {
                let kc = KB.min(k - k0);
                weights.pack(n0, nc, k0, kc, &mut panel);
                for r0 in (0..m).step_by(MR) {
                    let tile = Tile {
                        x: &x[r0 * k + k0..],
                        ldx: k,
                        rows: MR.min(m - r0),
                        kc,
                        nc,
                    };
                    // SAFETY: y is m × n; the tile's rectangle is inside it.
                    unsafe { path.tile(&tile, &panel, y.as_mut_ptr().add(r0 * n + n0), n) };
                }
            }
        }
        close(&y, &want, k);
    }
    close(&run(&weights, &x, m, true), &want, k);
    close(&run(&weights, &x, m, false), &want, k);
}

/// The plain and f32 sources give the same products as their f64 sums, including an output
/// count that leaves a partial vector (72, one head of Gemma 3's tower) and strided rows.
#[test]
fn plain_and_strided_sources_match_the_sums() {
    let (m, n, k) = (100, 72, 150);
    let x = values(m * k, 11);
    let w = values(n * k, 5);
    let bits = bf16_bits(&w);
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let widened: Vec<f32> = bits
        .iter()
        .map(|b| f32::from_bits(u32::from(*b) << 16))
        .collect();
    let want = reference(&x, m, k, n, |j, t| widened[j * k + t]);
    close(
        &run(
            &Bf16Rows {
                bytes: &bytes,
                n,
                k,
            },
            &x,
            m,
            true,
        ),
        &want,
        k,
    );

    // W's rows inside wider rows (stride 200), and W as the columns of a k × 200 matrix.
    let stride = 200;
    let mut rows = vec![9.0f32; n * stride];
    let mut cols = vec![9.0f32; k * stride];
    for j in 0..n {
        for t in 0..k {
            rows[j * stride + t] = w[j * k + t];
            cols[t * stride + j] = w[j * k + t];
        }
    }
    let want = reference(&x, m, k, n, |j, t| w[j * k + t]);
    close(
        &run(
            &F32Rows {
                data: &rows,
                n,
                k,
                stride,
            },
            &x,
            m,
            true,
        ),
        &want,
        k,
    );
    close(
        &run(
            &F32Cols {
                data: &cols,
                n,
                k,
                stride,
            },
            &x,
            m,
            true,
        ),
        &want,
        k,
    );
    // Packed once, read by every product.
    let packed = Packed::new(
        &F32Cols {
            data: &cols,
            n,
            k,
            stride,
        },
        Precision::F32,
    );
    close(&run(&packed, &x, m, true), &want, k);
    close(&run(&packed, &x, m, false), &want, k);
}

/// `y` is added to, and its columns outside the product are left alone.
#[test]
fn the_product_adds_into_its_own_columns_only() {
    let (m, n, k) = (7, 20, 40);
    let x = values(m * k, 1);
    let w = values(n * k, 2);
    let ldy = 32;
    let mut y = vec![1.0f32; m * ldy];
    gemm(
        &F32Rows {
            data: &w,
            n,
            k,
            stride: k,
        },
        Operands {
            x: &x,
            m,
            ldx: k,
            y: &mut y,
            ldy,
        },
        true,
        Precision::F32,
    );
    let want = reference(&x, m, k, n, |j, t| w[j * k + t]);
    for i in 0..m {
        for j in 0..ldy {
            let got = y[i * ldy + j];
            if j < n {
                assert!(
                    (got - 1.0 - want[i * n + j]).abs() < 1e-4,
                    "({i},{j}) {got}"
                );
            } else {
                assert_eq!(got, 1.0, "column {j} outside the product");
            }
        }
    }
}

/// `v` rounded to bf16 as the bf16 products round it (to nearest even).
fn to_bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// At [`Precision::Bf16`], every source (blocked and plain bf16, f32 rows and columns, packed
/// both ways) gives the f64 sums of the operands rounded to bf16, natively where the CPU has
/// AVX-512-BF16 and emulated elsewhere, at odd depths (a pair's high half is padding) and
/// output counts that leave partial vectors.
#[test]
fn bf16_products_are_the_sums_of_the_rounded_operands_for_every_source() {
    let (m, n, k) = (17, 70, 301);
    let block = MmBlock {
        mm_k: 256,
        mm_n: 64,
    };
    let w = values(n * k, 21);
    let bits = bf16_bits(&w);
    let widened: Vec<f32> = bits
        .iter()
        .map(|b| f32::from_bits(u32::from(*b) << 16))
        .collect();
    let blocked = block.encode(n as u64, k as u64, &bits);
    let blocks_k = block.declared_shape(n as u64, k as u64)[1] as usize;
    let plain: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    // x with more precision than bf16 keeps, so a missing rounding shows.
    let x: Vec<f32> = values(m * k, 9).iter().map(|v| v * 1.001 + 1e-4).collect();
    let xr: Vec<f32> = x.iter().copied().map(to_bf16).collect();
    let want = reference(&xr, m, k, n, |j, t| widened[j * k + t]);
    let unrounded = reference(&x, m, k, n, |j, t| widened[j * k + t]);
    let gap = want
        .iter()
        .zip(&unrounded)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(gap > 1e-3, "the test's x must lose bits to bf16 ({gap})");
    let wf: Vec<f32> = values(n * k, 4);
    let wfr: Vec<f32> = wf.iter().copied().map(to_bf16).collect();
    let want_f = reference(&xr, m, k, n, |j, t| wfr[j * k + t]);
    let wt: Vec<f32> = (0..k * n).map(|i| wf[(i % n) * k + i / n]).collect();
    let rows = F32Rows {
        data: &wf,
        n,
        k,
        stride: k,
    };
    let cols = F32Cols {
        data: &wt,
        n,
        k,
        stride: n,
    };
    let sources: [(&str, &dyn Weights, &[f32]); 4] = [
        (
            "blocked",
            &Bf16Blocked {
                bytes: &blocked,
                block,
                blocks_k,
                n,
                k,
            },
            &want,
        ),
        (
            "plain",
            &Bf16Rows {
                bytes: &plain,
                n,
                k,
            },
            &want,
        ),
        ("f32 rows", &rows, &want_f),
        ("f32 cols", &cols, &want_f),
    ];
    for (name, source, want) in sources {
        for parallel in [true, false] {
            let y = run_at(source, &x, m, parallel, Precision::Bf16);
            for (i, (a, b)) in y.iter().zip(want.iter()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{name}: y[{i}] = {a}, want {b} (native {})",
                    Precision::Bf16.native()
                );
            }
        }
        for packed_at in [Precision::F32, Precision::Bf16] {
            let packed = Packed::new(source, packed_at);
            for product_at in [Precision::F32, Precision::Bf16] {
                let y = run_at(&packed, &x, m, true, product_at);
                let expect: Vec<f32> = if product_at == Precision::Bf16 {
                    want.to_vec()
                } else if packed_at == Precision::Bf16 && Precision::Bf16.native() {
                    // Packed as bf16 pairs: the f32 product reads the rounded weights.
                    reference(&x, m, k, n, |j, t| {
                        if name.starts_with("f32") {
                            wfr[j * k + t]
                        } else {
                            widened[j * k + t]
                        }
                    })
                } else if name.starts_with("f32") {
                    reference(&x, m, k, n, |j, t| wf[j * k + t])
                } else {
                    unrounded.clone()
                };
                for (i, (a, b)) in y.iter().zip(&expect).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{name} packed at {packed_at:?}, product at {product_at:?}: y[{i}] = {a}, want {b}"
                    );
                }
            }
        }
    }
}

/// The pair conversion rounds to nearest even as `half` does, for rows of every length around a
/// vector's 32 values.
#[test]
fn rows_become_bf16_pairs_rounded_to_nearest_even() {
    for len in [1, 2, 31, 32, 33, 64, 77] {
        let row: Vec<f32> = values(len, len as u32)
            .iter()
            .map(|v| v * 1.003 + 1.0e-3)
            .collect();
        let mut out = vec![0u32; len.div_ceil(2)];
        row_pairs(&row, &mut out);
        for (t, v) in row.iter().enumerate() {
            let half = if t % 2 == 0 {
                out[t / 2] & 0xffff
            } else {
                out[t / 2] >> 16
            };
            assert_eq!(
                half,
                u32::from(half::bf16::from_f32(*v).to_bits()),
                "len {len}, value {t}"
            );
        }
        if len % 2 == 1 {
            assert_eq!(out[len / 2] >> 16, 0, "the padding half of an odd row");
        }
    }
}
