//! Forward-pass tests on a small synthetic pack written here: the batched prefill against
//! token-by-token steps (bit for bit, logits and KV), and the whole forward pass against a plain
//! f64 reference written from the definitions.

use std::collections::BTreeMap;
use std::io::Write;

use crate::kernels::tests::random_matrix;
use crate::kernels::{QMatrix, TileLayout};
use crate::model::{Model, Session};
use crate::pack::{HEAD_SCAN_FILE, HeadScan, Manifest, Pack, TensorEntry, Verification};
use crate::spec::{Act, LayerSpec, Mixer, ModelSpec, QkNorm, RopeTable, ValueHeadOrder};

const H: usize = 128;
const D: usize = 64;
const NH: usize = 2;
const NKV: usize = 1;
const F: usize = 256;
pub(crate) const V: usize = 64;

pub(crate) fn spec(qk: QkNorm, act: Act, sandwich: bool) -> ModelSpec {
    let rope = |base: f32| RopeTable {
        inv_freq: (0..D / 2)
            .map(|i| base.powf(-(2.0 * i as f32) / D as f32))
            .collect(),
        attention_factor: 1.0,
    };
    ModelSpec {
        family: "test".into(),
        hidden: H,
        heads: NH,
        kv_heads: NKV,
        head_dim: D,
        ffn: F,
        vocab: V,
        eps: 1e-6,
        norm_add_one: false,
        act,
        layers: vec![
            LayerSpec {
                window: Some(4),
                rope: 0,
                mixer: Mixer::Attention,
            },
            LayerSpec {
                window: None,
                rope: 1,
                mixer: Mixer::Attention,
            },
        ],
        ropes: vec![rope(10_000.0), rope(1_000_000.0)],
        qk_norm: qk,
        sandwich_norms: sandwich,
        attn_scale: 1.0 / 16.0,
        qkv_bias: false,
        embed_scale: 1.0,
        tied_head_divisor: 2.0,
        tied_head: true,
        attn_output_gate: false,
        final_softcap: None,
        attn_softcap: None,
        bos: Some(1),
        add_bos: true,
        eos: vec![2],
        context: 64,
    }
}

/// Writes a pack with random weights for `spec` into `dir`.
pub(crate) fn write_pack(dir: &std::path::Path, spec: &ModelSpec) {
    write_pack_with(dir, spec, false, false);
}

