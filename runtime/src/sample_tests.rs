//! The sampler against its definitions.

use super::*;

#[test]
fn parameters_no_sampler_can_honour_are_refused_by_name() {
    let base = SamplerConfig::default();
    assert!(base.check().is_ok());
    let field = |c: SamplerConfig| match c.check() {
        Err(crate::Error::Request { field, .. }) => field,
        other => panic!("not refused: {other:?}"),
    };
    for t in [f32::NAN, f32::INFINITY, -0.5] {
        assert_eq!(
            field(SamplerConfig {
                temperature: t,
                ..base.clone()
            }),
            "temperature"
        );
    }
    for p in [0.0, f32::NAN, 1.5, -1.0] {
        assert_eq!(
            field(SamplerConfig {
                top_p: p,
                ..base.clone()
            }),
            "top_p"
        );
    }
    for r in [0.0, f32::NAN, f32::INFINITY, -1.0, 1e-300f64 as f32] {
        assert_eq!(
            field(SamplerConfig {
                repetition_penalty: r,
                ..base.clone()
            }),
            "repetition_penalty"
        );
    }
}

#[test]
fn greedy_takes_the_argmax() {
    let mut s = Sampler::new(SamplerConfig::default());
    assert_eq!(s.pick(&mut [0.1, 3.0, 2.0], &[], 0), 1);
}

#[test]
fn repetition_penalty_demotes_seen_tokens() {
    let mut s = Sampler::new(SamplerConfig {
        repetition_penalty: 2.0,
        ..Default::default()
    });
    assert_eq!(s.pick(&mut [0.0, 3.0, 2.0], &[1], 0), 2);
}

#[test]
fn top_k_one_is_greedy_and_seeds_repeat() {
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_k: 1,
        ..Default::default()
    };
    let mut s = Sampler::new(cfg);
    assert_eq!(s.pick(&mut [0.5, 0.4, 2.0], &[], 0), 2);
    let draw = |seed| {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            seed,
            ..Default::default()
        });
        (0..20)
            .map(|_| s.pick(&mut [1.0, 1.0, 1.0, 1.0], &[], 0))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

#[test]
fn sampling_follows_the_distribution_with_or_without_truncation() {
    // p ∝ [e², e¹, e⁰, e⁰]; counts over 4000 draws within a few percent of the truth.
    let logits = [2.0f32, 1.0, 0.0, 0.0];
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    for (top_k, top_p) in [(0, 1.0), (4, 1.0), (0, 0.999)] {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k,
            top_p,
            seed: 11,
            ..Default::default()
        });
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[s.pick(&mut logits.clone(), &[], 0) as usize] += 1;
        }
        for (c, l) in counts.iter().zip(logits) {
            let want = l.exp() / z;
            let got = *c as f32 / 4000.0;
            assert!((got - want).abs() < 0.03, "k={top_k} p={top_p}: {counts:?}");
        }
    }
    // A nucleus beyond the first selection (300 equal tokens, p = 0.9) widens until it holds.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_p: 0.9,
        seed: 2,
        ..Default::default()
    });
    let flat = vec![0.0f32; 300];
    let picks: std::collections::BTreeSet<u32> = (0..3000)
        .map(|_| s.pick(&mut flat.clone(), &[], 0))
        .collect();
    assert!(
        picks.len() > 256 && picks.iter().all(|&i| i < 272),
        "{}",
        picks.len()
    );
}

#[test]
fn top_p_keeps_the_nucleus() {
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_p: 0.5,
        seed: 3,
        ..Default::default()
    });
    // p ≈ [0.88, 0.12, …]: the nucleus at 0.5 is the first token alone.
    for _ in 0..20 {
        assert_eq!(s.pick(&mut [4.0, 2.0, 0.0, 0.0], &[], 0), 0);
    }
}

/// Deterministic pseudo-random logits in roughly [−8, 8].
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut s = Sampler::new(SamplerConfig {
        seed,
        ..Default::default()
    });
    (0..n).map(|_| (s.next_f32() - 0.5) * 16.0).collect()
}

/// The definitions, in f64 over the whole vocabulary, one step at a time (transformers' order:
/// each truncation zeroes what it drops and renormalizes).
mod reference {
    use super::SamplerConfig;

