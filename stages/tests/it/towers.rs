//! The vision tower of a Gemma 3 oracle (`tests/fixtures/towers/gemma3`, made by
//! `scripts/oracle/towers.py`): transformers' tiny model, llama.cpp's mmproj GGUF of it, and the
//! `vision_weight.q4nx` FastFlowLM's own converter made from that GGUF. Read with the block
//! geometry the shapes and the data give, verified value for value against the mmproj, and each
//! kind of wrong tower named: a transposed projector, another block geometry, a missing tensor.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use onebit_stages::format::gguf::GgufFile;
use onebit_stages::format::q4nx::Container;
use onebit_stages::format::q4nx::writer::{Entry, write_container};
use onebit_stages::layout::mm_block::MmBlock;
use onebit_stages::layout::{Layout, TensorLayout};
use onebit_stages::tower::detect::detect_tower;
use onebit_stages::tower::verify::verify_tower;
use onebit_stages::verify::Verdict;

use super::common::fixtures;

fn case() -> PathBuf {
    fixtures().join("towers").join("gemma3")
}

fn tower() -> Container {
    Container::open(&case().join("vision_weight.q4nx")).expect("tower")
}

fn mmproj() -> GgufFile {
    GgufFile::open(&case().join("mmproj-f16.gguf")).expect("mmproj")
}

const PROJECTOR: &str = "multi_modal_projector.mm_input_projection_weight";
const NARROW: MmBlock = MmBlock {
    mm_k: 256,
    mm_n: 64,
};

fn by_name(layouts: &[TensorLayout]) -> BTreeMap<&str, &TensorLayout> {
    layouts.iter().map(|l| (l.name.as_str(), l)).collect()
}

#[test]
fn the_converters_gemma3_tower_reads_in_256x64_blocks_and_matches_the_mmproj_bit_for_bit() {
    let (c, g) = (tower(), mmproj());
    let layouts = detect_tower(&c, None, "vision", Some(&g)).expect("detect");
    assert_eq!(layouts.len(), 39, "every tensor of the file");
    let l = by_name(&layouts);
    // The projector: text hidden (128) out, vision hidden (192) in, padded to 256 × 256.
    let p = l[PROJECTOR];
    assert_eq!((p.rows, p.k), (128, 192));
    assert_eq!(
        p.layout,
        Layout::MmBlock {
            block: NARROW,
            padded_rows: 256,
            padded_k: 256
        }
    );
    assert!(
        p.decision
            .contains("mmproj twin mm.input_projection.weight"),
        "{}",
        p.decision
    );
    // fc1: 320 out, 192 in; fc2 the other way.
    let fc1 = l["vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight"];
    assert_eq!((fc1.rows, fc1.k, fc1.layer), (320, 192, Some(1)));
    let fc2 = l["vision_tower.vision_model.encoder.layers.0.mlp.fc2.weight"];
    assert_eq!((fc2.rows, fc2.k), (192, 320));
    let blocked = layouts
        .iter()
        .filter(|l| matches!(l.layout, Layout::MmBlock { .. }))
        .count();
    assert_eq!(
        blocked, 13,
        "6 projections per layer and the input projection"
    );
    assert_eq!(
        l["vision_tower.vision_model.embeddings.patch_embedding.weight"].layout,
        Layout::Plain
    );

    let (rows, verdict) =
        verify_tower(&c, &layouts, Some(&g), "vision_weight.q4nx").expect("verify");
    assert!(verdict.verified, "{}", verdict.summary);
    assert_eq!(verdict.passed, 39);
    for r in &rows {
        assert_eq!(r.verdict, Verdict::Pass, "{}: {}", r.tensor, r.reason);
        assert_eq!(
            r.reason, "every value is bf16(mmproj) bit for bit",
            "{}",
            r.tensor
        );
    }
}

#[test]
fn without_an_mmproj_the_zero_padding_gives_the_same_reading_and_the_verdict_asks_for_one() {
    let (c, g) = (tower(), mmproj());
    let with = detect_tower(&c, None, "vision", Some(&g)).expect("detect");
    let without = detect_tower(&c, None, "vision", None).expect("detect");
    for (a, b) in with.iter().zip(&without) {
        assert_eq!(
            (&a.name, &a.layout, a.rows, a.k),
            (&b.name, &b.layout, b.rows, b.k)
        );
    }
    let p = by_name(&without)[PROJECTOR];
    assert!(
        p.decision.contains("non-zero extent 128x192"),
        "{}",
        p.decision
    );
    let (rows, verdict) = verify_tower(&c, &without, None, "vision_weight.q4nx").expect("verify");
    assert!(!verdict.verified);
    assert!(
        verdict.summary.contains("give --mmproj GGUF"),
        "{}",
        verdict.summary
    );
    assert!(rows.iter().all(|r| r.verdict == Verdict::Skipped));
}