/// [`write_pack`], with `lm_head.weight` stored as (random) tiles when `tiled_head`, and the
/// embedding's 2-bit scan head when `scan`.
pub(crate) fn write_pack_with(
    dir: &std::path::Path,
    spec: &ModelSpec,
    tiled_head: bool,
    scan: bool,
) {
    let layout = TileLayout::by_name("Q41_1280").expect("layout");
    let mut tensors: Vec<(String, &str, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut seed = 1u64;
    let mut bf = |n: usize, base: f32, spread: f32| -> Vec<u8> {
        seed += 1;
        let mut s = seed * 0x9E37_79B9;
        (0..n)
            .flat_map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let v = base + spread * ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5);
                half::bf16::from_f32(v).to_le_bytes()
            })
            .collect()
    };
    tensors.push((
        "model.embed_tokens.weight".into(),
        "BF16",
        vec![V as u64, H as u64],
        bf(V * H, 0.0, 2.0),
    ));
    tensors.push((
        "model.norm.weight".into(),
        "BF16",
        vec![H as u64],
        bf(H, 1.0, 0.2),
    ));
    let mut s2 = 100u64;
    for l in 0..spec.layers.len() {
        let n = |x: &str| format!("model.layers.{l}.{x}");
        for norm in [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight",
        ] {
            tensors.push((n(norm), "BF16", vec![H as u64], bf(H, 1.0, 0.2)));
        }
        for norm in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            tensors.push((n(norm), "BF16", vec![D as u64], bf(D, 1.0, 0.2)));
        }
        for (name, rows, k) in [
            (
                "self_attn.q_proj.weight",
                dims_of("q_proj.weight", spec).0,
                H,
            ),
            ("self_attn.k_proj.weight", NKV * D, H),
            ("self_attn.v_proj.weight", NKV * D, H),
            ("self_attn.o_proj.weight", H, NH * D),
            ("mlp.gate_proj.weight", F, H),
            ("mlp.up_proj.weight", F, H),
            ("mlp.down_proj.weight", H, F),
        ] {
            s2 += 1;
            let data = random_matrix(layout, rows, k, s2);
            let tiles = data.len() / layout.bytes;
            tensors.push((n(name), "I8", vec![tiles as u64, layout.bytes as u64], data));
        }
        if let Mixer::GatedDeltaNet { kernel, .. } = spec.layers[l].mixer {
            for (name, rows, k) in [
                ("linear_attn.qkv_proj.weight", GDN_C, H),
                ("self_attn.gate_proj.weight", GDN_VD, H),
                ("linear_attn.ssm_out_proj.weight", H, GDN_VD),
            ] {
                s2 += 1;
                let data = random_matrix(layout, rows, k, s2);
                let tiles = data.len() / layout.bytes;
                tensors.push((n(name), "I8", vec![tiles as u64, layout.bytes as u64], data));
            }
            for proj in ["ssm_alpha_proj", "ssm_beta_proj"] {
                tensors.push((
                    n(&format!("linear_attn.{proj}.bf16.weight")),
                    "BF16",
                    vec![GDN_NV as u64, H as u64],
                    bf(GDN_NV * H, 0.0, 0.5),
                ));
            }
            let vectors = [
                (
                    "linear_attn.ssm_conv1d.weight",
                    vec![kernel as u64, GDN_C as u64],
                    0.0,
                    1.5,
                ),
                ("linear_attn.ssm_a", vec![GDN_NV as u64], -0.3, 0.4),
                ("linear_attn.ssm_dt.bias", vec![GDN_NV as u64], 0.0, 1.0),
                ("linear_attn.ssm_norm.weight", vec![GDN_DV as u64], 1.0, 0.4),
            ];
            for (name, shape, base, spread) in vectors {
                let len = shape.iter().product::<u64>() as usize;
                tensors.push((n(name), "BF16", shape, bf(len, base, spread)));
            }
        }
        if let Mixer::ShortConv { kernel } = spec.layers[l].mixer {
            for (name, rows, k) in [
                ("shortconv.in_proj.weight", 3 * H, H),
                ("shortconv.out_proj.weight", H, H),
            ] {
                s2 += 1;
                let data = random_matrix(layout, rows, k, s2);
                let tiles = data.len() / layout.bytes;
                tensors.push((n(name), "I8", vec![tiles as u64, layout.bytes as u64], data));
            }
            tensors.push((
                n("shortconv.conv.weight"),
                "BF16",
                vec![H as u64, kernel as u64],
                bf(H * kernel, 0.0, 1.5),
            ));
        }
    }
    if tiled_head {
        let data = random_matrix(layout, V, H, 77);
        let tiles = data.len() / layout.bytes;
        tensors.push((
            "lm_head.weight".into(),
            "I8",
            vec![tiles as u64, layout.bytes as u64],
            data,
        ));
    }
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    let mut entries = BTreeMap::new();
    for (name, dtype, shape, data) in &tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}),
        );
        at += data.len();
        let (rows, k) = if *dtype == "I8" {
            let (r, k) = dims_of(name, spec);
            (r as u64, k as u64)
        } else if shape.len() == 2 {
            (shape[0], shape[1])
        } else {
            (1, shape[0])
        };
        let kind = if *dtype == "I8" { "Q41_1280" } else { dtype };
        entries.insert(
            name.clone(),
            TensorEntry {
                kind: kind.into(),
                rows,
                k,
            },
        );
    }
    let mut h = serde_json::to_vec(&header).expect("header");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = std::fs::File::create(dir.join("model.q4nx")).expect("create");
    f.write_all(&(h.len() as u64).to_le_bytes()).expect("w");
    f.write_all(&h).expect("w");
    for (_, _, _, data) in &tensors {
        f.write_all(data).expect("w");
    }
    let manifest = Manifest {
        head_scan: scan.then(|| {
            let emb = &tensors[0].3;
            let bytes = crate::kernels::scan::encode_bf16(emb, V, H, 1.0 / spec.tied_head_divisor);
            std::fs::write(dir.join(HEAD_SCAN_FILE), &bytes).expect("scan");
            HeadScan {
                file: HEAD_SCAN_FILE.into(),
                rows: V as u64,
                k: H as u64,
                blake3: blake3::hash(&bytes).to_hex().to_string(),
            }
        }),
        ..Manifest::synthetic(spec.clone(), entries)
    };
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&manifest).expect("manifest"),
    )
    .expect("write");
}

/// The gated-DeltaNet layers' geometry in these tests: 2 key heads and 4 value heads of 32.
const GDN_NK: usize = 2;
const GDN_DK: usize = 32;
const GDN_NV: usize = 4;
const GDN_DV: usize = 32;
const GDN_VD: usize = GDN_NV * GDN_DV;
const GDN_C: usize = 2 * GDN_NK * GDN_DK + GDN_VD;

