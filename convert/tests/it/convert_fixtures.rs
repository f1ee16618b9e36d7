//! The GGUF → NPU2 converter against FastFlowLM's own output (q4nx-format §9): tensor-for-tensor
//! byte identity where the reference converter is correct, a verified pack where it is broken
//! (llama-q80), requantization errors in range, and refusals by name.

use crate::common;

use std::path::{Path, PathBuf};

use onebit_convert::{ConvertOptions, TileChoice, convert};
use onebit_stages::format::gguf::GgufFile;
use onebit_stages::format::gguf::names::MapDims;
use onebit_stages::format::q4nx::Container;
use onebit_stages::layout::detect::detect_pack;
use onebit_stages::layout::geometry::Geometry;
use onebit_stages::verify::{VerifyDims, verify_pack};

fn gguf_of(case: &str) -> PathBuf {
    let dir = common::q4nx_case(case);
    if dir.join("model.gguf").is_file() {
        dir.join("model.gguf")
    } else {
        dir.join("..").join("model.gguf")
    }
}

fn convert_case(case: &str, tile: TileChoice, out: &Path) -> onebit_convert::ConvertReport {
    convert(
        &gguf_of(case),
        out,
        &ConvertOptions {
            tile,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"))
}

fn assert_tensors_identical(case: &str, ours: &Path) {
    let theirs = Container::open(&common::q4nx_case(case).join("model.q4nx")).expect("theirs");
    let ours = Container::open(&ours.join("model.q4nx")).expect("ours");
    let names = |c: &Container| {
        let mut v: Vec<String> = c.tensors().iter().map(|t| t.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&ours), names(&theirs), "{case}: tensor sets differ");
    for t in theirs.tensors() {
        let o = ours.tensor(&t.name).expect("same names");
        assert_eq!(o.dtype, t.dtype, "{case} {}: dtype", t.name);
        assert_eq!(o.shape, t.shape, "{case} {}: shape", t.name);
        assert_eq!(
            (o.begin, o.end),
            (t.begin, t.end),
            "{case} {}: offsets",
            t.name
        );
        let (a, b) = (ours.data(o), theirs.data(t));
        if a != b {
            let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
            panic!(
                "{case} {}: bytes differ first at {at} of {} (ours {:#04x}, theirs {:#04x})",
                t.name,
                b.len(),
                a[at],
                b[at]
            );
        }
    }
}

#[test]
fn converted_tensors_are_byte_identical_to_the_reference_converter() {
    for (case, tile) in [
        ("llama-q41", TileChoice::Q4_5120),
        ("llama-q40", TileChoice::Q4_5120),
        ("gemma3-q41-quarter/stock", TileChoice::Q4_5120),
        ("gemma3-q41-quarter/rb16", TileChoice::Q4_1280),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("repo");
        let r = convert_case(case, tile, &out);
        assert_tensors_identical(case, &out);
        assert!(
            r.tensors
                .iter()
                .filter(|t| t.stored_as != "BF16")
                .all(|t| t.method == "Native"),
            "{case}: every quantized tensor keeps its native codes"
        );
    }
}

#[test]
fn auto_picks_quarter_tiles_when_k_is_off_the_256_grid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let r = convert_case("gemma3-q41-quarter/rb16", TileChoice::Auto, &out);
    assert!(
        r.decisions[0].starts_with("tile=q4-1280 <- auto"),
        "{:?}",
        r.decisions
    );
    assert_tensors_identical("gemma3-q41-quarter/rb16", &out);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let r = convert_case("llama-q41", TileChoice::Auto, &out);
    assert!(
        r.decisions[0].starts_with("tile=q4-5120 <- auto"),
        "{:?}",
        r.decisions
    );
}

fn verify_dir(dir: &Path, gguf: &Path) -> onebit_stages::verify::PackVerdict {
    let c = Container::open(&dir.join("model.q4nx")).expect("open");
    let g = Geometry::from_file(&dir.join("config.json")).expect("config");
    let layouts = detect_pack(&c, Some(&g)).expect("detect");
    let gg = GgufFile::open(gguf).expect("gguf");
    let dims = VerifyDims {
        map: MapDims {
            hidden: g.hidden,
            heads: g.heads,
            rope_dim: g.head_dim,
            head_dim: g.head_dim,
        },
    };
    let (rows, v) =
        verify_pack(&c, &layouts, Some(&gg), &g.model_type, dims, 4096).expect("verify");
    assert!(v.verified, "{}: {}\n{rows:#?}", dir.display(), v.summary);
    v
}

#[test]
fn llama_q80_converts_correctly_where_the_reference_truncated_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let r = convert_case("llama-q80", TileChoice::Q4_5120, &out);
    // The 8 tensors the reference converter broke are requantized from their Q8_0 values.
    let requant: Vec<_> = r
        .tensors
        .iter()
        .filter(|t| t.method == "Requantized")
        .collect();
    assert_eq!(requant.len(), 8, "{requant:#?}");
    for t in &requant {
        assert_eq!(t.source_type, "Q8_0");
        // 4-bit min/max steps on these Gaussian blocks: step ≈ range/15 ≈ 0.27σ, so rms error
        // ≈ step/√12 ≈ 0.078σ.
        assert!(t.rel_l2 < 0.09, "{}: rel L2 {}", t.name, t.rel_l2);
    }
    verify_dir(&out, &gguf_of("llama-q80"));
}

