//! A request resumed from the prefix cache gets the logits of a cold run bit for bit, for every
//! mixer kind, at every place a cache can resume: its own end (the whole earlier exchange was
//! shared), the earlier prompt's end (recurrent layers' checkpoint), and inside the earlier
//! prompt (attention only; recurrent layers then start afresh).

use super::Pool;
use onebit_pack::spec::{Act, ModelSpec, QkNorm, ValueHeadOrder};
use onebit_runtime::model::Model;
use onebit_runtime::pack::Pack;
use onebit_runtime::testing::{V, conv_spec, delta_spec, spec, write_pack};

const CTX: usize = 64;

fn model(spec: &ModelSpec) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack(dir.path(), spec);
    let model = Model::load(Pack::open(dir.path(), false).expect("open")).expect("load");
    (dir, model)
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| {
            let x = (u64::from(seed) << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 40) % (V as u64 - 3) + 3) as u32
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Fills a one-slot pool as a finished request leaves it: `prompt` read (checkpoint taken at its
/// end), then `answer` fed one token at a time.
fn pool_after(m: &Model, prompt: &[u32], answer: &[u32]) -> Pool {
    let mut pool = Pool::new(m, 1, CTX, true);
    let mut t = pool.take(prompt).expect("a free cache");
    assert_eq!(t.reused, 0, "an empty pool reuses nothing");
    m.forward(&mut t.session, prompt, false).expect("prompt");
    let checkpoint = t.session.checkpoint();
    for &a in answer {
        m.forward(&mut t.session, &[a], false).expect("answer");
    }
    let mut held = prompt.to_vec();
    held.extend_from_slice(answer);
    // The last sampled token is never fed: what the scheduler hands back is longer than the cache.
    held.push(answer.last().copied().unwrap_or(3));
    pool.give(t.session, held, checkpoint);
    pool
}

/// Takes the cache for `next`, checks it reused `want` tokens, and checks the rest of `next` gives
/// the logits of a cold run.
fn check(name: &str, m: &Model, pool: &mut Pool, next: &[u32], want: usize) {
    let mut t = pool.take(next).expect("the cache is free");
    assert_eq!(t.reused, want, "{name}: reused tokens");
    assert_eq!(t.session.pos, want, "{name}: the cache's position");
    let warm = m
        .forward(&mut t.session, &next[want..], false)
        .expect("warm");
    let mut cold = m.session(CTX);
    let cold = m.forward(&mut cold, next, false).expect("cold");
    assert_eq!(
        bits(&warm),
        bits(&cold),
        "{name}: warm logits differ from cold"
    );
}

fn every_resume(kind: &str, sp: &ModelSpec, recurrent: bool) {
    let (_dir, m) = model(sp);
    let prompt = tokens(1, 24);
    let answer = tokens(2, 5);
    let turn2 = |tail: &[u32]| {
        let mut v = prompt.clone();
        v.extend_from_slice(&answer);
        v.extend_from_slice(tail);
        v
    };
    let held = prompt.len() + answer.len();

    // A next turn: the earlier prompt and answer, then more. Resumes at the cache's end.
    let next = turn2(&tokens(3, 9));
    check(
        &format!("{kind}, next turn"),
        &m,
        &mut pool_after(&m, &prompt, &answer),
        &next,
        held,
    );

    // The same prompt, another question: resumes at the prompt's end (the checkpoint).
    let mut other = prompt.clone();
    other.extend(tokens(4, 7));
    let p = prompt.len();
    check(
        &format!("{kind}, same prompt"),
        &m,
        &mut pool_after(&m, &prompt, &answer),
        &other,
        p,
    );

    // Only part of the prompt shared: attention cuts there, recurrent layers start afresh.
    let mut part = prompt[..10].to_vec();
    part.extend(tokens(5, 6));
    let want = if recurrent { 0 } else { 10 };
    check(
        &format!("{kind}, shared start"),
        &m,
        &mut pool_after(&m, &prompt, &answer),
        &part,
        want,
    );

    // The whole held exchange as the prompt: one token is always left to feed.
    let exact = turn2(&[]);
    let want = if recurrent { p } else { held - 1 };
    check(
        &format!("{kind}, exact"),
        &m,
        &mut pool_after(&m, &prompt, &answer),
        &exact,
        want,
    );

    // Nothing shared.
    check(
        &format!("{kind}, unrelated"),
        &m,
        &mut pool_after(&m, &prompt, &answer),
        &tokens(6, 12),
        0,
    );
}

#[test]
fn a_resumed_prompt_gets_the_cold_logits_bit_for_bit_with_attention() {
    every_resume(
        "attention",
        &spec(QkNorm::BeforeRope, Act::GeluTanh, true),
        false,
    );
}

#[test]
fn a_resumed_prompt_gets_the_cold_logits_bit_for_bit_with_a_short_convolution() {
    every_resume("short convolution", &conv_spec(), true);
}

#[test]
fn a_resumed_prompt_gets_the_cold_logits_bit_for_bit_with_a_gated_deltanet() {
    every_resume("gated deltanet", &delta_spec(ValueHeadOrder::Tiled), true);
}

/// With several caches free, a request takes the one sharing the longest prefix, and otherwise
/// the least recently used, so the prefixes used last survive longest.
#[test]
fn the_longest_shared_prefix_wins_and_otherwise_the_oldest_cache_goes() {
    let (_dir, m) = model(&spec(QkNorm::BeforeRope, Act::GeluTanh, true));
    let mut pool = Pool::new(&m, 3, CTX, true);
    let prompts = [tokens(10, 8), tokens(11, 8), tokens(12, 8)];
    let mut sessions = Vec::new();
    for p in &prompts {
        let mut t = pool.take(p).expect("free");
        m.forward(&mut t.session, p, false).expect("prompt");
        sessions.push(t.session);
    }
    for (s, p) in sessions.into_iter().zip(&prompts) {
        pool.give(s, p.clone(), None);
    }
    let mut second = prompts[1].clone();
    second.push(7);
    assert_eq!(
        pool.take(&second).expect("free").reused,
        8,
        "the matching cache"
    );
    // Unrelated: the oldest of the two left (prompt 0's) is the one overwritten.
    assert_eq!(pool.take(&tokens(13, 5)).expect("free").reused, 0);
    let mut third = prompts[2].clone();
    third.push(7);
    assert_eq!(
        pool.take(&third).expect("free").reused,
        8,
        "the newest survived"
    );
    assert!(pool.take(&third).is_none(), "no cache left");
}
