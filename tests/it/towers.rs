//! A repository with a vision tower, end to end through `onebit-pipe`: `convert --mmproj` writes
//! the tower FastFlowLM's converter writes (byte for byte, `tests/fixtures/towers/gemma3`); `run
//! --mmproj` reads, tabulates and verifies it beside the language model; `status`, `sql` and the
//! pack's manifest say what it is; a tower that fails leaves the language model verified and
//! answering, as text only.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use super::support::{oracle, run_in};

fn towers() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/towers/gemma3")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// The Gemma 3 oracle's language model and the tower oracle's mmproj, converted together.
fn converted(tmp: &Path, home: &Path) -> PathBuf {
    let repo = tmp.join("repo");
    let gguf = oracle("gemma3").join("model-q4_1.gguf");
    let mmproj = towers().join("mmproj-f16.gguf");
    ok(&run_in(
        home,
        &[
            "convert",
            "--gguf",
            s(&gguf),
            "--mmproj",
            s(&mmproj),
            "--out",
            s(&repo),
        ],
    ));
    repo
}

#[test]
fn convert_mmproj_writes_the_tower_fastflowlms_converter_writes_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tmp");
    let repo = converted(tmp.path(), &tmp.path().join("home"));
    let ours = std::fs::read(repo.join("vision_weight.q4nx")).expect("ours");
    let theirs = std::fs::read(towers().join("vision_weight.q4nx")).expect("theirs");
    assert_eq!(ours.len(), theirs.len());
    assert!(
        ours == theirs,
        "vision_weight.q4nx differs from FastFlowLM's"
    );
    let config: Value =
        serde_json::from_slice(&std::fs::read(repo.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(config["vision_model_weight"], "vision_weight.q4nx");
    assert_eq!(config["vision_config"]["vision_MM_K"], 256);
    assert_eq!(config["vision_config"]["vision_MM_N"], 64);
    assert_eq!(config["vision_config"]["hidden_size"], 192);
    assert_eq!(config["mm_tokens_per_image"], 4);
}

#[test]
fn run_with_mmproj_verifies_the_tower_and_a_failing_tower_leaves_text_usable() {
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    let repo = converted(tmp.path(), &home);
    let gguf = oracle("gemma3").join("model-q4_1.gguf");
    let mmproj = towers().join("mmproj-f16.gguf");
    let run = |dir: &Path| {
        run_in(
            &home,
            &[
                "run",
                "--path",
                s(dir),
                "--reference",
                s(&gguf),
                "--mmproj",
                s(&mmproj),
            ],
        )
    };
    ok(&run(&repo));
    let status = ok(&run_in(&home, &["status"]));
    assert!(
        status.contains("tower vision_weight.q4nx: verified: 39 tensors of vision_weight.q4nx pass against the mmproj (not served:"),
        "{status}"
    );
    for stage in [
        "detect:vision_weight.q4nx",
        "dequant:vision_weight.q4nx",
        "verify:vision_weight.q4nx",
    ] {
        assert!(status.contains(stage), "{stage} in status:\n{status}");
    }
    let sql = ok(&run_in(
        &home,
        &[
            "sql",
            "--format",
            "json",
            "SELECT file, count(*) AS n, sum(CASE WHEN verdict = 'pass' THEN 1 ELSE 0 END) AS passed FROM verification GROUP BY file ORDER BY file",
        ],
    ));
    let rows: Vec<Value> = serde_json::from_str(&sql).expect("json rows");
    let tower = rows
        .iter()
        .find(|r| r["file"] == "vision_weight.q4nx")
        .unwrap_or_else(|| panic!("tower rows in {sql}"));
    assert_eq!(
        (tower["n"].as_u64(), tower["passed"].as_u64()),
        (Some(39), Some(39))
    );
    assert!(rows.iter().any(|r| r["file"] == "model.q4nx"), "{sql}");

    // The pack carries the tower and its verdict.
    let store = onebit_pipeline::Store::open(&home).expect("store");
    let record = onebit_pipeline::refs::read_ref(&store, "local/repo")
        .expect("ref")
        .expect("the pack's ref");
    let repack = record.stage("repack").expect("repack stage");
    let pack = store.artifact_path(&repack.key, "pack");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(pack.join("manifest.json")).expect("manifest"))
            .expect("json");
    let t = &manifest["towers"][0];
    assert_eq!(
        (t["file"].as_str(), t["verified"].as_bool()),
        (Some("vision_weight.q4nx"), Some(true))
    );
    assert_eq!(t["served"], false);
    assert!(pack.join("vision_weight.q4nx").is_file());

    // A tower whose projector was written without its transpose: refused by name; the language
    // model still verifies and answers.
    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).expect("mkdir");
    for f in std::fs::read_dir(&repo).expect("ls") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, broken.join(f.file_name().expect("name"))).expect("copy");
    }
    transpose_projector(&broken.join("vision_weight.q4nx"));
    ok(&run(&broken));
    let status = ok(&run_in(&home, &["status"]));
    assert!(
        status.contains("tower vision_weight.q4nx: refused: 1 of 39 tensors of vision_weight.q4nx fail verification: multi_modal_projector.mm_input_projection_weight (the pack serves text only)"),
        "{status}"
    );
    // The report opens its agreement section with each tower's verdict.
    let html = tmp.path().join("report.html");
    ok(&run_in(
        &home,
        &["report", "--pack", "local/broken", "--out", s(&html)],
    ));
    let page = std::fs::read_to_string(&html).expect("report");
    assert!(
        page.contains("refused: the pack serves text only"),
        "the towers table"
    );
    // A tower tensor's values, decoded from its blocks.
    let values = ok(&run_in(
        &home,
        &[
            "sql",
            "--format",
            "json",
            "SELECT count(*) AS n, max(abs(value)) AS m FROM tensor_values('local/repo', 'multi_modal_projector.mm_input_projection_weight')",
        ],
    ));
    let values: Vec<Value> = serde_json::from_str(&values).expect("json rows");
    assert_eq!(values[0]["n"].as_u64(), Some(128 * 192));
    assert!(values[0]["m"].as_f64().is_some_and(|m| m > 0.0));
    let out = ok(&run_in(
        &home,
        &[
            "generate",
            "--path",
            s(&broken),
            "--reference",
            s(&gguf),
            "--mmproj",
            s(&mmproj),
            "--prompt",
            "the cat",
            "--max-tokens",
            "2",
        ],
    ));
    assert!(!out.is_empty(), "the language model answers");
}

