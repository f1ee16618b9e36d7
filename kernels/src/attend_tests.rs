//! Tests of `attend`: every path and block gives a query its numbers, whatever the cache type.

use super::*;

fn vecs(n: usize, d: usize, seed: u32) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            (0..d)
                .map(|t| (((i * 31 + t * 17) as u32 ^ seed) % 97) as f32 / 48.0 - 1.0)
                .collect()
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn value_blocks_give_one_pass_bits_with_a_ragged_head_and_late_windows() {
    if !(simd() && std::is_x86_feature_detected!("avx512f")) {
        eprintln!("no AVX-512 F on this CPU: nothing to compare");
        return;
    }
    // A head of 20 (4 columns past the last whole 8), 900 keys (three value blocks of 409), and
    // a second query block whose windows start in the second value block.
    let (d, n) = (20, 900);
    let ks = vecs(n, d, 7);
    let k: Vec<&[f32]> = ks.iter().map(|v| &v[..]).collect();
    let ws = vecs(10, n, 8);
    let w: Vec<&[f32]> = ws.iter().map(|v| &v[..]).collect();
    let ranges: Vec<(usize, usize)> = (0..10)
        .map(|i| {
            if i < 8 {
                (i * 3, 880 + i)
            } else {
                (500 + i, 899)
            }
        })
        .collect();
    let mut one = vec![vec![0f32; d]; 10];
    for (chunk, outs) in one.chunks_mut(QUERIES).enumerate() {
        let at = chunk * QUERIES;
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        let (w, r) = (&w[at..at + refs.len()], &ranges[at..at + refs.len()]);
        // SAFETY: AVX2, FMA and F16C (`simd()`); the narrow kernel over all keys at once.
        unsafe { avx2::weighted_sums(w, r, 0, &k, &mut refs, false, (0, n - 1)) };
    }
    let mut blocked = vec![vec![f32::NAN; d]; 10];
    let mut refs: Vec<&mut [f32]> = blocked.iter_mut().map(|v| &mut v[..]).collect();
    weighted_sums(&w, &ranges, 0, &k, &mut refs);
    for (i, (a, b)) in one.iter().zip(&blocked).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "query {i}");
        for (t, &o) in b.iter().enumerate() {
            let exact: f64 = (ranges[i].0..=ranges[i].1)
                .map(|j| w[i][j] as f64 * k[j][t] as f64)
                .sum();
            assert!((o as f64 - exact).abs() < 1e-3, "query {i} column {t}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn sixteen_float_slices_give_the_eight_float_sums_bit_for_bit() {
    if !(simd() && std::is_x86_feature_detected!("avx512f")) {
        eprintln!("no AVX-512 F on this CPU: nothing to compare");
        return;
    }
    for d in [16, 64, 128, 200] {
        // More keys than one value block of the AVX-512 path (64 keys of 128): the blocked sums
        // must give the one-pass numbers.
        let n = 150;
        let ks = vecs(n, d, 5);
        let k: Vec<&[f32]> = ks.iter().map(|v| &v[..]).collect();
        let ws = vecs(4, n, 6);
        let w: Vec<&[f32]> = ws.iter().map(|v| &v[..]).collect();
        let ranges = [(0, 100), (10, 149), (20, 120), (3, 140)];
        let [narrow, wide] = [false, true].map(|wide| {
            let mut outs = vec![vec![0f32; d]; 4];
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
            // SAFETY: AVX2 and FMA (`simd()`), AVX-512 F checked above.
            unsafe { avx2::weighted_sums(&w, &ranges, 0, &k, &mut refs, wide, (0, n - 1)) };
            outs.concat()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        });
        let mut outs = vec![vec![f32::NAN; d]; 4];
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        weighted_sums(&w, &ranges, 0, &k, &mut refs);
        let blocked: Vec<u32> = outs.concat().iter().map(|x| x.to_bits()).collect();
        assert_eq!(narrow, blocked, "d={d}: in key blocks");
        assert_eq!(narrow, wide, "d={d}");
    }
}

/// The AVX-512 scores sum each pair in 16 lanes and a tree where the AVX2 ones take 8 lanes
/// and another tree: the same products, another order, so the last bits may move. They must
/// stay within a few ulps of the sum's magnitude (`Σ|q·k|`), for every cache type and for
/// head sizes off the 16-float grid.
#[cfg(target_arch = "x86_64")]
#[test]
fn sixteen_lane_scores_match_the_eight_lane_sums_within_rounding() {
    use crate::kv::{F16Row, Q8Row, rows::quantize_q8};
    if !(simd() && std::is_x86_feature_detected!("avx512f")) {
        eprintln!("no AVX-512 F on this CPU: nothing to compare");
        return;
    }
    let mut moved = 0;
    for d in [16, 64, 72, 128, 200, 256] {
        let qs = vecs(4, d, 11);
        let q: Vec<&[f32]> = qs.iter().map(|v| &v[..]).collect();
        let ks = vecs(7, d, 13);
        let k: Vec<&[f32]> = ks.iter().map(|v| &v[..]).collect();
        moved += compare_paths(&q, &k, "f32");
        let f16: Vec<Vec<u16>> = ks
            .iter()
            .map(|v| {
                v.iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect()
            })
            .collect();
        let rows: Vec<F16Row<'_>> = f16.iter().map(|h| F16Row(h)).collect();
        moved += compare_paths(&q, &rows, "f16");
        if d % 32 == 0 {
            let q8: Vec<(Vec<i8>, Vec<u16>)> = ks
                .iter()
                .map(|v| {
                    let (mut c, mut s) = (vec![0i8; d], vec![0u16; d / 32]);
                    quantize_q8(v, &mut c, &mut s);
                    (c, s)
                })
                .collect();
            let rows: Vec<Q8Row<'_>> = q8
                .iter()
                .map(|(c, s)| Q8Row {
                    codes: c,
                    scales: s,
                })
                .collect();
            moved += compare_paths(&q, &rows, "q8_0");
        }
    }
    eprintln!("{moved} scores differ in their last bits between the two paths");
}

/// Every query against every key through the AVX2 blocks and the AVX-512 ones; asserts each
/// pair agrees within 8 ulps of `Σ|q·k|` and returns how many differ at all.
#[cfg(target_arch = "x86_64")]
fn compare_paths<R: Row>(q: &[&[f32]], k: &[R], what: &str) -> usize {
    let (nq, nk, d) = (q.len(), k.len(), q[0].len());
    let mut narrow = vec![f32::NAN; nq * nk];
    let mut wide = vec![f32::NAN; nq * nk];
    assert_eq!(nq, QUERIES);
    // SAFETY: AVX2, FMA and F16C (`simd()`), AVX-512 F, checked by the caller.
    unsafe {
        avx2::scores::<R, QUERIES>(q, k, &mut narrow);
        avx512::scores::<R, QUERIES>(q, k, &mut wide, nk, 0);
    }
    let mut moved = 0;
    for i in 0..nq {
        for j in 0..nk {
            let (a, b) = (narrow[i * nk + j], wide[i * nk + j]);
            let magnitude: f64 = (0..d).map(|t| (q[i][t] * k[j].get(t)).abs() as f64).sum();
            let tol = 8.0 * f32::EPSILON as f64 * magnitude;
            assert!(
                (a as f64 - b as f64).abs() <= tol,
                "{what} d={d} q{i}·k{j}: 8 lanes {a}, 16 lanes {b}, bound {tol}"
            );
            moved += usize::from(a.to_bits() != b.to_bits());
        }
    }
    moved
}

#[test]
fn a_query_gets_the_same_bits_alone_and_in_any_block() {
    for d in [8, 64, 72, 100, 128, 200] {
        let qs = vecs(4, d, 5);
        let ks = vecs(7, d, 9);
        let q: Vec<&[f32]> = qs.iter().map(|v| &v[..]).collect();
        let k: Vec<&[f32]> = ks.iter().map(|v| &v[..]).collect();
        let mut all = vec![0f32; 4 * 7];
        scores(&q, &k, &mut all);
        for i in 0..4 {
            for j in 0..7 {
                let mut one = [0f32];
                scores(&q[i..i + 1], &k[j..j + 1], &mut one);
                assert_eq!(one[0].to_bits(), all[i * 7 + j].to_bits(), "d={d} {i},{j}");
                let exact: f64 = qs[i]
                    .iter()
                    .zip(&ks[j])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                assert!(
                    (one[0] as f64 - exact).abs() < 1e-4,
                    "d={d}: {} vs {exact}",
                    one[0]
                );
            }
        }
        // Weighted sums over each query's own causal range.
        let ws = vecs(4, 7, 3);
        let w: Vec<&[f32]> = ws.iter().map(|v| &v[..]).collect();
        // Overlapping windows, then windows with no key common to all.
        for ranges in [
            [(0, 3), (1, 4), (2, 5), (2, 6)],
            [(0, 1), (0, 2), (3, 5), (4, 6)],
        ] {
            let mut outs = vec![vec![f32::NAN; d]; 4];
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
            weighted_sums(&w, &ranges, 0, &k, &mut refs);
            for i in 0..4 {
                let mut one = vec![f32::NAN; d];
                weighted_sums(&w[i..i + 1], &ranges[i..i + 1], 0, &k, &mut [&mut one[..]]);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&one), bits(&outs[i]), "d={d} query {i}");
                for t in 0..d {
                    let exact: f64 = (ranges[i].0..=ranges[i].1)
                        .map(|j| ws[i][j] as f64 * ks[j][t] as f64)
                        .sum();
                    assert!((one[t] as f64 - exact).abs() < 1e-4);
                }
            }
        }
    }
}