    /// OpenAI's logit bias and presence/frequency penalties, llama.cpp's repetition penalty and
    /// window.
    pub fn adjust(logits: &[f32], c: &SamplerConfig, seen: &[u32], prompt: usize) -> Vec<f64> {
        let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        for &(t, b) in &c.logit_bias {
            l[t as usize] += f64::from(b);
        }
        if c.repeat_last_n == 0 {
            return l;
        }
        let from = seen.len().saturating_sub(c.repeat_last_n);
        for (j, lj) in l.iter_mut().enumerate() {
            let in_window = seen[from..].contains(&(j as u32));
            let sampled = (from..seen.len())
                .filter(|&i| i >= prompt && seen[i] == j as u32)
                .count() as f64;
            if in_window {
                let rp = f64::from(c.repetition_penalty);
                // The f32 rounding of the division, as the sampler computes it.
                *lj = f64::from(if *lj > 0.0 {
                    *lj as f32 / rp as f32
                } else {
                    *lj as f32 * rp as f32
                });
            }
            *lj -= sampled * f64::from(c.frequency_penalty)
                + if sampled > 0.0 {
                    f64::from(c.presence_penalty)
                } else {
                    0.0
                };
        }
        l
    }

    fn normalize(p: &mut [f64]) {
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= z);
    }

    /// Keeps the shortest prefix of `order` whose probability reaches `mass`.
    fn nucleus(p: &mut [f64], order: &[usize], mass: f64) {
        let mut acc = 0.0;
        let mut keep = true;
        for &i in order {
            if keep {
                acc += p[i];
                keep = acc < mass;
            } else {
                p[i] = 0.0;
            }
        }
        normalize(p);
    }

    /// The probability of each token after temperature and every truncation.
    pub fn distribution(l: &[f64], c: &SamplerConfig) -> Vec<f64> {
        let t = f64::from(c.temperature);
        let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut p: Vec<f64> = l.iter().map(|&x| ((x - max) / t).exp()).collect();
        normalize(&mut p);
        let desc = |p: &[f64]| {
            let mut o: Vec<usize> = (0..p.len()).collect();
            o.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            o
        };
        if c.top_k > 0 {
            for &i in desc(&p).iter().skip(c.top_k) {
                p[i] = 0.0;
            }
            normalize(&mut p);
        }
        if c.top_p < 1.0 {
            let o = desc(&p);
            nucleus(&mut p, &o, f64::from(c.top_p));
        }
        if c.min_p > 0.0 {
            let floor = f64::from(c.min_p) * p.iter().cloned().fold(0.0, f64::max);
            p.iter_mut().filter(|x| **x < floor).for_each(|x| *x = 0.0);
            normalize(&mut p);
        }
        if c.typical_p < 1.0 {
            let h: f64 = p.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum();
            let d = |x: f64| {
                if x > 0.0 {
                    (-x.ln() - h).abs()
                } else {
                    f64::INFINITY
                }
            };
            let mut o: Vec<usize> = (0..p.len()).collect();
            o.sort_by(|&a, &b| d(p[a]).total_cmp(&d(p[b])).then(a.cmp(&b)));
            nucleus(&mut p, &o, f64::from(c.typical_p));
        }
        p
    }
}

/// The sampler's candidates as a probability per token.
fn kept(s: &Sampler, l: &[f32]) -> Vec<f64> {
    let v = s.candidates(l);
    let z: f64 = v.iter().map(|x| f64::from(x.1)).sum();
    let mut p = vec![0.0; l.len()];
    for (t, w) in v {
        p[t as usize] = f64::from(w) / z;
    }
    p
}

#[test]
fn every_truncation_keeps_what_its_definition_keeps_with_its_probabilities() {
    let base = SamplerConfig {
        temperature: 0.8,
        ..Default::default()
    };
    let configs = [
        SamplerConfig {
            min_p: 0.05,
            ..base.clone()
        },
        SamplerConfig {
            min_p: 0.3,
            temperature: 1.7,
            ..base.clone()
        },
        SamplerConfig {
            typical_p: 0.9,
            ..base.clone()
        },
        SamplerConfig {
            typical_p: 0.2,
            temperature: 2.0,
            ..base.clone()
        },
        SamplerConfig {
            top_k: 40,
            top_p: 0.95,
            min_p: 0.02,
            typical_p: 0.8,
            ..base.clone()
        },
        SamplerConfig {
            top_p: 0.5,
            min_p: 0.1,
            ..base.clone()
        },
        SamplerConfig {
            top_k: 300,
            typical_p: 0.95,
            temperature: 1.3,
            ..base.clone()
        },
    ];
    for (i, c) in configs.iter().enumerate() {
        for seed in 0..4 {
            // 3,000 tokens: wider than the first selection of 256, as a vocabulary is.
            let l = logits(3000, seed * 31 + i as u64);
            let want = reference::distribution(&reference::adjust(&l, c, &[], 0), c);
            let got = kept(&Sampler::new(c.clone()), &l);
            let (wn, gn) = (
                want.iter().filter(|&&p| p > 0.0).count(),
                got.iter().filter(|&&p| p > 0.0).count(),
            );
            assert_eq!(
                gn, wn,
                "config {i} seed {seed}: kept {gn} tokens, the definition {wn}"
            );
            for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 + 1e-4 * w,
                    "config {i} seed {seed} token {t}: {g} against {w}"
                );
            }
        }
    }
}