fn dims_of(name: &str, spec: &ModelSpec) -> (usize, usize) {
    if name == "lm_head.weight" {
        (V, H)
    } else if name.ends_with("linear_attn.qkv_proj.weight") {
        (GDN_C, H)
    } else if name.ends_with("self_attn.gate_proj.weight") {
        (GDN_VD, H)
    } else if name.ends_with("linear_attn.ssm_out_proj.weight") {
        (H, GDN_VD)
    } else if name.ends_with("q_proj.weight") && spec.attn_output_gate {
        (2 * NH * D, H)
    } else if name.ends_with("shortconv.in_proj.weight") {
        (3 * H, H)
    } else if name.ends_with("shortconv.out_proj.weight") {
        (H, H)
    } else if name.ends_with("q_proj.weight") {
        (NH * D, H)
    } else if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") {
        (NKV * D, H)
    } else if name.ends_with("o_proj.weight") {
        (H, NH * D)
    } else if name.ends_with("down_proj.weight") {
        (H, F)
    } else {
        (F, H)
    }
}

fn load(spec: &ModelSpec) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack(dir.path(), spec);
    let pack = Pack::open(dir.path(), false).expect("open");
    (dir, Model::load(pack).expect("load"))
}

#[test]
fn the_tiled_tied_head_rescores_its_best_candidates_with_the_exact_head() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_a, exact) = load(&sp);
    assert_eq!(
        exact.head_rescore(),
        0,
        "a bf16 head has nothing to re-score"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack_with(dir.path(), &sp, true, false);
    let mut tiled = Model::load(Pack::open(dir.path(), false).expect("open")).expect("load");
    let toks = [1u32, 5, 9, 33, 7];
    let run = |m: &Model| {
        let mut s = m.session(16);
        m.forward(&mut s, &toks, true).expect("forward")
    };
    let want = run(&exact);
    assert_eq!(tiled.set_head_rescore(0), 0);
    let plain = run(&tiled);
    // Every candidate re-scored: the exact head's logits.
    assert_eq!(
        tiled.set_head_rescore(usize::MAX),
        V,
        "capped at the vocabulary"
    );
    let all = run(&tiled);
    let range = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    for (i, (a, b)) in all.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-5 * range, "logit {i}: {a} vs {b}");
    }
    // Five: the tiled head's five best of each token become exact, the rest keep their values.
    tiled.set_head_rescore(5);
    let five = run(&tiled);
    for t in 0..toks.len() {
        let row = |v: &[f32]| v[t * V..(t + 1) * V].to_vec();
        let (p, f, w) = (row(&plain), row(&five), row(&want));
        let mut order: Vec<usize> = (0..V).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        for (rank, &i) in order.iter().enumerate() {
            if rank < 5 {
                assert!((f[i] - w[i]).abs() <= 1e-5 * range, "token {t} best {rank}");
            } else {
                assert_eq!(f[i].to_bits(), p[i].to_bits(), "token {t} rank {rank}");
            }
        }
        assert_ne!(p, w, "the random tiles are not the embedding");
    }
    // An untied model's tiles are the head: nothing to re-score against.
    let mut untied = sp.clone();
    untied.tied_head = false;
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack_with(dir.path(), &untied, true, false);
    let mut m = Model::load(Pack::open(dir.path(), false).expect("open")).expect("load");
    assert_eq!(m.head_rescore(), 0);
    assert_eq!(m.set_head_rescore(8), 0);
}

