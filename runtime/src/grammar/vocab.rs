//! The vocabulary as the grammar engine sees it: every token id's bytes, and a tokenizer for
//! grammar literals.
//!
//! `toktrie_hf_tokenizers`, the adapter the `llguidance` project keeps, does this for
//! `tokenizers` 0.21; the runtime uses 0.22, and a second copy of `tokenizers` would double its
//! build. This module follows the adapter's rules on our version: byte-level vocabularies
//! (GPT-2, Llama 3, Qwen) map each character back to its byte; SentencePiece-style ones (Gemma,
//! Llama 2) read `<0xXX>` byte tokens as that byte and the word marker (`▁`) as a space; special
//! tokens get the trie's special marker, so no text can spell them.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::{DecoderWrapper, Tokenizer};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::{Error, Result};

/// How token strings map to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-to-character table.
    ByteLevel,
    /// Text with a word marker for spaces, and `<0xXX>` byte tokens when `bytes`.
    Pieces { space: char, bytes: bool },
}

fn spelling(d: Option<&DecoderWrapper>) -> Spelling {
    fn walk(d: &DecoderWrapper, byte_level: &mut bool, bytes: &mut bool, space: &mut char) {
        match d {
            DecoderWrapper::ByteLevel(_) => *byte_level = true,
            DecoderWrapper::ByteFallback(_) => *bytes = true,
            DecoderWrapper::Metaspace(m) => *space = m.get_replacement(),
            DecoderWrapper::Replace(r) if r.content == " " => {
                // The pattern has no accessor; its serialized form names it.
                if let Ok(v) = serde_json::to_value(r)
                    && let Some(s) = v["pattern"]["String"].as_str()
                    && let (Some(c), None) = (s.chars().next(), s.chars().nth(1))
                {
                    *space = c;
                }
            }
            DecoderWrapper::Sequence(seq) => {
                for d in seq.get_decoders() {
                    walk(d, byte_level, bytes, space);
                }
            }
            _ => {}
        }
    }
    let (mut byte_level, mut bytes, mut space) = (false, false, '▁');
    if let Some(d) = d {
        walk(d, &mut byte_level, &mut bytes, &mut space);
    }
    if byte_level {
        Spelling::ByteLevel
    } else {
        Spelling::Pieces { space, bytes }
    }
}

/// GPT-2's table from the printable character standing for a byte back to the byte.
fn byte_level_table() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        if printable(b) {
            map.insert(char::from(b), b);
        } else {
            if let Some(c) = char::from_u32(next) {
                map.insert(c, b);
            }
            next += 1;
        }
    }
    map
}

/// How one tokenizer's token strings become bytes.
struct Speller {
    spell: Spelling,
    table: HashMap<char, u8>,
    special: HashMap<u32, bool>,
}

impl Speller {
    fn new(tok: &Tokenizer) -> Speller {
        Speller {
            spell: spelling(tok.get_decoder()),
            table: byte_level_table(),
            special: tok
                .get_added_tokens_decoder()
                .into_iter()
                .map(|(id, t)| (id, t.special))
                .collect(),
        }
    }

    /// The bytes `id` stands for, and whether it is a special token; `None` for an id the
    /// tokenizer does not have.
    fn bytes(&self, tok: &Tokenizer, id: u32) -> Option<(Vec<u8>, bool)> {
        let s = tok.id_to_token(id)?;
        Some(match self.special.get(&id) {
            Some(true) => (s.into_bytes(), true),
            // A non-special added token is text as written.
            Some(false) => (s.into_bytes(), false),
            None => (
                match self.spell {
                    Spelling::ByteLevel => s
                        .chars()
                        .map(|c| self.table.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| s.replace('Ġ', " ").into_bytes()),
                    Spelling::Pieces { space, bytes } => {
                        match s
                            .strip_prefix("<0x")
                            .and_then(|h| h.strip_suffix('>'))
                            .filter(|h| bytes && h.len() == 2)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                        {
                            Some(b) => vec![b],
                            None => s.replace(space, " ").into_bytes(),
                        }
                    }
                },
                false,
            ),
        })
    }
}

/// The bytes each of `ids` stands for (`/tokenize`'s pieces): a byte token is its one byte, a
/// word marker a space, a special token its text; an id the tokenizer lacks is `None`.
pub fn token_pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<Option<Vec<u8>>> {
    let sp = Speller::new(tok);
    ids.iter()
        .map(|&id| sp.bytes(tok, id).map(|(b, _)| b))
        .collect()
}