#[test]
fn every_tile_choice_verifies_against_the_source() {
    // Each tile kind from the source type it holds natively (codes copied), plus the exact
    // Q4_0 → unsigned quarter-tile path and an 8-bit requantization of 4-bit values.
    for (case, tile, method, worst_rel) in [
        ("llama-q41", TileChoice::Q4_1280, "Native", 0.0065),
        ("llama-q40", TileChoice::Q4_1280, "Exact", 0.0025),
        ("llama-q40", TileChoice::Q4s4608, "Native", 0.0025),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("repo");
        let r = convert_case(case, tile, &out);
        for t in r.tensors.iter().filter(|t| t.stored_as != "BF16") {
            assert_eq!(t.method, method, "{case} {tile:?} {}", t.name);
            assert!(
                t.rel_l2 < worst_rel,
                "{case} {tile:?} {}: rel L2 {}",
                t.name,
                t.rel_l2
            );
        }
        verify_dir(&out, &gguf_of(case));
    }
    // 8-bit tiles: the requantization is near-lossless, and since the container cannot say which
    // 8704-byte code order it holds, detection without a reference refuses naming both readings.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let r = convert_case("llama-q41", TileChoice::Q8_8704, &out);
    assert!(
        r.tensors.iter().all(|t| t.rel_l2 < 0.01),
        "{:#?}",
        r.tensors
    );
    let c = Container::open(&out.join("model.q4nx")).expect("open");
    let g = Geometry::from_file(&out.join("config.json")).expect("config");
    let e = detect_pack(&c, Some(&g)).expect_err("undecidable without a reference");
    assert!(e.to_string().contains("Q8L_8704 and Q8C_8704"), "{e}");
}

#[test]
fn converted_repos_carry_config_tokenizer_and_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    convert_case("gemma3-q41-quarter/rb16", TileChoice::Auto, &out);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(cfg["model_type"], "gemma3_text");
    assert_eq!(cfg["hidden_size"], 640);
    assert_eq!(cfg["tie_word_embeddings"], true);
    let tc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("tokenizer_config.json")).expect("tokenizer_config"),
    )
    .expect("json");
    assert!(tc["eos_token_id"].is_array());
    assert_eq!(tc["bos_token"], "<bos>");
    let tpl = std::fs::read_to_string(out.join("chat_template.jinja")).expect("template");
    assert!(tpl.contains("<start_of_turn>"));
    // The semantics stage accepts what the converter wrote.
    let s = onebit_stages::stage::semantics::semantics_of_dir(&out).expect("semantics");
    assert!(s.log().contains("gemma3"), "{}", s.log());
}

/// The qwen35 fixture's GGUF through our converter: the same tensor names, shapes of rank 3 and
/// plain dtypes as FastFlowLM's own converter gave the same GGUF (its Q8_0 sources, which
/// FastFlowLM keeps 8-bit in Q8H_5120, are requantized into Q41_5120 here and said so).
#[test]
fn qwen35_converts_to_fastflowlms_tensor_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let report =
        convert(&gguf_of("qwen35-q80"), &out, &ConvertOptions::default()).expect("convert");
    let ours = onebit_stages::format::q4nx::Container::open(&out.join("model.q4nx")).expect("ours");
    let theirs = onebit_stages::format::q4nx::Container::open(
        &common::q4nx_case("qwen35-q80").join("model.q4nx"),
    )
    .expect("theirs");
    let names = |c: &onebit_stages::format::q4nx::Container| {
        c.tensors()
            .iter()
            .map(|t| (t.name.clone(), t.dtype.name().to_string(), t.shape.len()))
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(names(&ours), names(&theirs));
    for t in report
        .tensors
        .iter()
        .filter(|t| t.source_type == "Q8_0" && t.stored_as != "BF16")
    {
        assert_eq!(t.stored_as, "Q41_5120", "{}", t.name);
        assert_eq!(t.method, "Requantized", "{}", t.name);
    }
}

