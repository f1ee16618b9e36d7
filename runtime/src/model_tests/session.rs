//! Batching (`crate::model::session`): a batched prefill against single steps, sequences mixed
//! in one batch against each alone, batches with no logit rows; bit for bit.

use crate::model::Model;
use crate::pack::Pack;
use onebit_pack::spec::{Act, QkNorm, ValueHeadOrder};

use crate::testing::*;

#[test]
fn batched_prefill_leaves_exactly_the_logits_and_kv_of_single_steps() {
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_d, m) = load(&sp);
    let toks: Vec<u32> = vec![1, 5, 9, 33, 7, 7, 60, 12, 3];
    let (batch, step, all, singles) = prefill_and_steps(&m, &toks);
    assert_eq!(bits(&all), bits(&singles), "logits");
    for l in 0..sp.layers.len() {
        assert_eq!(
            bits(&batch.keys(l)),
            bits(&step.keys(l)),
            "keys of layer {l}"
        );
        assert_eq!(
            bits(&batch.values(l)),
            bits(&step.values(l)),
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
            assert_eq!(bits(&s.keys(l)), bits(&ws.keys(l)), "keys {i}/{l}");
            assert_eq!(bits(&s.values(l)), bits(&ws.values(l)), "values {i}/{l}");
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