/// Rewrites the projector of a tower file in place as the mmproj stores it ([in, out]),
/// blocked as if it were [out, in]: same bytes count, same declared shape.
fn transpose_projector(path: &Path) {
    use onebit_stages::format::q4nx::Container;
    use onebit_stages::format::q4nx::writer::{Entry, write_container};
    use onebit_stages::layout::mm_block::MmBlock;
    use std::io::Write;
    let name = "multi_modal_projector.mm_input_projection_weight";
    let c = Container::open(path).expect("tower");
    let g = onebit_stages::format::gguf::GgufFile::open(&towers().join("mmproj-f16.gguf"))
        .expect("mmproj");
    let t = g.tensor("mm.input_projection.weight").expect("projector");
    let mut v = Vec::new();
    g.rows_f32(t, 0, t.rows(), &mut v).expect("rows");
    let bits: Vec<u16> = v
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let wrong = MmBlock {
        mm_k: 256,
        mm_n: 64,
    }
    .encode(t.rows(), t.row_len(), &bits);
    let entries: Vec<Entry> = c
        .tensors()
        .iter()
        .map(|i| Entry {
            name: i.name.clone(),
            dtype: i.dtype.clone(),
            shape: i.shape.clone(),
        })
        .collect();
    let data: Vec<Vec<u8>> = c
        .tensors()
        .iter()
        .map(|i| {
            if i.name == name {
                wrong.clone()
            } else {
                c.data(i).to_vec()
            }
        })
        .collect();
    drop(c);
    write_container(path, &entries, |i, w: &mut dyn Write| {
        Ok(w.write_all(&data[i])?)
    })
    .expect("write");
}

