//! Bad input is refused with a message naming the file, the tensor and both readings; nothing is
//! silently accepted. Messages are checked word for word where the wording is the contract.

use crate::common;

use onebit_stages::format::q4nx::{Container, Header};
use onebit_stages::format::tiles::TileCodec;
use onebit_stages::layout::detect::detect_pack;
use onebit_stages::layout::geometry::Geometry;
use serde_json::json;

fn fixture_bytes(case: &str) -> Vec<u8> {
    std::fs::read(common::q4nx_case(case).join("model.q4nx")).expect("read fixture")
}

fn parse_err(bytes: &[u8]) -> String {
    match Header::parse(std::path::Path::new("bad.q4nx"), bytes) {
        Ok(_) => panic!("accepted a bad header"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn one_byte_short_names_the_tensor_and_the_sizes() {
    let mut b = fixture_bytes("llama-q41");
    b.pop();
    let msg = parse_err(&b);
    // The last tensor in offset order is an I8 tile tensor ending at the file's end.
    assert!(msg.starts_with("bad.q4nx: "), "{msg}");
    assert!(msg.contains("out of range: the data buffer holds"), "{msg}");
}

#[test]
fn header_problems_are_named() {
    assert_eq!(
        parse_err(&[1, 2, 3]),
        "bad.q4nx: file is 3 bytes, shorter than the 8-byte header length"
    );
    let mut b = 200u64.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    assert_eq!(
        parse_err(&b),
        "bad.q4nx: header length 200 runs past the end of the file (10 bytes)"
    );
    let b = u64::MAX.to_le_bytes().to_vec();
    assert!(parse_err(&b).contains("exceeds the 100000000-byte limit"));
    let mut b = 4u64.to_le_bytes().to_vec();
    b.extend_from_slice(&[b'{', 0xff, b'}', b' ']);
    assert!(parse_err(&b).contains("header is not UTF-8"));
}

fn container_bytes(header: serde_json::Value, data_len: usize) -> Vec<u8> {
    let h = serde_json::to_vec(&header).expect("json");
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&h);
    b.extend(std::iter::repeat_n(0u8, data_len));
    b
}

#[test]
fn overlaps_and_wrong_byte_counts_are_refused() {
    let b = container_bytes(
        json!({
            "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [4, 12]}
        }),
        12,
    );
    assert_eq!(
        parse_err(&b),
        "bad.q4nx: b: data_offsets [4, 12) overlap a at [0, 8)"
    );
    let b = container_bytes(
        json!({"w": {"dtype": "I8", "shape": [1, 5120], "data_offsets": [0, 4608]}}),
        4608,
    );
    assert_eq!(
        parse_err(&b),
        "bad.q4nx: w: holds 4608 bytes, but I8 × [1, 5120] needs 5120"
    );
}

#[test]
fn gaps_between_tensors_are_accepted() {
    let b = container_bytes(
        json!({
            "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [64, 72]}
        }),
        72,
    );
    let h =
        Header::parse(std::path::Path::new("gap.q4nx"), &b).expect("aligned writers leave gaps");
    assert_eq!(h.tensors.len(), 2);
}

fn detect_with_config(case: &str, patch: serde_json::Value) -> String {
    let dir = common::q4nx_case(case);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config"))
            .expect("json");
    for (k, v) in patch.as_object().expect("patch") {
        cfg[k] = v.clone();
    }
    let g = Geometry::from_config(&cfg).expect("geometry");
    let c = Container::open(&dir.join("model.q4nx")).expect("open");
    match detect_pack(&c, Some(&g)) {
        Ok(_) => panic!("accepted a pack that disagrees with its config"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tiles_narrower_than_k_are_refused_as_a_disagreement() {
    // The config claims K = 512 for every hidden-wide projection; the tiles hold 256 columns.
    let msg = detect_with_config("llama-q41", json!({"hidden_size": 512}));
    assert!(
        msg.contains("model.layers.0.self_attn.q_proj.weight: declared [8, 5120] = 8 tiles; config.json geometry 256x512 (q_proj) needs 8x2 = 16 Q41_5120 tiles or 8x2 = 16 Q40_5120 tiles or 8x4 = 32 Q8H_5120 tiles: config.json and model.q4nx disagree"),
        "{msg}"
    );
}

#[test]
fn rows_off_the_grid_with_live_pad_rows_are_refused() {
    // Vocab 380: lm_head's last row block would have to carry 4 zero pad rows; it carries data.
    let msg = detect_with_config("llama-q41", json!({"vocab_size": 380}));
    assert!(
        msg.contains("lm_head.weight: 380 rows are off the 32-row grid of Q41_5120 and the pad rows 380..384 do not decode to 0"),
        "{msg}"
    );
}

#[test]
fn unknown_and_unreadable_widths_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("model.q4nx");
    common::write_q4nx(
        &p,
        &[
            (
                "model.layers.0.mlp.up_proj.weight",
                "I8",
                vec![1, 5632],
                vec![0; 5632],
            ),
            (
                "model.layers.0.mlp.down_proj.weight",
                "I8",
                vec![1, 4266],
                vec![0; 4266],
            ),
        ],
    );
    let c = Container::open(&p).expect("open");
    let msg = detect_pack(&c, None).expect_err("refuse").to_string();
    assert!(msg.contains("model.layers.0.mlp.up_proj.weight: declared row width 5632 is a known FastFlowLM tile size (4-bit + zero-point + bias) with no reader"), "{msg}");
    assert!(
        msg.contains(
            "model.layers.0.mlp.down_proj.weight: declared row width 4266 (I8) is not a tile kind"
        ),
        "{msg}"
    );
    assert!(msg.contains("2 tensors"), "{msg}");
}

#[test]
fn a_4608_tile_declared_as_5120_is_never_silently_accepted() {
    // 32x256 geometry: one 4608-byte Q40_4608 tile, declared with the 5120 width.
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("model.q4nx");
    let mut bytes = vec![0u8; 5120];
    for s in 0..256 {
        // Finite positive bf16 scales, then arbitrary codes.
        bytes[2 * s..2 * s + 2].copy_from_slice(&(0x3C00u16 | (s as u16 % 127)).to_le_bytes());
    }
    for (i, b) in bytes.iter_mut().enumerate().take(4608).skip(512) {
        *b = (i * 7 % 251) as u8;
    }
    common::write_q4nx(
        &p,
        &[(
            "model.layers.0.self_attn.o_proj.weight",
            "I8",
            vec![1, 5120],
            bytes.clone(),
        )],
    );
    let cfg = json!({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 1, "head_dim": 256, "vocab_size": 32});
    let g = Geometry::from_config(&cfg).expect("geometry");
    let c = Container::open(&p).expect("open");
    let layouts = detect_pack(&c, Some(&g)).expect("a 5120-byte grid fits");
    // It fits the 5120 grid, so it is read as a 5120 kind: the values must differ from the 4608
    // reading of the same bytes, visibly.
    let kind = layouts[0].kind().expect("tiled");
    assert_ne!(kind, onebit_stages::format::tiles::TileKind::Q40_4608);
    let mut as5120 = vec![0f32; 32 * 256];
    kind.decode(&bytes, &mut as5120);
    let mut as4608 = vec![0f32; 32 * 256];
    onebit_stages::format::tiles::TileKind::Q40_4608.decode(&bytes[..4608], &mut as4608);
    let r = onebit_stages::stats::pearson(&as5120, &as4608);
    assert!(
        r.abs() < 0.5,
        "two readings of one tile correlate {r}: indistinguishable"
    );
    // And with the honest 4608 byte count but a 5120 declaration, the header refuses.
    common::write_q4nx(&p, &[("w", "I8", vec![1, 5120], bytes[..4608].to_vec())]);
    let err = Container::open(&p).err().expect("refused").to_string();
    assert!(
        err.ends_with("w: holds 4608 bytes, but I8 × [1, 5120] needs 5120"),
        "{err}"
    );
}

#[test]
fn eight_bit_orders_without_a_reference_are_refused_naming_both() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("model.q4nx");
    common::write_q4nx(
        &p,
        &[(
            "model.layers.0.mlp.down_proj.weight",
            "I8",
            vec![1, 8704],
            vec![1; 8704],
        )],
    );
    let cfg = json!({"model_type": "llama", "hidden_size": 32, "intermediate_size": 256,
        "num_attention_heads": 1, "vocab_size": 32});
    let g = Geometry::from_config(&cfg).expect("geometry");
    let c = Container::open(&p).expect("open");
    let msg = detect_pack(&c, Some(&g)).expect_err("refuse").to_string();
    assert!(msg.contains("8704-byte tiles admit Q8L_8704 and Q8C_8704 and no in-pack reference decides between them; supply a GGUF of this model"), "{msg}");
}
