//! The whole forward pass (`crate::model`) against a plain f64 reference written from the
//! definitions.

use crate::model::Model;
use onebit_kernels::matmul::{QMatrix, TileLayout};
use onebit_pack::spec::{Act, ModelSpec, QkNorm, RopeTable};

use crate::testing::*;

/// The forward pass written from the definitions in f64 on dequantized weights.
fn reference_forward(m: &Model, sp: &ModelSpec, toks: &[u32]) -> Vec<f64> {
    let pack = &m.pack;
    let f64v = |name: &str| -> Vec<f64> {
        let b = pack.bytes(name).expect(name);
        b.chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32() as f64)
            .collect()
    };
    let mat = |name: &str| -> Vec<Vec<f64>> {
        let (rows, k) = dims_of(name, sp);
        let layout = TileLayout::by_name("Q41_1280").expect("layout");
        let q = QMatrix::new(layout, rows, k, pack.bytes(name).expect(name)).expect("m");
        let mut w = vec![0f32; k];
        (0..rows)
            .map(|r| {
                q.row_reference(r, &mut w);
                w.iter().map(|&v| v as f64).collect()
            })
            .collect()
    };
    // 4-bit products read int8 activations: per 32 columns a scale amax/127 and rounded codes
    // (kernels::Activations); the reference multiplies by those dequantized values.
    let mv = |w: &[Vec<f64>], x: &[f64]| -> Vec<f64> {
        let x: Vec<f64> = x
            .chunks(32)
            .flat_map(|g| {
                let amax = g.iter().fold(0f64, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                g.iter()
                    .map(move |&v| if d > 0.0 { (v / d).round() * d } else { 0.0 })
            })
            .collect();
        w.iter()
            .map(|r| r.iter().zip(&x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let norm = |x: &[f64], w: &[f64]| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + sp.eps as f64).sqrt();
        x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
    };
    let rope = |v: &mut [f64], pos: usize, t: &RopeTable| {
        let half = t.inv_freq.len();
        for i in 0..half {
            let a = pos as f64 * t.inv_freq[i] as f64;
            let (x0, x1) = (v[i], v[i + half]);
            v[i] = x0 * a.cos() - x1 * a.sin();
            v[i + half] = x1 * a.cos() + x0 * a.sin();
        }
    };
    let emb = f64v("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f64>> = toks
        .iter()
        .map(|&t| emb[t as usize * H..(t as usize + 1) * H].to_vec())
        .collect();
    for (l, ls) in sp.layers.iter().enumerate() {
        let n = |x: &str| format!("model.layers.{l}.{x}");
        let (wq, wk, wv, wo) = (
            mat(&n("self_attn.q_proj.weight")),
            mat(&n("self_attn.k_proj.weight")),
            mat(&n("self_attn.v_proj.weight")),
            mat(&n("self_attn.o_proj.weight")),
        );
        let (qn, kn) = (
            f64v(&n("self_attn.q_norm.weight")),
            f64v(&n("self_attn.k_norm.weight")),
        );
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let h = norm(x, &f64v(&n("input_layernorm.weight")));
            let (mut q, mut k, v) = (mv(&wq, &h), mv(&wk, &h), mv(&wv, &h));
            for hh in 0..NH {
                let mut head = norm(&q[hh * D..(hh + 1) * D], &qn);
                rope(&mut head, p, &sp.ropes[ls.rope]);
                q[hh * D..(hh + 1) * D].copy_from_slice(&head);
            }
            let mut head = norm(&k[..D], &kn);
            rope(&mut head, p, &sp.ropes[ls.rope]);
            k[..D].copy_from_slice(&head);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for p in 0..xs.len() {
            let lo = ls.window.map(|w| (p + 1).saturating_sub(w)).unwrap_or(0);
            let mut att = vec![0f64; NH * D];
            for hh in 0..NH {
                let q = &qs[p][hh * D..(hh + 1) * D];
                let sc: Vec<f64> = (lo..=p)
                    .map(|j| {
                        q.iter().zip(&ks[j][..D]).map(|(a, b)| a * b).sum::<f64>()
                            * sp.attn_scale as f64
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, w) in (lo..=p).zip(&e) {
                    for i in 0..D {
                        att[hh * D + i] += w / z * vs[j][i];
                    }
                }
            }
            let o = norm(&mv(&wo, &att), &f64v(&n("post_attention_layernorm.weight")));
            let x: Vec<f64> = xs[p].iter().zip(&o).map(|(a, b)| a + b).collect();
            let h = norm(&x, &f64v(&n("pre_feedforward_layernorm.weight")));
            let g = mv(&mat(&n("mlp.gate_proj.weight")), &h);
            let u = mv(&mat(&n("mlp.up_proj.weight")), &h);
            let a: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| {
                    let c = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u
                })
                .collect();
            let f = norm(
                &mv(&mat(&n("mlp.down_proj.weight")), &a),
                &f64v(&n("post_feedforward_layernorm.weight")),
            );
            xs[p] = x.iter().zip(&f).map(|(a, b)| a + b).collect();
        }
    }
    let last = norm(&xs[xs.len() - 1], &f64v("model.norm.weight"));
    (0..V)
        .map(|r| {
            emb[r * H..(r + 1) * H]
                .iter()
                .zip(&last)
                .map(|(a, b)| a * b)
                .sum::<f64>()
                / sp.tied_head_divisor as f64
        })
        .collect()
}

#[test]
fn forward_pass_matches_a_reference_written_from_the_definitions() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_d, m) = load(&sp);
    let toks: Vec<u32> = vec![1, 4, 8, 15, 16, 23, 42];
    let mut s = m.session(16);
    let got = m.forward(&mut s, &toks, false).expect("forward");
    let want = reference_forward(&m, &sp, &toks);
    let scale = want.iter().fold(0f64, |a, &b| a.max(b.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(
            ((g as f64) - w).abs() <= 2e-3 * scale,
            "logit {i}: {g} vs {w} (scale {scale})"
        );
    }
    assert_eq!(
        crate::sample::argmax(&got),
        want.iter()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 {
                (i, v)
            } else {
                b
            })
            .0 as u32
    );
}
