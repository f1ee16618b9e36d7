//! Short convolution (`crate::model::short_conv`): prefill against single steps, and a context
//! reset.

use onebit_pack::spec::{Act, QkNorm};

use crate::testing::*;

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
        bits(&batch.keys(1)),
        bits(&step.keys(1)),
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