#[test]
fn a_scan_head_ranks_and_the_exact_head_scores() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_a, exact) = load(&sp);
    let (plain_dir, with_scan) = (
        tempfile::tempdir().expect("t"),
        tempfile::tempdir().expect("t"),
    );
    write_pack_with(plain_dir.path(), &sp, true, false);
    write_pack_with(with_scan.path(), &sp, true, true);
    let mut plain = Model::load(Pack::open(plain_dir.path(), false).expect("open")).expect("load");
    let mut m = Model::load(Pack::open(with_scan.path(), false).expect("open")).expect("load");
    let check = m.self_check().expect("self-check");
    assert_eq!(
        check.matrices,
        plain.self_check().expect("self-check").matrices + 1,
        "the scan head is self-checked"
    );
    let toks = [1u32, 5, 9, 33, 7];
    let run = |m: &Model, reads_top: usize| {
        let mut s = m.session(16);
        s.read_top(reads_top);
        m.forward(&mut s, &toks, true).expect("forward")
    };
    let want = run(&exact, 0);
    let range = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    let argmax = |v: &[f32]| {
        (0..v.len())
            .max_by(|&a, &b| v[a].total_cmp(&v[b]))
            .expect("non-empty")
    };
    // A reader of the whole distribution never gets the scan: the tiled head's numbers.
    m.set_head_rescore(4);
    plain.set_head_rescore(4);
    assert_eq!(run(&m, 0), run(&plain, 0));
    // A greedy reader: the scan ranks, four candidates are exact, the rest −∞, and each
    // token's choice is the exact head's.
    let got = run(&m, 1);
    for t in 0..toks.len() {
        let (g, w) = (&got[t * V..(t + 1) * V], &want[t * V..(t + 1) * V]);
        assert_eq!(g.iter().filter(|v| v.is_finite()).count(), 4, "token {t}");
        for (i, (&a, &b)) in g.iter().zip(w).enumerate() {
            assert!(
                a == f32::NEG_INFINITY || (a - b).abs() <= 1e-5 * range,
                "[{t}][{i}]"
            );
        }
        assert_eq!(argmax(g), argmax(w), "token {t}");
    }
    // A top-8 reader needs more than the four candidates: the tiled head again.
    assert_eq!(run(&m, 8), run(&plain, 8));
    // Every candidate re-scored: exactly the exact head, whatever ranked them.
    m.set_head_rescore(V);
    for (i, (a, b)) in run(&m, 1).iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-5 * range, "logit {i}: {a} vs {b}");
    }
}

/// The f32s of `v` as bits, for exact comparisons.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `toks` run as one batched prefill and as single steps, each in a fresh 32-token session:
/// (batch session, step session, batch logits, step logits), every position's logits.
fn prefill_and_steps(m: &Model, toks: &[u32]) -> (Session, Session, Vec<f32>, Vec<f32>) {
    let mut batch = m.session(32);
    let all = m.forward(&mut batch, toks, true).expect("batch");
    let mut step = m.session(32);
    let mut singles = Vec::new();
    for &t in toks {
        singles.extend(m.forward(&mut step, &[t], true).expect("step"));
    }
    (batch, step, all, singles)
}

#[test]
fn batched_prefill_leaves_exactly_the_logits_and_kv_of_single_steps() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_d, m) = load(&sp);
    let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
    let (batch, step, all, singles) = prefill_and_steps(&m, &toks);
    assert_eq!(bits(&all), bits(&singles), "logits");
    for l in 0..sp.layers.len() {
        assert_eq!(bits(batch.keys(l)), bits(step.keys(l)), "keys of layer {l}");
        assert_eq!(
            bits(batch.values(l)),
            bits(step.values(l)),
            "values of layer {l}"
        );
    }
    // Prefill then one step equals the same tokens in one batch.
    let mut a = m.session(32);
    m.forward(&mut a, &toks[..5], false).expect("prefix");
    let tail = m.forward(&mut a, &toks[5..], true).expect("rest");
    assert_eq!(bits(&tail), bits(&all[5 * V..]));
}

#[test]
fn a_mixed_batch_of_sequences_gives_each_exactly_its_single_sequence_numbers() {
    let sp = spec(QkNorm::AfterRope, Act::Silu, false);
    let (_d, m) = load(&sp);
    let prompts: [&[u32]; 3] = [&[1, 5, 9], &[2, 40, 41, 42, 8], &[7]];
    // Alone: each prompt, then two decode steps.
    let mut alone = Vec::new();
    for p in prompts {
        let mut s = m.session(16);
        let mut l = m.forward(&mut s, p, false).expect("prefill");
        l.extend(m.forward(&mut s, &[11], false).expect("step"));
        l.extend(m.forward(&mut s, &[12], false).expect("step"));
        alone.push((l, s));
    }
    // Together: sequence 0 and 1 prefilled, then a batch with their decode rows and sequence
    // 2's whole prompt, then one more batch of three decode rows.
    let (mut a, mut b, mut c) = (m.session(16), m.session(16), m.session(16));
    let mut got = [Vec::new(), Vec::new(), Vec::new()];
    got[0] = m.forward(&mut a, prompts[0], false).expect("a");
    got[1] = m.forward(&mut b, prompts[1], false).expect("b");
    let rows = [(0, 11), (1, 11), (2, 7)];
    let l = m
        .forward_batch(&mut [&mut a, &mut b, &mut c], &rows, &[0, 1, 2])
        .expect("mixed");
    got[0].extend(&l[..V]);
    got[1].extend(&l[V..2 * V]);
    got[2] = l[2 * V..].to_vec();
    let rows = [(2, 11), (0, 12), (1, 12)];
    let l = m
        .forward_batch(&mut [&mut a, &mut b, &mut c], &rows, &[0, 1, 2])
        .expect("decode");
    got[2].extend(&l[..V]);
    got[0].extend(&l[V..2 * V]);
    got[1].extend(&l[2 * V..]);
    got[2].extend(m.forward(&mut c, &[12], false).expect("c"));
    for (i, (s, (want, ws))) in [&a, &b, &c].iter().zip(&alone).enumerate() {
        assert_eq!(bits(&got[i]), bits(want), "logits of sequence {i}");
        assert_eq!(s.pos, ws.pos, "position of sequence {i}");
        for l in 0..sp.layers.len() {
            assert_eq!(bits(s.keys(l)), bits(ws.keys(l)), "keys {i}/{l}");
            assert_eq!(bits(s.values(l)), bits(ws.values(l)), "values {i}/{l}");
        }
    }
    // A batch that overflows one sequence's context is refused before any cache changes.
    let mut full = m.session(2);
    let mut other = m.session(8);
    let err = m
        .forward_batch(
            &mut [&mut full, &mut other],
            &[(1, 1), (0, 1), (0, 2), (0, 3)],
            &[0],
        )
        .expect_err("overflow");
    assert!(err.to_string().contains("2-token context"), "{err}");
    assert_eq!((full.pos, other.pos), (0, 0));
}

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

