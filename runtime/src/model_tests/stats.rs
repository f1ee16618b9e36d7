//! Second moments (`crate::model::stats`) for calibration.

use onebit_pack::spec::{Act, QkNorm};

use crate::testing::*;

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