#[test]
fn unknown_families_and_full_folders_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let opts = ConvertOptions {
        family: Some("gemma4".into()),
        ..ConvertOptions::default()
    };
    let e = convert(&gguf_of("llama-q41"), &out, &opts).expect_err("gemma4 is not converted");
    let msg = e.to_string();
    assert!(
        msg.contains("general.architecture") && msg.contains("gemma4"),
        "{msg}"
    );
    std::fs::create_dir_all(&out).expect("mkdir");
    std::fs::write(out.join("keep.txt"), "mine").expect("write");
    let e = convert(&gguf_of("llama-q41"), &out, &ConvertOptions::default())
        .expect_err("non-empty folder");
    assert!(e.to_string().contains("not empty"), "{e}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).expect("kept"),
        "mine"
    );
}

#[test]
fn gpt2_vocabularies_tokenize_like_the_reference_converters_tokenizer() {
    // llama-q41's GGUF carries a byte-level BPE vocabulary with merges; FastFlowLM's converter
    // exported it as tokenizer.json. Both files must give the same ids on the same text.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    convert_case("llama-q41", TileChoice::Auto, &out);
    let ours = onebit_runtime::text::Text::load(&out.join("tokenizer.json"), None).expect("ours");
    let theirs = onebit_runtime::text::Text::load(
        &common::q4nx_case("llama-q41").join("tokenizer.json"),
        None,
    )
    .expect("theirs");
    let text =
        std::fs::read_to_string(common::fixtures().join("text/multilingual.txt")).expect("text");
    for line in text
        .lines()
        .chain(["the quick brown fox  jumps\tover 12345 lazy dogs."])
    {
        let (a, b) = (
            ours.encode(line, false).expect("encode"),
            theirs.encode(line, false).expect("encode"),
        );
        assert_eq!(a, b, "{line:?}");
        assert_eq!(ours.decode(&a).expect("decode"), line);
    }
}

#[test]
fn tile_for_overrides_the_tile_of_the_tensors_it_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("repo");
    let case = "gemma3-q41-quarter/rb16";
    let r = convert(
        &gguf_of(case),
        &out,
        &ConvertOptions {
            tile_for: vec![("lm_head".into(), TileChoice::Q8_8704)],
            ..Default::default()
        },
    )
    .expect("convert");
    for t in r.tensors.iter().filter(|t| t.stored_as != "BF16") {
        let want = if t.name.contains("lm_head") {
            "Q8C_8704"
        } else {
            "Q41_1280"
        };
        assert_eq!(t.stored_as, want, "{}", t.name);
    }
    assert!(
        r.decisions
            .iter()
            .any(|d| d == "tile[lm_head.weight]=Q8C_8704 <- --tile-for lm_head=Q8_8704"),
        "{:?}",
        r.decisions
    );
    // A pattern that names nothing is refused, not ignored.
    let out = dir.path().join("repo2");
    let e = convert(
        &gguf_of(case),
        &out,
        &ConvertOptions {
            tile_for: vec![("lm_haed".into(), TileChoice::Q8_8704)],
            ..Default::default()
        },
    )
    .expect_err("typo");
    assert!(e.to_string().contains("lm_haed"), "{e}");
    assert!(!out.exists());
}

#[test]
fn gptq_requantizes_with_calibration_and_still_verifies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let case = "llama-q80";
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/text/calibration.txt");
    let opts = |gptq: bool, calibrate: Vec<PathBuf>| ConvertOptions {
        tile: TileChoice::Q4_5120,
        calibrate,
        calibrate_tokens: 1024,
        gptq,
        ..Default::default()
    };
    let e = convert(
        &gguf_of(case),
        &dir.path().join("x"),
        &opts(true, Vec::new()),
    )
    .expect_err("GPTQ without calibration");
    assert!(e.to_string().contains("--calibrate"), "{e}");
    let out = dir.path().join("repo");
    let r = convert(&gguf_of(case), &out, &opts(true, vec![text])).expect("convert");
    let gptq: Vec<_> = r.tensors.iter().filter(|t| t.method == "Gptq").collect();
    // The 8 tensors that need requantization (Q8_0 → 4-bit) go through GPTQ; native ones do not.
    assert_eq!(gptq.len(), 8, "{:#?}", r.tensors);
    for t in &gptq {
        // GPTQ trades weight error for output error, so the weights stay near their source.
        assert!(t.rel_l2 < 0.15, "{}: rel L2 {}", t.name, t.rel_l2);
    }
    assert!(
        r.decisions.iter().any(|d| d.contains("drives GPTQ")),
        "{:?}",
        r.decisions
    );
    verify_dir(&out, &gguf_of(case));
}
