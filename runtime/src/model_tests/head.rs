//! The head: a tiled tied head re-scores its best candidates against the exact bf16 head, and
//! a scan head ranks while the exact head scores (`onebit_kernels::head`).

use crate::model::Model;
use crate::pack::Pack;
use onebit_pack::spec::{Act, QkNorm};

use crate::testing::*;

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