#[test]
fn unverified_packs_are_refused_unless_allowed() {
    let sp = spec(QkNorm::Off, Act::Silu, false);
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack(dir.path(), &sp);
    let mpath = dir.path().join("manifest.json");
    let mut man: Manifest =
        serde_json::from_slice(&std::fs::read(&mpath).expect("read")).expect("json");
    man.verification = Verification {
        verified: false,
        summary: "1 of 30 tensors failed: lm_head.weight".into(),
        repaired: Vec::new(),
    };
    std::fs::write(&mpath, serde_json::to_vec(&man).expect("json")).expect("write");
    let e = Pack::open(dir.path(), false).expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("not verified") && msg.contains("lm_head.weight"),
        "{msg}"
    );
    assert!(Pack::open(dir.path(), true).is_ok());
}

/// Records every kernel an NPU engine is asked for, computing with the emulator.
#[derive(Default)]
struct Recording(std::sync::Mutex<Vec<String>>);

impl crate::npu::backend::Engine for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn gemm(
        &self,
        w: &QMatrix<'_>,
        shape: crate::npu::backend::Shape,
        acts: &[u8],
    ) -> crate::error::Result<Vec<u8>> {
        let name = crate::npu::backend::kernel_name(
            shape.m as u64,
            shape.k_padded as u64,
            shape.n_padded as u64,
        );
        self.0.lock().expect("lock").push(name);
        crate::npu::backend::Emulator.gemm(w, shape, acts)
    }
}

#[test]
fn the_npu_run_loop_through_marshalled_buffers_gives_the_host_logits() {
    use crate::npu::backend::NpuBackend;
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_d, host) = load(&sp);
    let (_d2, mut npu) = load(&sp);
    let engine = std::sync::Arc::new(NpuBackend::new(Recording::default(), 4));
    npu.set_backend(engine.clone());
    assert_eq!(npu.backend_name(), "npu recording");
    let toks: Vec<u32> = vec![1, 4, 8, 15, 16, 23, 42];
    let (mut hs, mut ns) = (host.session(16), npu.session(16));
    // A 7-token prefill (GEMM chunks of 4 and 3 rows) then one decode step (GEMV).
    let mut want = host.forward(&mut hs, &toks, true).expect("host");
    want.extend(host.forward(&mut hs, &[5], true).expect("host step"));
    let mut got = npu.forward(&mut ns, &toks, true).expect("npu");
    got.extend(npu.forward(&mut ns, &[5], true).expect("npu step"));
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // bf16 activations and results on the NPU path, int8 activations on the host.
        assert!((g - w).abs() <= 0.03 * scale, "logit {i}: {g} vs {w}");
    }
    for t in 0..=toks.len() {
        let arg = |v: &[f32]| crate::sample::argmax(&v[t * V..(t + 1) * V]);
        assert_eq!(arg(&got), arg(&want), "token {t}");
    }
    let calls = engine.engine().0.lock().expect("lock").clone();
    let per_layer = 7;
    let layers = sp.layers.len();
    // Prefill: 2 chunks × 7 products per layer; the step: the same once. (This pack's head is
    // the tied bf16 embedding, a host product.)
    assert_eq!(calls.len(), 3 * per_layer * layers, "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("gemm_4x")), "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("gemv_1x")), "{calls:?}");
}