/// The bytes of every token of `tok`, padded with unspellable special entries up to `vocab`
/// rows (a model's embedding may have more rows than its tokenizer has tokens).
fn token_bytes(tok: &Tokenizer, vocab: usize) -> Vec<Vec<u8>> {
    let sp = Speller::new(tok);
    let n = tok.get_vocab_size(true).max(vocab);
    let marked = |s: &[u8]| {
        let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        b.extend_from_slice(s);
        b
    };
    (0..n as u32)
        .map(|id| match sp.bytes(tok, id) {
            None => marked(format!("<[{id}]>").as_bytes()),
            Some((s, true)) => marked(&s),
            Some((b, false)) => b,
        })
        .collect()
}

/// The grammar engine's view of one tokenizer.
struct Env {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Tokenizes grammar literals: the trie's greedy reading where it matches the tokenizer's.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.tok
                .encode(s, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// `tok` for tokenizing text in the middle of an answer: without a normalizer that prepends the
/// word marker and with Metaspace never prepending one (a literal is not the start of a text).
fn mid_text(tok: &Tokenizer) -> Tokenizer {
    use tokenizers::pre_tokenizers::metaspace::PrependScheme;
    use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, normalizers, pre_tokenizers};
    fn norm(n: &NormalizerWrapper) -> Option<NormalizerWrapper> {
        match n {
            NormalizerWrapper::Prepend(_) => None,
            NormalizerWrapper::Sequence(s) => {
                let kept: Vec<_> = s.as_ref().iter().filter_map(norm).collect();
                (!kept.is_empty()).then(|| normalizers::Sequence::new(kept).into())
            }
            other => Some(other.clone()),
        }
    }
    fn pre(p: &PreTokenizerWrapper) -> PreTokenizerWrapper {
        match p {
            PreTokenizerWrapper::Metaspace(m) => {
                let mut m = m.clone();
                m.set_prepend_scheme(PrependScheme::Never);
                PreTokenizerWrapper::Metaspace(m)
            }
            PreTokenizerWrapper::Sequence(s) => {
                pre_tokenizers::sequence::Sequence::new(s.as_ref().iter().map(pre).collect()).into()
            }
            other => other.clone(),
        }
    }
    let mut t = tok.clone();
    let n = t.get_normalizer().and_then(norm);
    t.with_normalizer(n);
    let p = t.get_pre_tokenizer().map(pre);
    t.with_pre_tokenizer(p);
    t
}

/// Builds the grammar engine's tokenizer environment for `tok` over a `vocab`-row model whose
/// end-of-sequence ids are `eos` (the grammar allows them once its text is complete).
/// A model without one gets an unsampleable end token past its logit rows: its answers then end
/// when the grammar is complete, never by choice.
pub fn tok_env(tok: &Tokenizer, vocab: usize, eos: &[u32]) -> Result<TokEnv> {
    let mut words = token_bytes(tok, vocab);
    let first = match eos.first() {
        Some(&e) if (e as usize) < words.len() => e,
        Some(&e) => {
            return Err(Error::Text(format!(
                "end-of-sequence id {e} is outside the {}-token vocabulary",
                words.len()
            )));
        }
        None => {
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(b"<[no eos]>");
            words.push(b);
            words.len() as u32 - 1
        }
    };
    let info = TokRxInfo::new(words.len() as u32, first);
    let mut trie = TokTrie::from(&info, &words);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(eos);
    }
    Ok(Arc::new(Env {
        trie,
        tok: mid_text(tok),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SentencePiece-style vocabulary (Gemma's, Llama 2's): `<0xXX>` tokens are their byte,
    /// the word marker is a space, special tokens are unspellable, and the rows past the
    /// tokenizer's padded up to the model's vocabulary.
    #[test]
    fn sentencepiece_pieces_read_as_their_bytes() {
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
            "pre_tokenizer": null, "post_processor": null,
            "added_tokens": [
                {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<eos>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true}],
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<unk>": 0, "<eos>": 1, "<0x41>": 2, "▁the": 3, "a": 4},
                "merges": []}
        });
        let tok: Tokenizer = json.to_string().parse().expect("tokenizer");
        let words = token_bytes(&tok, 7);
        assert_eq!(words.len(), 7);
        assert_eq!(words[2], vec![0x41]);
        assert_eq!(words[3], b" the".to_vec());
        assert_eq!(words[4], b"a".to_vec());
        for special in [0, 1, 5, 6] {
            assert_eq!(
                words[special][0],
                TokTrie::SPECIAL_TOKEN_MARKER,
                "{special}"
            );
        }
    }

    #[test]
    fn the_byte_level_table_is_gpt2s() {
        let t = byte_level_table();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
    }
}
