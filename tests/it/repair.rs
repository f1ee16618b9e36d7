//! `--repair` and `repair --out`: tensors FastFlowLM's converter broke (an 8-bit source pushed
//! through its 4-bit packer: low nibbles kept, `m` = `d`) rebuilt from provable sources, verified
//! again, and answering like a pack converted correctly from the same GGUF.

use std::path::{Path, PathBuf};

use onebit_convert::ConvertOptions;
use onebit_pipeline::{NullReporter, RunOptions, RunReport, Store, run_graph};
use onebit_runtime::{Model, Pack};
use onebit_stages::format::q4nx::Container;
use onebit_stages::format::tiles::TileKind;
use onebit_stages::verify::PackVerdict;
use onebit_stages::{ImportSource, import_graph};

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/q4nx")
        .join(case)
}

use super::support::run_in;

/// The tensors FastFlowLM's converter broke in `llama-q80` (its expected.json): the tied head and
/// every layer-0 projection, all from Q8_0 sources.
const BROKEN: [&str; 8] = [
    "lm_head.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
];

fn import(dir: &Path, reference: Option<&Path>, repair: bool, home: &Path) -> RunReport {
    let store = Store::open(home).expect("store");
    let source = ImportSource {
        dir: dir.to_path_buf(),
        reference: reference.map(Path::to_path_buf),
        mmproj: None,
        fetch: None,
        repair,
    };
    let graph =
        import_graph(&source, std::sync::Arc::new(onebit_runtime::HostKernels)).expect("graph");
    let opts = RunOptions {
        jobs: 2,
        ref_name: None,
        source: serde_json::json!({"dir": dir.display().to_string()}),
        deep_check: false,
    };
    run_graph(&store, &graph, &opts, &NullReporter).expect("import")
}

fn verdict(report: &RunReport, stage: &str) -> PackVerdict {
    let dir = report
        .artifact(stage, "verification")
        .expect("verification");
    serde_json::from_slice(&std::fs::read(dir.join("verdict.json")).expect("verdict"))
        .expect("json")
}

/// Logits at every position of `ids`, one batched prefill.
fn logits(pack: &Path, allow_unverified: bool, ids: &[u32]) -> Vec<f32> {
    let model =
        Model::load(Pack::open(pack, allow_unverified).expect("pack")).expect("model loads");
    let mut s = model.session(ids.len());
    model.forward(&mut s, ids, true).expect("forward")
}

/// max |a − b| and the positions (of `vocab` logits each) whose argmax differs where `b`'s top-2
/// margin exceeds 0.05.
fn compare(a: &[f32], b: &[f32], vocab: usize) -> (f32, Vec<usize>) {
    assert_eq!(a.len(), b.len());
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m })
    };
    let mut wrong = Vec::new();
    for (pos, (x, y)) in a.chunks(vocab).zip(b.chunks(vocab)).enumerate() {
        let (top, best) = argmax(y);
        let second = y
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != top)
            .map(|(_, &v)| v)
            .fold(f32::MIN, f32::max);
        if best - second > 0.05 && argmax(x).0 != top {
            wrong.push(pos);
        }
    }
    (max, wrong)
}

const IDS: [u32; 12] = [1, 17, 42, 99, 200, 311, 5, 77, 150, 260, 33, 8];