#[test]
fn second_moments_are_collected_once_per_input_and_agree_with_the_column_sums() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_d, m) = load(&sp);
    m.collect_stats(true);
    assert!(
        m.forward(&mut m.session(16), &[1, 4, 8, 15, 16], true)
            .expect("forward")
            .is_empty()
    );
    let stats = m.take_stats();
    let q = &stats["model.layers.0.self_attn.q_proj.weight"];
    let v = &stats["model.layers.0.self_attn.v_proj.weight"];
    let (gq, gv) = (
        q.gram.as_ref().expect("gram"),
        v.gram.as_ref().expect("gram"),
    );
    assert!(std::sync::Arc::ptr_eq(gq, gv), "q/k/v share one input");
    let k = q.sum_sq.len();
    assert_eq!((q.rows, gq.len()), (5, k * k));
    for i in 0..k {
        assert!((gq[i * k + i] - q.sum_sq[i]).abs() <= 1e-4 * (1.0 + q.sum_sq[i]));
        for j in 0..i {
            assert_eq!(gq[i * k + j], gq[j * k + i], "symmetric");
        }
    }
    assert!(stats["lm_head.weight"].gram.is_some());
    // Without second moments only the column sums are kept.
    m.collect_stats(false);
    m.forward(&mut m.session(16), &[1, 4], true)
        .expect("forward");
    assert!(m.take_stats().values().all(|s| s.gram.is_none()));
}

#[test]
fn evaluate_scores_ids_as_given_or_with_bos_per_chunk() {
    let sp = spec(QkNorm::Off, Act::Silu, false);
    let (_dir, m) = load(&sp);
    // A sequence that does not start with BOS (1).
    let ids: Vec<u32> = vec![5, 9, 2, 7, 3, 11, 4, 8];
    let nll_of = |toks: &[u32]| -> f64 {
        let mut s = m.session(toks.len());
        let logits = m.forward(&mut s, toks, true).expect("forward");
        let v = m.spec.vocab;
        (toks.len() / 2..toks.len() - 1)
            .map(|i| {
                let row = &logits[i * v..(i + 1) * v];
                let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
                let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
                z.ln() + max - row[ids[i + 1] as usize] as f64
            })
            .sum()
    };
    let as_given = crate::generate::evaluate(&m, &ids, ids.len(), false, false).expect("eval");
    assert!((as_given.nll - nll_of(&ids)).abs() < 1e-9);
    let mut with_bos = ids.clone();
    with_bos[0] = 1;
    let replaced = crate::generate::evaluate(&m, &ids, ids.len(), false, true).expect("eval");
    assert!((replaced.nll - nll_of(&with_bos)).abs() < 1e-9);
    assert!(
        (as_given.nll - replaced.nll).abs() > 1e-6,
        "the first token changes the scores"
    );
}

/// Two sequences run interleaved in one batch and each alone; asserts each gets its
/// single-sequence logits and returns (interleaved, alone) sessions per sequence for the caller's
/// state checks.
fn interleaved_and_alone(m: &Model) -> [(Session, Session); 2] {
    let (mut x, mut y) = (m.session(16), m.session(16));
    let rows = [(0, 1), (1, 2), (0, 5), (1, 40), (0, 9), (1, 41)];
    let l = m
        .forward_batch(&mut [&mut x, &mut y], &rows, &[4, 5])
        .expect("mixed");
    let mut xs = m.session(16);
    let want_x = m.forward(&mut xs, &[1, 5, 9], false).expect("x alone");
    let mut ys = m.session(16);
    let want_y = m.forward(&mut ys, &[2, 40, 41], false).expect("y alone");
    assert_eq!(bits(&l[..V]), bits(&want_x));
    assert_eq!(bits(&l[V..]), bits(&want_y));
    [(x, xs), (y, ys)]
}

/// A hybrid of short-convolution and attention layers (LFM2's shape).
pub(crate) fn conv_spec() -> ModelSpec {
    let mut sp = spec(QkNorm::BeforeRope, Act::Silu, false);
    let conv = LayerSpec {
        window: None,
        rope: 0,
        mixer: Mixer::ShortConv { kernel: 3 },
    };
    sp.layers = vec![conv.clone(), sp.layers[1].clone(), conv];
    sp
}

