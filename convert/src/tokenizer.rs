//! `tokenizer.json`, `tokenizer_config.json` and the chat template from a GGUF's vocabulary.
//!
//! Two GGUF tokenizer models are written faithfully:
//! - `gpt2` (byte-level BPE): the GGUF's own merges, with the pre-tokenizer regex named by
//!   `tokenizer.ggml.pre` (`default`/`gpt2`, `llama-bpe`, `qwen2`, `hunyuan-dense`);
//! - `llama` (SentencePiece BPE, Gemma, Llama 2): BPE with byte fallback, whitespace as `▁`, and
//!   merges derived from the piece scores exactly as Hugging Face's `SentencePieceExtractor`
//!   does (every split of a piece into two pieces, ordered by the merged piece's score), so that
//!   merge order equals SentencePiece's "highest-scoring merged piece first". Control and
//!   user-defined pieces become added tokens, matched before the model as SentencePiece does.
//!
//! FastFlowLM's converter writes the SentencePiece case as byte-level BPE without merges, which
//! cannot reproduce the model's tokenization (q4nx-format §7); this is the fix for that.

use std::collections::HashMap;

use serde_json::{Value, json};

use onebit_stages::error::Result;
use onebit_stages::format::gguf::{GgufFile, MetaValue};

/// The tokenizer files and the decisions behind them.
pub struct TokenizerOut {
    /// `tokenizer.json`.
    pub tokenizer: Value,
    /// `tokenizer_config.json`.
    pub config: Value,
    /// `chat_template.jinja` when the template is the family's standard one (not the GGUF's).
    pub template_file: Option<String>,
    /// `key=value <- source`.
    pub decisions: Vec<String>,
}

const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

