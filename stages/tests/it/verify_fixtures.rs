//! The verify stage's domain code on the golden fixtures against their source GGUFs
//! (verification.md §4, §6, format §9 step 6, 8, 9).

use crate::common;

use onebit_stages::format::gguf::GgufFile;
use onebit_stages::format::gguf::names::MapDims;
use onebit_stages::format::q4nx::Container;
use onebit_stages::format::tiles::TileKind;
use onebit_stages::layout::detect::detect_pack;
use onebit_stages::layout::geometry::Geometry;
use onebit_stages::layout::{Layout, TensorLayout};
use onebit_stages::verify::{PackVerdict, Verdict, VerifyDims, VerifyRow, verify_pack};

fn gguf_of(case: &str) -> std::path::PathBuf {
    let dir = common::q4nx_case(case);
    if dir.join("model.gguf").is_file() {
        dir.join("model.gguf")
    } else {
        dir.join("..").join("model.gguf")
    }
}

fn load(case: &str) -> (Container, Vec<TensorLayout>, Geometry) {
    let dir = common::q4nx_case(case);
    let c = Container::open(&dir.join("model.q4nx")).expect("open");
    let g = Geometry::from_file(&dir.join("config.json")).expect("config");
    let l = detect_pack(&c, Some(&g)).expect("detect");
    (c, l, g)
}

fn run(case: &str, edit: impl FnOnce(&mut Vec<TensorLayout>)) -> (Vec<VerifyRow>, PackVerdict) {
    let (c, mut layouts, g) = load(case);
    edit(&mut layouts);
    let gguf = GgufFile::open(&gguf_of(case)).expect("gguf");
    let dims = VerifyDims {
        map: MapDims {
            hidden: g.hidden,
            heads: g.heads,
            rope_dim: g.head_dim,
            head_dim: g.head_dim,
        },
    };
    verify_pack(&c, &layouts, Some(&gguf), &g.model_type, dims, 4096).expect("verify")
}

#[test]
fn the_correct_fixtures_verify_against_their_gguf() {
    for case in [
        "llama-q41",
        "llama-q40",
        "gemma3-q41-quarter/stock",
        "gemma3-q41-quarter/rb16",
        "qwen35-q80",
    ] {
        let (rows, v) = run(case, |_| {});
        assert!(
            v.verified,
            "{case}: {}\n{:#?}",
            v.summary,
            rows.iter()
                .filter(|r| r.verdict != Verdict::Pass && r.verdict != Verdict::Candidate)
                .collect::<Vec<_>>()
        );
        for r in rows.iter().filter(|r| {
            r.verdict == Verdict::Pass && r.reading != "plain" && r.reference.starts_with("gguf:")
        }) {
            // Same-source references: q4nx-format §9 step 6 ranges.
            let corr = r.corr.expect("corr");
            assert!(corr >= 0.99997, "{case} {}: corr {corr}", r.tensor);
            assert!(
                r.rel_l2.expect("rel") < 0.0067,
                "{case} {}: rel L2 {:?}",
                r.tensor,
                r.rel_l2
            );
        }
    }
}

#[test]
fn llama_q80_is_refused_naming_the_head_and_every_layer_0_projection() {
    let (rows, v) = run("llama-q80", |_| {});
    assert!(!v.verified);
    let failing: Vec<&str> = v
        .failing
        .iter()
        .map(|f| f.split(" (").next().unwrap_or(f))
        .collect();
    let mut want = vec!["lm_head.weight".to_string()];
    for p in [
        "mlp.down_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "self_attn.k_proj",
        "self_attn.o_proj",
        "self_attn.q_proj",
        "self_attn.v_proj",
    ] {
        want.push(format!("model.layers.0.{p}.weight"));
    }
    let mut got: Vec<String> = failing.iter().map(|s| s.to_string()).collect();
    got.sort();
    got.dedup();
    want.sort();
    assert_eq!(got, want, "{}", v.summary);
    assert!(
        v.summary
            .starts_with("refused: 8 of 21 tensors fail verification: "),
        "{}",
        v.summary
    );
    // Their GGUF correlation is about 0.1, as documented.
    for r in rows
        .iter()
        .filter(|r| r.reference.starts_with("gguf:") && r.verdict == Verdict::Fail)
    {
        let corr = r.corr.expect("corr");
        assert!((0.09..0.125).contains(&corr), "{}: {corr}", r.tensor);
        assert!(
            r.reason.starts_with("structural: broken conversion"),
            "{}",
            r.reason
        );
    }
    // The layer-1 tensors and the embedding pass.
    assert!(rows.iter().any(
        |r| r.tensor == "model.layers.1.self_attn.q_proj.weight" && r.verdict == Verdict::Pass
    ));
    assert!(
        rows.iter()
            .any(|r| r.tensor == "model.embed_tokens.weight" && r.verdict == Verdict::Pass)
    );
}