#[test]
fn short_convolution_prefill_leaves_exactly_the_state_and_logits_of_single_steps() {
    let sp = conv_spec();
    let (_d, m) = load(&sp);
    let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
    let (batch, step, all, singles) = prefill_and_steps(&m, &toks);
    assert!(batch.has_recurrent_state());
    assert_eq!(bits(&all), bits(&singles), "logits");
    for l in [0, 2] {
        assert_eq!(batch.conv_state(l).len(), 2 * H, "two taps of state");
        assert!(batch.conv_state(l).iter().any(|v| *v != 0.0));
        assert_eq!(
            bits(batch.conv_state(l)),
            bits(step.conv_state(l)),
            "conv state {l}"
        );
        assert!(batch.keys(l).is_empty(), "a conv layer has no KV cache");
    }
    assert_eq!(
        bits(batch.keys(1)),
        bits(step.keys(1)),
        "keys of the attention layer"
    );
    // The state carries the history: the same last token after another prefix differs.
    let mut other = m.session(32);
    m.forward(&mut other, &[2, 4, 6], false)
        .expect("other prefix");
    let a = m.forward(&mut other, &[3], false).expect("a");
    let mut fresh = m.session(32);
    let b = m.forward(&mut fresh, &[3], false).expect("b");
    assert_ne!(bits(&a), bits(&b));
    // Two sequences in one batch, interleaved: each gets its single-sequence numbers and state.
    let [(mut x, xs), (y, ys)] = interleaved_and_alone(&m);
    for li in [0, 2] {
        assert_eq!(bits(x.conv_state(li)), bits(xs.conv_state(li)));
        assert_eq!(bits(y.conv_state(li)), bits(ys.conv_state(li)));
    }
    // A refused pass leaves the state as it was.
    let before = bits(x.conv_state(0));
    m.forward(&mut x, &[1, V as u32], false)
        .expect_err("a token outside the vocabulary");
    assert_eq!(bits(x.conv_state(0)), before);
    assert_eq!(x.pos, 3);
}

#[test]
fn a_context_reset_clears_the_recurrent_state() {
    let sp = conv_spec();
    let (_d, m) = load(&sp);
    let mut s = m.session(16);
    let first = m.forward(&mut s, &[1, 5, 9, 33], true).expect("first");
    // Recurrent state cannot be rewound: truncating into the history starts afresh.
    assert_eq!(s.truncate(2), 0);
    assert_eq!(s.pos, 0);
    assert!(s.conv_state(0).iter().all(|v| *v == 0.0));
    let again = m.forward(&mut s, &[1, 5, 9, 33], true).expect("again");
    assert_eq!(first, again, "a reset session is a fresh one");
    assert_eq!(s.truncate(0), 0);
    assert!(s.conv_state(2).iter().all(|v| *v == 0.0));
    // Without recurrent layers, truncation keeps the prefix.
    let (_e, attn) = load(&spec(QkNorm::BeforeRope, Act::Silu, false));
    let mut t = attn.session(16);
    attn.forward(&mut t, &[1, 5, 9, 33], false).expect("attn");
    assert!(!t.has_recurrent_state());
    assert_eq!(t.truncate(2), 2);
    assert!(
        m.session_bytes(16) < attn.session_bytes(16),
        "two conv layers hold 2×H floats, not a KV cache"
    );
}

/// A Qwen3.5-shaped hybrid: gated-DeltaNet layers around a gated attention layer, the value heads
/// in `order`.
pub(crate) fn delta_spec(order: ValueHeadOrder) -> ModelSpec {
    let mut sp = spec(QkNorm::BeforeRope, Act::Silu, false);
    let gdn = LayerSpec {
        window: None,
        rope: 0,
        mixer: Mixer::GatedDeltaNet {
            key_heads: GDN_NK,
            key_dim: GDN_DK,
            value_heads: GDN_NV,
            value_dim: GDN_DV,
            kernel: 4,
            value_order: order,
        },
    };
    sp.layers = vec![gdn.clone(), sp.layers[1].clone(), gdn];
    sp.attn_output_gate = true;
    sp
}