/// A copy of the tower with `replace` applied: a tensor's new bytes (`Some`) or its removal
/// (`None`).
fn edited(dir: &Path, replace: &[(&str, Option<Vec<u8>>)]) -> Container {
    let c = tower();
    let mut entries = Vec::new();
    let mut bytes = Vec::new();
    for t in c.tensors() {
        let data = match replace.iter().find(|(n, _)| *n == t.name) {
            Some((_, None)) => continue,
            Some((_, Some(b))) => b.clone(),
            None => c.data(t).to_vec(),
        };
        entries.push(Entry {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
        });
        bytes.push(data);
    }
    let path = dir.join("vision_weight.q4nx");
    write_container(&path, &entries, |i, w: &mut dyn Write| {
        Ok(w.write_all(&bytes[i])?)
    })
    .expect("write");
    Container::open(&path).expect("open")
}

/// The projector as the mmproj stores it (transformers' `[in, out]`), bf16 bits, 192 × 128.
fn projector_as_gguf() -> Vec<u16> {
    let g = mmproj();
    let t = g.tensor("mm.input_projection.weight").expect("projector");
    let mut v = Vec::new();
    g.rows_f32(t, 0, t.rows(), &mut v).expect("rows");
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect()
}

#[test]
fn a_projector_written_without_its_transpose_is_named_as_transposed() {
    let dir = tempfile::tempdir().expect("tmp");
    // The mmproj's [192, 128] blocked as if it were [out, in]: the same declared shape.
    let wrong = NARROW.encode(192, 128, &projector_as_gguf());
    let c = edited(dir.path(), &[(PROJECTOR, Some(wrong))]);
    let g = mmproj();
    let layouts = detect_tower(&c, None, "vision", Some(&g)).expect("detect");
    let (rows, verdict) =
        verify_tower(&c, &layouts, Some(&g), "vision_weight.q4nx").expect("verify");
    assert!(!verdict.verified);
    let r = rows.iter().find(|r| r.tensor == PROJECTOR).expect("row");
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(r.reason.starts_with("transposed:"), "{}", r.reason);
    assert!(verdict.summary.contains(PROJECTOR), "{}", verdict.summary);
    // Only the projector fails.
    assert_eq!(
        rows.iter().filter(|r| r.verdict == Verdict::Fail).count(),
        1
    );
}

#[test]
fn blocks_cut_the_other_way_are_named_as_a_wrong_block_geometry() {
    let dir = tempfile::tempdir().expect("tmp");
    let g = mmproj();
    let name = "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight";
    let t = g.tensor("v.blk.0.attn_q.weight").expect("q");
    let mut v = Vec::new();
    g.rows_f32(t, 0, t.rows(), &mut v).expect("rows");
    let bits: Vec<u16> = v
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    // 64 × 256 blocks (MM_K and MM_N swapped) under the declared shape of 256 × 64 ones.
    let swapped = MmBlock {
        mm_k: 64,
        mm_n: 256,
    }
    .encode(192, 192, &bits);
    let c = edited(dir.path(), &[(name, Some(swapped))]);
    let layouts = detect_tower(&c, None, "vision", Some(&g)).expect("detect");
    let (rows, _) = verify_tower(&c, &layouts, Some(&g), "vision_weight.q4nx").expect("verify");
    let r = rows.iter().find(|r| r.tensor == name).expect("row");
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.reason.starts_with("wrong block geometry: read as 256x64"),
        "{}",
        r.reason
    );
    assert!(r.reason.contains("as 64x256 it matches"), "{}", r.reason);
}

#[test]
fn a_tensor_missing_from_the_tower_is_named_with_its_mmproj_twin() {
    let dir = tempfile::tempdir().expect("tmp");
    let gone = "vision_tower.vision_model.encoder.layers.1.self_attn.k_proj.bias";
    let c = edited(dir.path(), &[(gone, None)]);
    let g = mmproj();
    let layouts = detect_tower(&c, None, "vision", Some(&g)).expect("detect");
    let (rows, verdict) =
        verify_tower(&c, &layouts, Some(&g), "vision_weight.q4nx").expect("verify");
    assert!(!verdict.verified);
    let r = rows
        .iter()
        .find(|r| r.tensor == gone)
        .expect("a row for the missing tensor");
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.reason,
        "missing from vision_weight.q4nx: the mmproj has v.blk.1.attn_k.bias"
    );
    assert!(
        verdict.summary.starts_with("refused: 1 of 38 tensors"),
        "{}",
        verdict.summary
    );
}

#[test]
fn a_tower_tensor_of_an_unknown_type_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = tower();
    let t = c.tensor(PROJECTOR).expect("projector");
    let path = dir.path().join("vision_weight.q4nx");
    let entries = vec![Entry {
        name: PROJECTOR.into(),
        dtype: onebit_stages::format::q4nx::Dtype::I8,
        shape: vec![t.nbytes()],
    }];
    write_container(&path, &entries, |_, w: &mut dyn Write| {
        Ok(w.write_all(c.data(t))?)
    })
    .expect("write");
    let err = detect_tower(&Container::open(&path).expect("open"), None, "vision", None)
        .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains(PROJECTOR) && msg.contains("dtype I8"), "{msg}");
}