#[test]
fn bias_and_penalties_follow_their_definitions_over_the_window() {
    // A prompt of 6 tokens, then an answer of 7 that repeats some of them and itself.
    let seen = [3u32, 5, 7, 5, 9, 11, 3, 5, 5, 2, 7, 2, 5];
    let prompt = 6;
    let l = logits(16, 7);
    let base = SamplerConfig::default();
    let configs = [
        SamplerConfig {
            presence_penalty: 0.7,
            ..base.clone()
        },
        SamplerConfig {
            frequency_penalty: 0.45,
            ..base.clone()
        },
        SamplerConfig {
            presence_penalty: -0.5,
            frequency_penalty: 1.5,
            repetition_penalty: 1.3,
            ..base.clone()
        },
        SamplerConfig {
            presence_penalty: 0.7,
            frequency_penalty: 0.45,
            repetition_penalty: 1.3,
            repeat_last_n: 4,
            ..base.clone()
        },
        SamplerConfig {
            presence_penalty: 0.7,
            repeat_last_n: 0,
            logit_bias: vec![(4, -100.0), (0, 2.5)],
            ..base.clone()
        },
    ];
    for (i, c) in configs.iter().enumerate() {
        let want = reference::adjust(&l, c, &seen, prompt);
        let mut got = l.clone();
        Sampler::new(c.clone()).adjust(&mut got, &seen, prompt);
        for (t, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() < 1e-5,
                "config {i} token {t}: {g} against {w}"
            );
        }
        // Greedy takes the argmax of the adjusted logits.
        let mut greedy = l.clone();
        let best = want
            .iter()
            .enumerate()
            .fold(
                (0, f64::NEG_INFINITY),
                |b, (t, &x)| if x > b.1 { (t, x) } else { b },
            )
            .0;
        assert_eq!(
            Sampler::new(c.clone()).pick(&mut greedy, &seen, prompt) as usize,
            best,
            "config {i}"
        );
    }
    // A bias of −100 bans a token even from a sampler at temperature 2 …
    let mut s = Sampler::new(SamplerConfig {
        temperature: 2.0,
        logit_bias: vec![(1, -100.0)],
        seed: 9,
        ..base.clone()
    });
    assert!((0..2000).all(|_| s.pick(&mut [0.0, 3.0, 0.0], &[], 0) != 1));
    // … and the tokens it moves are read exactly (no top-only head).
    assert_eq!(
        SamplerConfig {
            logit_bias: vec![(1, 1.0)],
            ..base.clone()
        }
        .reads_top(),
        0
    );
}

#[test]
fn draws_follow_the_truncated_distribution() {
    let c = SamplerConfig {
        temperature: 1.0,
        min_p: 0.2,
        typical_p: 0.95,
        seed: 17,
        ..Default::default()
    };
    let l = [2.0f32, 1.5, 1.0, 0.2, -1.0, -3.0];
    let want = reference::distribution(&reference::adjust(&l, &c, &[], 0), &c);
    let mut s = Sampler::new(c);
    let mut counts = [0usize; 6];
    for _ in 0..20_000 {
        counts[s.pick(&mut l.clone(), &[], 0) as usize] += 1;
    }
    for (t, (&n, w)) in counts.iter().zip(&want).enumerate() {
        let got = n as f64 / 20_000.0;
        assert!(
            (got - w).abs() < 0.015,
            "token {t}: {got} against {w} ({counts:?})"
        );
    }
}

#[test]
fn new_fields_outside_their_ranges_are_refused_by_name() {
    let base = SamplerConfig::default();
    let field = |c: SamplerConfig| match c.check() {
        Err(crate::Error::Request { field, .. }) => field,
        other => panic!("not refused: {other:?}"),
    };
    for (c, name) in [
        (
            SamplerConfig {
                min_p: 1.5,
                ..base.clone()
            },
            "min_p",
        ),
        (
            SamplerConfig {
                typical_p: 0.0,
                ..base.clone()
            },
            "typical_p",
        ),
        (
            SamplerConfig {
                presence_penalty: f32::NAN,
                ..base.clone()
            },
            "presence_penalty",
        ),
        (
            SamplerConfig {
                frequency_penalty: f32::INFINITY,
                ..base.clone()
            },
            "frequency_penalty",
        ),
        (
            SamplerConfig {
                logit_bias: vec![(3, f32::NAN)],
                ..base.clone()
            },
            "logit_bias",
        ),
    ] {
        assert_eq!(field(c), name);
    }
}