#[test]
fn gated_deltanet_prefill_leaves_exactly_the_state_and_logits_of_single_steps() {
    let sp = delta_spec(ValueHeadOrder::Tiled);
    let (_d, m) = load(&sp);
    let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
    let (batch, step, all, singles) = prefill_and_steps(&m, &toks);
    assert!(batch.has_recurrent_state());
    assert_eq!(bits(&all), bits(&singles), "logits");
    for l in [0, 2] {
        assert_eq!(batch.conv_state(l).len(), 3 * GDN_C, "three taps of q/k/v");
        assert_eq!(batch.ssm_state(l).len(), GDN_NV * GDN_DK * GDN_DV);
        assert!(batch.ssm_state(l).iter().any(|v| *v != 0.0));
        assert_eq!(
            bits(batch.conv_state(l)),
            bits(step.conv_state(l)),
            "conv {l}"
        );
        assert_eq!(bits(batch.ssm_state(l)), bits(step.ssm_state(l)), "ssm {l}");
        assert!(batch.keys(l).is_empty(), "a DeltaNet layer has no KV cache");
    }
    // Two sequences interleaved in one batch: each its single-sequence numbers and state.
    let [(mut x, xs), (y, ys)] = interleaved_and_alone(&m);
    for li in [0, 2] {
        assert_eq!(bits(x.ssm_state(li)), bits(xs.ssm_state(li)));
        assert_eq!(bits(y.ssm_state(li)), bits(ys.ssm_state(li)));
    }
    // A refused pass leaves the state; a reset clears it.
    let before = bits(x.ssm_state(0));
    m.forward(&mut x, &[1, V as u32], false)
        .expect_err("a token outside the vocabulary");
    assert_eq!(bits(x.ssm_state(0)), before);
    assert_eq!(x.truncate(1), 0);
    assert!(x.ssm_state(0).iter().all(|v| *v == 0.0));
    assert!(x.conv_state(2).iter().all(|v| *v == 0.0));
    // The value-head order is read: the same weights in the grouped order answer differently.
    let (_g, grouped) = load(&delta_spec(ValueHeadOrder::Grouped));
    let mut s = grouped.session(16);
    let other = grouped.forward(&mut s, &toks, true).expect("grouped");
    assert_ne!(bits(&other), bits(&all));
}

/// Every batch shape the scheduler builds is valid for every kernel: a prompt chunk that needs no
/// logits (zero head rows), decode rows only, and a mix of both, on packs with and without the
/// scan head and of each mixer kind. A chunk without logits returns none and leaves the same
/// caches and states as the prompt run whole.
#[test]
fn batches_with_no_logit_rows_advance_the_caches_and_return_no_logits() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let scan_dir = tempfile::tempdir().expect("t");
    write_pack_with(scan_dir.path(), &sp, true, true);
    let mut scan = Model::load(Pack::open(scan_dir.path(), false).expect("open")).expect("load");
    scan.set_head_rescore(4);
    let (_a, attn) = load(&sp);
    let (_c, conv) = load(&conv_spec());
    let (_d, delta) = load(&delta_spec(ValueHeadOrder::Tiled));
    let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
    for (name, m) in [
        ("scan head", &scan),
        ("attention", &attn),
        ("short convolution", &conv),
        ("gated deltanet", &delta),
    ] {
        for reads_top in [0, 1] {
            // Whole prompt at once.
            let mut whole = m.session(32);
            whole.read_top(reads_top);
            let want = m.forward(&mut whole, &toks, false).expect("whole");
            // The same prompt in chunks of 4, the first two asking for no logits.
            let mut chunked = m.session(32);
            chunked.read_top(reads_top);
            let rows = |ts: &[u32]| ts.iter().map(|&t| (0usize, t)).collect::<Vec<_>>();
            for chunk in [&toks[..4], &toks[4..8]] {
                let l = m
                    .forward_batch(&mut [&mut chunked], &rows(chunk), &[])
                    .expect("chunk without logits");
                assert!(l.is_empty(), "{name}: no rows wanted, no logits");
            }
            let got = m
                .forward_batch(&mut [&mut chunked], &rows(&toks[8..]), &[0])
                .expect("last chunk");
            assert_eq!(bits(&got), bits(&want), "{name} (reads {reads_top})");
            assert_eq!(chunked.pos, toks.len());
            // An empty batch is no pass at all.
            let none = m
                .forward_batch(&mut [&mut chunked], &[], &[])
                .expect("empty batch");
            assert!(none.is_empty());
            assert_eq!(chunked.pos, toks.len());
            // Decode rows of two sequences beside a chunk of a third that needs no logits: the
            // decode rows get their single-sequence numbers whatever the third reads.
            let mut other = m.session(32);
            other.read_top(1 - reads_top);
            let mut solo = chunked.clone();
            let alone = m.forward(&mut solo, &[11], false).expect("alone");
            let mut third = m.session(32);
            let mixed = m
                .forward_batch(
                    &mut [&mut chunked, &mut third, &mut other],
                    &[(0, 11), (1, 4), (1, 8), (2, 9)],
                    &[0, 3],
                )
                .expect("mixed");
            assert_eq!(
                bits(&mixed[..V]),
                bits(&alone),
                "{name}: decode row beside others"
            );
        }
    }
}