fn strings(v: Option<&MetaValue>) -> Vec<String> {
    match v {
        Some(MetaValue::Array(a)) => a
            .iter()
            .map(|x| x.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

fn ints(v: Option<&MetaValue>) -> Vec<i64> {
    match v {
        Some(MetaValue::Array(a)) => a
            .iter()
            .map(|x| match *x {
                MetaValue::I32(i) => i as i64,
                MetaValue::I64(i) => i,
                _ => x.as_u64().map(|u| u as i64).unwrap_or(NORMAL),
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn floats(v: Option<&MetaValue>) -> Vec<f64> {
    match v {
        Some(MetaValue::Array(a)) => a.iter().map(|x| x.as_f64().unwrap_or(0.0)).collect(),
        _ => Vec::new(),
    }
}

/// The Gemma chat template (text content), as Google ships it for Gemma 3 and llama.cpp applies
/// it when a GGUF carries none: `<start_of_turn>user|model … <end_of_turn>`, a system message
/// folded into the first user turn.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n    {{- message['content'] | trim }}\n    {{- '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{ '<start_of_turn>model\\n' }}\n{%- endif -%}\n";

/// ChatML (Qwen, and llama.cpp's default).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif -%}\n";

/// Hunyuan's template (Hunyuan-1.8B-Instruct's, without tools): the system text closed by the
/// token `<｜hy_place▁holder▁no▁3｜>`, each user turn `<｜hy_User｜>…<｜hy_Assistant｜>`, each answer
/// ended by EOS.
pub const HUNYUAN_TEMPLATE: &str = "{{- bos_token }}{%- set sys = namespace(p='') %}{%- for m in messages %}{%- if m['role'] == 'system' %}{%- set sys.p = sys.p + m['content'] %}{%- endif %}{%- endfor %}{{- sys.p }}{%- if sys.p != '' %}{{- '<｜hy_place▁holder▁no▁3｜>' }}{%- endif %}{%- for m in messages %}{%- if m['role'] == 'user' %}{{- '<｜hy_User｜>' + m['content'] + '<｜hy_Assistant｜>' }}{%- elif m['role'] == 'assistant' %}{{- m['content'] + eos_token }}{%- endif %}{%- endfor %}";

/// Llama 3's header template.
pub const LLAMA3_TEMPLATE: &str = "{{- bos_token }}\n{%- for message in messages -%}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif -%}\n";

/// Builds the tokenizer files for `g` of family `arch`.
pub fn tokenizer_files(g: &GgufFile, arch: &str) -> Result<TokenizerOut> {
    let path = g.path();
    let model = g
        .meta("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let tokens = strings(g.meta("tokenizer.ggml.tokens"));
    if tokens.is_empty() {
        return Err(super::refuse(
            path,
            "tokenizer.ggml.tokens",
            "the GGUF has no vocabulary",
        ));
    }
    let mut types = ints(g.meta("tokenizer.ggml.token_type"));
    types.resize(tokens.len(), NORMAL);
    let id = |k: &str| g.meta(k).and_then(|v| v.as_u64());
    let flag = |k: &str| match g.meta(k) {
        Some(MetaValue::Bool(b)) => Some(*b),
        _ => None,
    };
    let bos = id("tokenizer.ggml.bos_token_id");
    let eos = id("tokenizer.ggml.eos_token_id");
    let unk = id("tokenizer.ggml.unknown_token_id");
    let pad = id("tokenizer.ggml.padding_token_id");
    let mut dec = Vec::new();
    // llama.cpp's defaults when the flags are absent: SPM adds BOS, BPE does not.
    let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(model == "llama");
    let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
    dec.push(format!(
        "add_bos_token={add_bos} <- {}",
        if flag("tokenizer.ggml.add_bos_token").is_some() {
            "tokenizer.ggml.add_bos_token"
        } else {
            "llama.cpp default for this tokenizer model"
        }
    ));
    let tok = |i: Option<u64>| i.and_then(|i| tokens.get(i as usize)).cloned();

    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types[i];
        if ty == CONTROL || ty == USER_DEFINED || ty == UNKNOWN {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty != USER_DEFINED,
            }));
        }
    }
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let post = match (add_bos, tok(bos)) {
        (true, Some(b)) => {
            let bos_id = bos.unwrap_or(0);
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {b.clone(): {"id": b, "ids": [bos_id], "tokens": [b]}},
            })
        }
        _ => Value::Null,
    };

    let (normalizer, pre, decoder, model_json) = match model {
        "gpt2" => {
            let merges = strings(g.meta("tokenizer.ggml.merges"));
            let pre_name = g
                .meta("tokenizer.ggml.pre")
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            let regex: Option<&[&str]> = match pre_name {
                "default" | "gpt2" => None,
                "llama-bpe" | "llama3" => Some(&[
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                ]),
                "qwen2" => Some(&[
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                ]),
                // llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_HUNYUAN_DENSE: three splits,
                // each applied to the pieces the previous one left.
                "hunyuan-dense" => Some(&[
                    "\\p{N}{1,3}",
                    "[一-龥぀-ゟ゠-ヿ]+",
                    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                ]),
                other => {
                    return Err(super::refuse(
                        path,
                        "tokenizer.ggml.pre",
                        format!(
                            "pre-tokenizer {other:?} is not known (known: default, gpt2, llama-bpe, qwen2, hunyuan-dense)"
                        ),
                    ));
                }
            };
            dec.push(format!(
                "pre_tokenizer={} <- tokenizer.ggml.pre={pre_name:?}",
                if regex.is_some() { pre_name } else { "gpt2" }
            ));
            let pre = match regex {
                None => {
                    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
                }
                Some(rs) => {
                    let mut steps: Vec<Value> = rs
                        .iter()
                        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
                        .collect();
                    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
                    json!({"type": "Sequence", "pretokenizers": steps})
                }
            };
            (
                Value::Null,
                pre,
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
                json!({
                    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                    "ignore_merges": pre_name == "llama-bpe", "vocab": vocab, "merges": merges,
                }),
            )
        }
        "llama" => {
            let scores = floats(g.meta("tokenizer.ggml.scores"));
            let merges = spm_merges(&tokens, &types, &scores);
            let prefix = flag("tokenizer.ggml.add_space_prefix").unwrap_or(true);
            dec.push(format!(
                "add_dummy_prefix={prefix} <- {}",
                if flag("tokenizer.ggml.add_space_prefix").is_some() {
                    "tokenizer.ggml.add_space_prefix"
                } else {
                    "SentencePiece default"
                }
            ));
            dec.push(format!(
                "merges={} <- derived from the {} piece scores (SentencePiece BPE order)",
                merges.len(),
                tokens.len()
            ));
            let replace =
                json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
            let normalizer = if prefix {
                json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
            } else {
                replace
            };
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            (
                normalizer,
                Value::Null,
                json!({"type": "Sequence", "decoders": decoders}),
                json!({
                    "type": "BPE", "dropout": null, "unk_token": tok(unk), "continuing_subword_prefix": null,
                    "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                    "ignore_merges": false, "vocab": vocab, "merges": merges,
                }),
            )
        }
        other => {
            return Err(super::refuse(
                path,
                "tokenizer.ggml.model",
                format!("tokenizer model {other:?} is not converted (gpt2 and llama are)"),
            ));
        }
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post,
        "decoder": decoder, "model": model_json,
    });

    // Chat template: the GGUF's own, else the family's standard one.
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let own = g
        .meta("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let (template, end_of_turn) = match (&own, arch) {
        (Some(t), _) => {
            dec.push("chat_template <- tokenizer.chat_template".into());
            (t.clone(), None)
        }
        (None, "gemma3") => (GEMMA_TEMPLATE.to_string(), Some("<end_of_turn>")),
        (None, "hunyuan-dense") => (HUNYUAN_TEMPLATE.to_string(), None),
        (None, _) if index.contains_key("<|start_header_id|>") => {
            (LLAMA3_TEMPLATE.to_string(), Some("<|eot_id|>"))
        }
        (None, _) => (CHATML_TEMPLATE.to_string(), Some("<|im_end|>")),
    };
    if own.is_none() {
        dec.push(format!(
            "chat_template={} <- the GGUF has none; the family's standard template (as llama.cpp's built-ins)",
            if arch == "gemma3" {
                "gemma"
            } else if arch == "hunyuan-dense" {
                "hunyuan"
            } else if end_of_turn == Some("<|eot_id|>") {
                "llama3"
            } else {
                "chatml"
            }
        ));
    }
    let mut eos_ids: Vec<u64> = eos.into_iter().collect();
    let eot = id("tokenizer.ggml.eot_token_id")
        .or_else(|| end_of_turn.and_then(|t| index.get(t)).map(|&i| i as u64));
    if let Some(e) = eot.filter(|e| !eos_ids.contains(e)) {
        dec.push(format!(
            "eos_token_id+={e} ({}) <- end-of-turn token of the chat template",
            tok(Some(e)).unwrap_or_default()
        ));
        eos_ids.push(e);
    }
    let mut config = json!({
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": tok(bos),
        "bos_token_id": bos,
        "eos_token": tok(eos),
        "eos_token_id": eos_ids,
        "pad_token": tok(pad),
        "unk_token": tok(unk),
        "clean_up_tokenization_spaces": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": g.meta(&format!("{arch}.context_length")).and_then(|v| v.as_u64()),
    });
    let template_file = if own.is_some() {
        if let Some(o) = config.as_object_mut() {
            o.insert("chat_template".into(), json!(template));
        }
        None
    } else {
        Some(template)
    };
    Ok(TokenizerOut {
        tokenizer,
        config,
        template_file,
        decisions: dec,
    })
}

/// Merges of a SentencePiece BPE vocabulary, as `transformers`' `SentencePieceExtractor`:
/// for every normal piece, each split into two normal pieces, ordered by the merged piece's
/// score (descending; stable), ties within a piece by the ids of the two halves.
pub fn spm_merges(tokens: &[String], types: &[i64], scores: &[f64]) -> Vec<[String; 2]> {
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types.get(*i).copied().unwrap_or(NORMAL) == NORMAL)
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        if types.get(i).copied().unwrap_or(NORMAL) != NORMAL {
            continue;
        }
        let score = scores.get(i).copied().unwrap_or(-(i as f64));
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (index.get(l), index.get(r)) {
                merges.push((score, i, a, b));
            }
        }
    }
    // Within one piece, order by (left id, right id); across pieces by score, stable in id order.
    merges.sort_by(|x, y| {
        y.0.partial_cmp(&x.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(x.1.cmp(&y.1))
            .then(x.2.cmp(&y.2))
            .then(x.3.cmp(&y.3))
    });
    merges
        .into_iter()
        .map(|(_, _, a, b)| [tokens[a].clone(), tokens[b].clone()])
        .collect()
}