#[test]
fn tie_fit_numbers_match_the_golden_table() {
    // verification.md §6 golden table: (corr, a, rms ratio, rel, floor).
    for (case, want) in [
        (
            "llama-q41",
            (0.999983, 0.999994, 0.999989, 0.005604, 0.002885, true),
        ),
        (
            "llama-q40",
            (0.999999, 1.000005, 0.999994, 0.000853, 0.065351, true),
        ),
        (
            "llama-q80",
            (0.104590, 0.280231, 0.201644, 1.009992, 0.088708, false),
        ),
        (
            "gemma3-q41-quarter/stock",
            (0.999982, 0.999973, 1.000009, 0.005918, 0.002886, true),
        ),
        (
            "gemma3-q41-quarter/rb16",
            (0.999982, 0.999973, 1.000009, 0.005918, 0.002886, true),
        ),
        (
            "qwen35-q80",
            (0.999997, 0.999998, 0.999999, 0.001853, 0.088494, true),
        ),
    ] {
        let (rows, _) = run(case, |_| {});
        let tie = rows
            .iter()
            .find(|r| r.reference.starts_with("embedding:"))
            .expect("tie row");
        let close = |a: Option<f64>, b: f64, tol: f64| (a.expect("metric") - b).abs() <= tol;
        assert!(close(tie.corr, want.0, 2e-4), "{case} corr {:?}", tie.corr);
        assert!(close(tie.scale, want.1, 2e-3), "{case} a {:?}", tie.scale);
        assert!(
            close(tie.rms_ratio, want.2, 2e-3),
            "{case} rms {:?}",
            tie.rms_ratio
        );
        assert!(
            close(tie.rel_l1, want.3, 2e-3),
            "{case} rel {:?}",
            tie.rel_l1
        );
        assert!(
            close(tie.floor, want.4, 2e-3),
            "{case} floor {:?}",
            tie.floor
        );
        assert_eq!(
            tie.verdict == Verdict::Pass,
            want.5,
            "{case}: {}",
            tie.reason
        );
        if want.5 {
            assert!(tie.reason.starts_with("head fit: corr "), "{}", tie.reason);
        }
    }
}

#[test]
fn a_deliberately_wrong_reading_is_refused_with_its_correlation() {
    // Read llama-q41's v_proj as signed (Q40_5120): the golden wrong-signedness correlation is −0.41.
    let (rows, v) = run("llama-q41", |ls| {
        let l = ls
            .iter_mut()
            .find(|l| l.name == "model.layers.0.self_attn.v_proj.weight")
            .expect("v_proj");
        if let Layout::Tiled { kind, .. } = &mut l.layout {
            *kind = TileKind::Q40_5120;
        }
    });
    assert!(!v.verified);
    let r = rows
        .iter()
        .find(|r| {
            r.tensor == "model.layers.0.self_attn.v_proj.weight" && r.verdict == Verdict::Fail
        })
        .expect("refused");
    let corr = r.corr.expect("corr");
    assert!((-0.45..-0.35).contains(&corr), "{corr}");
    assert!(
        r.reason.contains(&format!("corr {corr:.6} < 0.999"))
            || r.reason.contains(&format!("corr {corr:.4} < 0.95")),
        "{}",
        r.reason
    );
    assert!(
        v.summary.contains("model.layers.0.self_attn.v_proj.weight"),
        "{}",
        v.summary
    );
    // The candidate table shows the right reading next to it.
    let cand = rows
        .iter()
        .find(|r| {
            r.tensor == "model.layers.0.self_attn.v_proj.weight" && r.verdict == Verdict::Candidate
        })
        .expect("candidate");
    assert_eq!(cand.reading, "Q41_5120");
    assert!(cand.corr.expect("corr") > 0.9999);
}

#[test]
fn without_a_reference_nothing_counts_as_verified() {
    let (c, layouts, g) = load("llama-q41");
    let dims = VerifyDims {
        map: MapDims {
            hidden: g.hidden,
            heads: g.heads,
            rope_dim: g.head_dim,
            head_dim: g.head_dim,
        },
    };
    let (rows, v) = verify_pack(&c, &layouts, None, "llama", dims, 4096).expect("verify");
    assert!(!v.verified);
    assert!(
        v.summary
            .starts_with("unverified: 20 of 21 tensors have no reference"),
        "{}",
        v.summary
    );
    assert!(
        rows.iter()
            .any(|r| r.verdict == Verdict::Skipped && r.reason.starts_with("NO_REF"))
    );
}