/// Qwen3.5's tower as FastFlowLM's converter writes a 2B's (512 × 64 blocks, the merger's
/// projections blocked too, the patch kernel's two temporal slices stacked back into one): ours
/// is the converter's file byte for byte (its size and sha256 are in the fixture's
/// reference.json, the 5.6 MB file itself is not kept), and it reads back and verifies against
/// the mmproj bit for bit.
#[test]
fn the_qwen35_tower_is_fastflowlms_2b_conversion_and_verifies_bit_for_bit() {
    use onebit_stages::format::gguf::GgufFile;
    use onebit_stages::format::q4nx::Container;
    use onebit_stages::layout::Layout;
    use onebit_stages::layout::mm_block::MmBlock;
    use onebit_stages::tower::detect::detect_tower;
    use onebit_stages::tower::names::TowerFamily;
    use onebit_stages::tower::verify::verify_tower;
    use sha2::{Digest, Sha256};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/towers/qwen35");
    let mmproj = dir.join("mmproj-f16.gguf");
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("vision_weight.q4nx");
    // A 2B's geometry, as `tower_geometry` decides it for hidden 2048 (the oracle's text model
    // is narrower).
    let (family, block, decision) =
        onebit_convert::tower::tower_geometry(&mmproj, "qwen35", 2048).expect("geometry");
    let wide = MmBlock {
        mm_k: 512,
        mm_n: 64,
    };
    assert_eq!((family, block), (TowerFamily::Qwen35, wide));
    assert!(decision.contains("qwen3.5 2B"), "{decision}");
    let reports = onebit_convert::tower::write_tower(&mmproj, family, block, &out).expect("write");
    let stacked = reports
        .iter()
        .find(|r| r.name == "model.visual.patch_embed.proj.weight")
        .expect("patch kernel");
    assert_eq!(
        stacked.source,
        "v.patch_embd.weight + v.patch_embd.weight.1"
    );
    let reference: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).expect("reference"))
            .expect("json");
    let ours = std::fs::read(&out).expect("ours");
    let sha: String = Sha256::digest(&ours)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        Some(ours.len() as u64),
        reference["flm_vision_weight"]["bytes"].as_u64()
    );
    assert_eq!(
        Some(sha.as_str()),
        reference["flm_vision_weight"]["sha256"].as_str()
    );

    let c = Container::open(&out).expect("tower");
    let g = GgufFile::open(&mmproj).expect("mmproj");
    for gguf in [Some(&g), None] {
        let layouts = detect_tower(&c, None, "vision", gguf).expect("detect");
        let l = |name: &str| layouts.iter().find(|l| l.name == name).expect(name);
        let qkv = l("model.visual.blocks.1.attn.qkv.weight");
        assert_eq!((qkv.rows, qkv.k, qkv.layer), (384, 128, Some(1)));
        assert_eq!(
            qkv.layout,
            Layout::MmBlock {
                block: wide,
                padded_rows: 512,
                padded_k: 512
            }
        );
        let fc1 = l("model.visual.merger.linear_fc1.weight");
        assert_eq!((fc1.rows, fc1.k), (512, 512));
        let fc2 = l("model.visual.merger.linear_fc2.weight");
        assert_eq!((fc2.rows, fc2.k), (128, 512));
        let patch = l("model.visual.patch_embed.proj.weight");
        assert_eq!(patch.layout, Layout::Plain);
        assert_eq!(patch.shape, vec![128, 3, 2, 16, 16]);
    }
    let layouts = detect_tower(&c, None, "vision", Some(&g)).expect("detect");
    let (rows, verdict) =
        verify_tower(&c, &layouts, Some(&g), "vision_weight.q4nx").expect("verify");
    assert!(verdict.verified, "{}", verdict.summary);
    for r in &rows {
        assert_eq!(
            r.reason, "every value is bf16(mmproj) bit for bit",
            "{}",
            r.tensor
        );
    }
    // The stacked kernel was compared with both of the mmproj's slices.
    let patch = rows
        .iter()
        .find(|r| r.tensor == "model.visual.patch_embed.proj.weight")
        .expect("patch row");
    assert_eq!(patch.compared, 128 * 3 * 2 * 16 * 16);
}