#[test]
fn without_repair_the_refusal_says_what_repair_would_rebuild_and_from_what() {
    let home = tempfile::tempdir().expect("tmp");
    let (dir, gguf) = (fixture("llama-q80"), fixture("llama-q80/model.gguf"));
    let out = run_in(
        home.path(),
        &[
            "run",
            "--path",
            dir.to_str().expect("utf8"),
            "--reference",
            gguf.to_str().expect("utf8"),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--repair would rebuild 8 tensors: lm_head.weight from the GGUF's token_embd.weight (Q8_0, requantized); model.layers.0.mlp.down_proj.weight from the GGUF's blk.0.ffn_down.weight (Q8_0, requantized)"),
        "{err}"
    );

    // Without the GGUF only the head has a provable source: the refusal says so, and --repair
    // refuses naming a tensor it cannot rebuild.
    let out = run_in(home.path(), &["run", "--path", dir.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--repair would rebuild 1 tensor: lm_head.weight from the pack's embedding model.embed_tokens.weight (tied head); --repair cannot rebuild model.layers.0.mlp.down_proj.weight (no provable source: not a tied head with a plain embedding, and no --reference GGUF)"),
        "{err}"
    );
    let out = run_in(
        home.path(),
        &["run", "--path", dir.to_str().expect("utf8"), "--repair"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "model.layers.0.mlp.down_proj.weight: --repair cannot rebuild it: no provable source"
        ),
        "{err}"
    );
}

#[test]
fn llama_q80_repaired_from_its_gguf_verifies_and_answers_like_a_correct_conversion() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (dir, gguf) = (fixture("llama-q80"), fixture("llama-q80/model.gguf"));
    let home = tmp.path().join("home");
    let report = import(&dir, Some(&gguf), true, &home);
    let v = verdict(&report, "repair");
    assert!(v.verified, "{}", v.summary);
    let mut names: Vec<&str> = v
        .repaired
        .iter()
        .map(|r| r.split(" <- ").next().unwrap_or(r))
        .collect();
    names.sort();
    assert_eq!(names, BROKEN, "{:?}", v.repaired);
    assert!(v.summary.starts_with("repaired 8 tensors"), "{}", v.summary);
    let repairs: Vec<onebit_stages::repair::Repaired> = serde_json::from_slice(
        &std::fs::read(report.artifact("repair", "repairs.json").expect("repairs")).expect("read"),
    )
    .expect("json");
    for r in &repairs {
        assert_eq!(r.kind, "Q41_5120", "{r:?}: the pack's own tile kind");
        assert_eq!(
            r.method, "requantized",
            "{r:?}: Q8_0 codes do not fit 4 bits"
        );
        assert!(r.rel_l2 < 0.12, "{r:?}");
    }
    let pack = report.artifact("repack", "pack").expect("pack").clone();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pack.join("manifest.json")).expect("manifest"))
            .expect("json");
    assert_eq!(
        manifest["verification"]["repaired"]
            .as_array()
            .map(Vec::len),
        Some(8),
        "{}",
        manifest["verification"]
    );

    // A pack converted correctly from the same GGUF (Q8_0 requantized, never truncated).
    let conv = tmp.path().join("converted");
    onebit_convert::convert(&gguf, &conv, &ConvertOptions::default()).expect("convert");
    // The same config and tokenizer on both sides: only the tensors are compared.
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(dir.join(f), conv.join(f)).expect("copy");
    }
    let good = import(&conv, Some(&gguf), false, &home);
    assert!(verdict(&good, "verify").verified);
    let good_pack = good.artifact("repack", "pack").expect("pack").clone();
    // Every repaired tensor is byte for byte what the correct conversion wrote.
    let (fixed, conv_c) = (
        Container::open(report.artifact("repair", "model.q4nx").expect("model")).expect("c"),
        Container::open(&conv.join("model.q4nx")).expect("c"),
    );
    for t in BROKEN {
        let (a, b) = (
            fixed.data(fixed.tensor(t).expect("tensor")),
            conv_c.data(conv_c.tensor(t).expect("tensor")),
        );
        assert!(
            a == b,
            "{t}: the repaired bytes differ from the converted ones"
        );
    }
    let vocab = 384;
    let (a, b) = (logits(&pack, false, &IDS), logits(&good_pack, false, &IDS));
    let (max, wrong) = compare(&a, &b, vocab);
    eprintln!("repaired vs converted: max |diff| {max:.4}, argmax differs at {wrong:?}");
    assert!(max <= 0.05, "max |diff| {max}");
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// Breaks `lm_head.weight` of a copy of `case` the way FastFlowLM's converter does (every `m`
/// plane slot set to its `d`, bit for bit); returns the copy's folder.
fn with_broken_head(case: &str, to: &Path) -> PathBuf {
    let from = fixture(case);
    std::fs::create_dir_all(to).expect("mkdir");
    for f in ["config.json", "tokenizer.json", "model.q4nx"] {
        std::fs::copy(from.join(f), to.join(f)).expect("copy");
    }
    let c = Container::open(&to.join("model.q4nx")).expect("container");
    let t = c.tensor("lm_head.weight").expect("head").clone();
    let start = (c.header().data_start() + t.begin) as usize;
    drop(c);
    let mut bytes = std::fs::read(to.join("model.q4nx")).expect("read");
    let kind = TileKind::Q41_5120;
    let l = kind.layout();
    let plane = 2 * l.rows * l.groups();
    for tile in bytes[start..start + t.nbytes() as usize].chunks_exact_mut(kind.bytes()) {
        let (d, rest) = tile.split_at_mut(plane);
        rest[..plane].copy_from_slice(d);
    }
    std::fs::write(to.join("model.q4nx"), bytes).expect("write");
    to.to_path_buf()
}