/// Keys and values of `n` vectors of `d` values in each cache type: the kernels must read
/// every type as its `get` reads it, the same bits alone as in a block, and AVX-512 slices
/// as AVX2's.
#[test]
fn every_cache_type_is_read_as_its_values_in_any_block() {
    use crate::kv::{Bf16Row, F16Row, Q8Row, rows::quantize_q8};
    let (n, d) = (7, 128);
    let src = vecs(n, d, 11);
    let f16: Vec<Vec<u16>> = src
        .iter()
        .map(|v| {
            v.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect()
        })
        .collect();
    let bf16: Vec<Vec<u16>> = src
        .iter()
        .map(|v| {
            v.iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect()
        })
        .collect();
    let q8: Vec<(Vec<i8>, Vec<u16>)> = src
        .iter()
        .map(|v| {
            let (mut c, mut s) = (vec![0i8; d], vec![0u16; d / 32]);
            quantize_q8(v, &mut c, &mut s);
            (c, s)
        })
        .collect();
    let qs = vecs(4, d, 3);
    let q: Vec<&[f32]> = qs.iter().map(|v| &v[..]).collect();
    let ws = vecs(4, n, 8);
    let w: Vec<&[f32]> = ws.iter().map(|v| &v[..]).collect();
    fn check<R: Row>(q: &[&[f32]], w: &[&[f32]], rows: &[R], what: &str) {
        let (n, d) = (rows.len(), rows[0].len());
        let mut all = vec![0f32; q.len() * n];
        scores(q, rows, &mut all);
        let ranges = [(0, 3), (1, 4), (2, 5), (2, 6)];
        let mut outs = vec![vec![f32::NAN; d]; 4];
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        weighted_sums(w, &ranges, 0, rows, &mut refs);
        for i in 0..q.len() {
            for (j, r) in rows.iter().enumerate() {
                let exact: f64 = (0..d).map(|t| q[i][t] as f64 * r.get(t) as f64).sum();
                let got = all[i * n + j];
                assert!(
                    (got as f64 - exact).abs() < 1e-4,
                    "{what}: {got} vs {exact}"
                );
                let mut one = [0f32];
                scores(&q[i..i + 1], &rows[j..j + 1], &mut one);
                assert_eq!(one[0].to_bits(), got.to_bits(), "{what}: alone vs block");
            }
            for (t, &o) in outs[i].iter().enumerate() {
                let exact: f64 = (ranges[i].0..=ranges[i].1)
                    .map(|j| w[i][j] as f64 * rows[j].get(t) as f64)
                    .sum();
                assert!((o as f64 - exact).abs() < 1e-4, "{what}: sum");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if simd() && std::is_x86_feature_detected!("avx512f") {
            let [narrow, wide] = [false, true].map(|wide| {
                let mut outs = vec![vec![0f32; d]; 4];
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
                let all = (0, rows.len() - 1);
                // SAFETY: AVX2, FMA and F16C (`simd()`), AVX-512 F checked above.
                unsafe { avx2::weighted_sums(w, &ranges, 0, rows, &mut refs, wide, all) };
                outs.concat()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            });
            assert_eq!(narrow, wide, "{what}: 16-float slices");
        }
    }
    let rows: Vec<&[f32]> = src.iter().map(|v| &v[..]).collect();
    check(&q, &w, &rows, "f32");
    let rows: Vec<F16Row> = f16.iter().map(|v| F16Row(v)).collect();
    check(&q, &w, &rows, "f16");
    let rows: Vec<Bf16Row> = bf16.iter().map(|v| Bf16Row(v)).collect();
    check(&q, &w, &rows, "bf16");
    let rows: Vec<Q8Row> = q8
        .iter()
        .map(|(c, s)| Q8Row {
            codes: c,
            scales: s,
        })
        .collect();
    check(&q, &w, &rows, "q8_0");
}
