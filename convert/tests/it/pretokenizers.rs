//! Every pre-tokenizer llama.cpp knows, held to llama.cpp's own token ids.
//!
//! `tests/fixtures/pretokenizers/expected.json` holds, for every `tokenizer.ggml.pre` name in
//! llama.cpp's `src/llama-vocab.cpp` (llama-cpp-python 0.3.36's vendored copy), the ids
//! `llama-tokenize` printed for `text.txt` (several scripts, digits, runs of spaces, tabs,
//! CRLF, code) with a vocabulary trained on that text with no pre-tokenizer: its merges cross
//! every boundary, so any split that differs from llama.cpp's changes the ids.
//! `scripts/oracle/pretokenizers.py` made them (`whitespace` on `text-single-spaced.txt`: llama.cpp
//! aborts on runs of whitespace with it). Here the `tokenizer.json` that `convert` writes
//! for each name is loaded by the runtime's `tokenizers` and must give the same ids.

use std::collections::BTreeMap;
use std::path::PathBuf;

use onebit_convert::pretokenizer::{known_names, pre_tokenizer};
use onebit_convert::tokenizer::{bpe_tokenizer, gguf_vocab};
use onebit_stages::format::gguf::GgufFile;
use tokenizers::Tokenizer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/pretokenizers")
}

struct Expected {
    vocab: String,
    text: String,
    ids: Vec<u32>,
}

fn expected() -> BTreeMap<String, Expected> {
    let path = fixtures().join("expected.json");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("expected.json")).expect("json");
    let names = doc["names"].as_object().expect("names");
    names
        .iter()
        .map(|(name, v)| {
            let ids = v["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|i| i.as_u64().expect("id") as u32)
                .collect();
            let vocab = v["vocab"].as_str().expect("vocab").to_string();
            let text = v["text"].as_str().expect("text").to_string();
            (name.clone(), Expected { vocab, text, ids })
        })
        .collect()
}

#[test]
fn the_table_holds_exactly_the_names_llama_cpp_knows() {
    let expected = expected();
    let ours: Vec<&str> = known_names().collect();
    let missing: Vec<&String> = expected
        .keys()
        .filter(|n| !ours.contains(&n.as_str()))
        .collect();
    let extra: Vec<&&str> = ours
        .iter()
        .filter(|n| !expected.contains_key(**n))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "llama.cpp knows {missing:?} that the table lacks; the table has {extra:?} that llama.cpp does not know"
    );
    let mut seen = std::collections::HashSet::new();
    for n in &ours {
        assert!(seen.insert(*n), "{n} is in the table twice");
    }
    assert!(ours.len() >= 90, "{} names", ours.len());
}

#[test]
fn every_pre_tokenizer_gives_llama_cpp_ids() {
    let text = std::fs::read_to_string(fixtures().join("text.txt")).expect("text.txt");
    assert!(text.contains("\r\n"), "text.txt lost its CRLF line");
    // `whitespace` runs on the text with whitespace runs cut to one character: llama.cpp aborts
    // on runs with that pre-tokenizer (scripts/oracle/pretokenizers.py, SINGLE_SPACED).
    let single = std::fs::read_to_string(fixtures().join("text-single-spaced.txt"))
        .expect("text-single-spaced.txt");
    let mut vocabs = BTreeMap::new();
    for kind in ["bytelevel", "raw"] {
        let g = GgufFile::open(&fixtures().join(format!("vocab-{kind}.gguf"))).expect("vocab");
        vocabs.insert(kind.to_string(), gguf_vocab(&g));
    }
    let mut failures = Vec::new();
    let expected = expected();
    for (name, want) in &expected {
        let pre = pre_tokenizer(name).unwrap_or_else(|| panic!("{name} not in the table"));
        let (tokens, types, merges) = &vocabs[&want.vocab];
        let json = bpe_tokenizer(tokens, types, merges, pre);
        let tok: Tokenizer = serde_json::to_string(&json)
            .expect("json")
            .parse()
            .unwrap_or_else(|e| panic!("{name}: tokenizer.json does not load: {e}"));
        let input = if want.text == "text.txt" {
            &text
        } else {
            &single
        };
        let got = tok
            .encode(input.as_str(), false)
            .unwrap_or_else(|e| panic!("{name}: encode: {e}"))
            .get_ids()
            .to_vec();
        if got != want.ids {
            let at = got
                .iter()
                .zip(&want.ids)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.ids.len()));
            let show = |ids: &[u32]| {
                ids.iter()
                    .skip(at.saturating_sub(2))
                    .take(6)
                    .map(|&i| format!("{i}:{:?}", tokens[i as usize]))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            failures.push(format!(
                "{name} ({}): {} ids vs llama.cpp's {}; first difference at {at}: ours {} | llama.cpp {}",
                pre.kind,
                got.len(),
                want.ids.len(),
                show(&got),
                show(&want.ids)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} pre-tokenizers differ from llama.cpp:\n{}",
        failures.len(),
        expected.len(),
        failures.join("\n")
    );
}
