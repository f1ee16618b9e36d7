//! Evaluation (`crate::generate::evaluate`): ids scored as given or with BOS per chunk.

use onebit_pack::spec::{Act, QkNorm};

use crate::testing::*;

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
