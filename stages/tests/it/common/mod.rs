//! Shared helpers of the stages' integration tests: where the fixtures are, and their hashes.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// `tests/fixtures/` at the workspace root.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests")
        .join("fixtures")
}

/// The q4nx fixture folder of `case` (e.g. `llama-q41`, `gemma3-q41-quarter/rb16`).
pub fn q4nx_case(case: &str) -> PathBuf {
    fixtures().join("q4nx").join(case)
}

/// Every q4nx case folder.
pub const CASES: [&str; 6] = [
    "llama-q41",
    "llama-q40",
    "llama-q80",
    "qwen35-q80",
    "gemma3-q41-quarter/stock",
    "gemma3-q41-quarter/rb16",
];

/// Hex sha256 of a file.
pub fn sha256_file(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let d = Sha256::digest(&bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// One tensor for [`write_q4nx`]: name, dtype, shape, bytes.
pub type RawTensor<'a> = (&'a str, &'a str, Vec<u64>, Vec<u8>);

/// Writes a q4nx (safetensors) container with tensors laid out back to back, as the converter does.
pub fn write_q4nx(path: &std::path::Path, tensors: &[RawTensor<'_>]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).expect("json");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).expect("write container");
}
