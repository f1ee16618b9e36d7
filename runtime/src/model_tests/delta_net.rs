//! Gated DeltaNet (`crate::model::delta_net`): prefill against single steps.

use onebit_pack::spec::ValueHeadOrder;

use crate::testing::*;

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