#[test]
fn a_broken_tied_head_is_repaired_from_the_embedding_with_no_gguf() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = with_broken_head("llama-q41", &tmp.path().join("broken"));
    let home = tmp.path().join("home");
    let plain = import(&dir, None, false, &home);
    let v = verdict(&plain, "verify");
    assert!(!v.failing.is_empty(), "{}", v.summary);
    assert_eq!(
        v.repair.as_deref(),
        Some(
            "--repair would rebuild 1 tensor: lm_head.weight from the pack's embedding model.embed_tokens.weight (tied head)"
        )
    );

    let fixed = import(&dir, None, true, &home);
    let v = verdict(&fixed, "repair");
    assert!(v.failing.is_empty(), "{}", v.summary);
    assert_eq!(
        v.repaired,
        ["lm_head.weight <- the pack's embedding model.embed_tokens.weight (tied head)"]
    );
    // Without a GGUF the other tensors stay unreferenced; the head's fit to the embedding passes.
    assert!(v.summary.contains("unverified"), "{}", v.summary);
    assert!(!v.unreferenced.contains(&"lm_head.weight".to_string()));

    // The repaired head answers like the original (unbroken) one.
    let original = import(&fixture("llama-q41"), None, false, &home);
    let (a, b) = (
        logits(fixed.artifact("repack", "pack").expect("pack"), true, &IDS),
        logits(
            original.artifact("repack", "pack").expect("pack"),
            true,
            &IDS,
        ),
    );
    let (max, wrong) = compare(&a, &b, 384);
    eprintln!("repaired head vs the original: max |diff| {max:.4}, argmax differs at {wrong:?}");
    assert!(max <= 0.05, "max |diff| {max}");
    assert!(wrong.is_empty(), "{wrong:?}");
}

#[test]
fn repair_out_writes_the_folder_identical_but_for_the_repaired_bytes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (dir, gguf) = (fixture("llama-q80"), fixture("llama-q80/model.gguf"));
    let home = tmp.path().join("home");
    let out = tmp.path().join("fixed");
    let run = run_in(
        &home,
        &[
            "repair",
            "--path",
            dir.to_str().expect("utf8"),
            "--reference",
            gguf.to_str().expect("utf8"),
            "--out",
            out.to_str().expect("utf8"),
        ],
    );
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        err.contains("REPAIRED lm_head.weight <- the GGUF's token_embd.weight (Q8_0, requantized)"),
        "{err}"
    );

    // Every file but model.q4nx byte for byte; model.q4nx byte for byte outside the repaired
    // tensors, and different inside each.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(names, written);
    for n in &names {
        let (a, b) = (
            std::fs::read(dir.join(n)).expect("read"),
            std::fs::read(out.join(n)).expect("read"),
        );
        if n != "model.q4nx" {
            assert!(a == b, "{n} differs");
            continue;
        }
        assert_eq!(a.len(), b.len());
        let c = Container::open(&dir.join(n)).expect("container");
        let ranges: Vec<(usize, usize)> = BROKEN
            .iter()
            .map(|t| {
                let i = c.tensor(t).expect("tensor");
                let s = (c.header().data_start() + i.begin) as usize;
                (s, s + i.nbytes() as usize)
            })
            .collect();
        for &(s, e) in &ranges {
            assert!(a[s..e] != b[s..e], "a repaired tensor kept its bytes");
        }
        let outside = (0..a.len()).filter(|&i| !ranges.iter().any(|&(s, e)| i >= s && i < e));
        let differing = outside.filter(|&i| a[i] != b[i]).count();
        assert_eq!(differing, 0, "bytes outside the repaired tensors changed");
    }

    // status lists the repairs of the ref.
    let status = run_in(&home, &["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("repaired 8 tensor(s):"), "{text}");
    assert!(
        text.contains(
            "lm_head.weight <- the GGUF's token_embd.weight (Q8_0, requantized), rel L2 0.07"
        ),
        "{text}"
    );
}
