//! `tokenizer.json`, `tokenizer_config.json` and the chat template from a GGUF's vocabulary.
//!
//! Two GGUF tokenizer models are written faithfully:
//! - `gpt2` (BPE): the GGUF's own merges, with the pre-tokenizer `tokenizer.ggml.pre` names, as
//!   llama.cpp runs it (every name it knows; `crate::pretokenizer`);
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

use crate::pretokenizer::{Encoding, MISSING, PreTokenizer, known_names, pre_tokenizer};
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

/// A GGUF's vocabulary arrays: tokens, their types (normal where the GGUF has none) and the
/// BPE merges (`"left right"`; empty for SentencePiece vocabularies).
pub fn gguf_vocab(g: &GgufFile) -> (Vec<String>, Vec<i64>, Vec<String>) {
    let tokens = strings(g.meta("tokenizer.ggml.tokens"));
    let mut types = ints(g.meta("tokenizer.ggml.token_type"));
    types.resize(tokens.len(), NORMAL);
    (tokens, types, strings(g.meta("tokenizer.ggml.merges")))
}

/// Builds the tokenizer files for `g` of family `arch`.
pub fn tokenizer_files(g: &GgufFile, arch: &str) -> Result<TokenizerOut> {
    let path = g.path();
    let model = g
        .meta("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let (tokens, types, merges) = gguf_vocab(g);
    if tokens.is_empty() {
        return Err(super::refuse(
            path,
            "tokenizer.ggml.tokens",
            "the GGUF has no vocabulary",
        ));
    }
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
    // The BPE pre-tokenizer first: its llama.cpp entry sets the default of add_bos.
    let bpe_pre = if model == "gpt2" {
        let named = g.meta("tokenizer.ggml.pre").and_then(|v| v.as_str());
        let pre_name = named.unwrap_or(MISSING);
        let Some(pre) = pre_tokenizer(pre_name) else {
            return Err(super::refuse(
                path,
                "tokenizer.ggml.pre",
                format!(
                    "pre-tokenizer {pre_name:?} is not one llama.cpp knows (it knows {})",
                    known_names().count()
                ),
            ));
        };
        Some((pre, pre_name, named))
    } else {
        None
    };
    // llama.cpp's defaults when the flags are absent: SPM adds BOS, BPE as its pre-tokenizer
    // entry says; Gemma 4's entry forces it whatever the GGUF says.
    let add_bos = match (flag("tokenizer.ggml.add_bos_token"), bpe_pre) {
        (_, Some((p, _, _))) if p.force_bos => true,
        (Some(b), _) => b,
        (None, Some((p, _, _))) => p.add_bos,
        (None, None) => model == "llama",
    };
    let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
    dec.push(format!(
        "add_bos_token={add_bos} <- {}",
        match (flag("tokenizer.ggml.add_bos_token"), bpe_pre) {
            (_, Some((p, _, _))) if p.force_bos => "llama.cpp forces it for this pre-tokenizer",
            (Some(_), _) => "tokenizer.ggml.add_bos_token",
            (None, Some(_)) => "llama.cpp default for this pre-tokenizer",
            (None, None) => "llama.cpp default for this tokenizer model",
        }
    ));
    let tok = |i: Option<u64>| i.and_then(|i| tokens.get(i as usize)).cloned();

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

    let tokenizer = match model {
        "gpt2" => {
            let Some((pre, pre_name, named)) = bpe_pre else {
                return Err(super::refuse(
                    path,
                    "tokenizer.ggml.model",
                    "gpt2 without a pre-tokenizer",
                ));
            };
            record_pre_tokenizer(pre, pre_name, named, &mut dec);
            let mut t = bpe_tokenizer(&tokens, &types, &merges, pre);
            t["post_processor"] = post;
            t
        }
        "llama" => spm_tokenizer(g, &tokens, &types, tok(unk), post, &mut dec),
        other => {
            return Err(super::refuse(
                path,
                "tokenizer.ggml.model",
                format!("tokenizer model {other:?} is not converted (gpt2 and llama are)"),
            ));
        }
    };
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let (own, template, end_of_turn) = chat_template(g, arch, &index, &mut dec);
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
        "clean_up_tokenization_spaces": bpe_pre.is_some_and(|(p, _, _)| p.clean_spaces),
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

/// Records the BPE pre-tokenizer llama.cpp runs for this GGUF.
fn record_pre_tokenizer(
    pre: &PreTokenizer,
    pre_name: &str,
    named: Option<&str>,
    dec: &mut Vec<String>,
) {
    dec.push(format!(
        "pre_tokenizer={} ({} split{}, {}) <- {}",
        pre.kind.to_ascii_lowercase(),
        pre.splits.len(),
        if pre.splits.len() == 1 { "" } else { "s" },
        match pre.encoding {
            Encoding::ByteLevel => "byte-level",
            Encoding::Raw {
                escape_spaces: true,
            } => "raw UTF-8, spaces as U+2581",
            Encoding::Raw {
                escape_spaces: false,
            } => "raw UTF-8",
        },
        match named {
            Some(n) => format!("tokenizer.ggml.pre={n:?} (llama.cpp's table)"),
            None => "no tokenizer.ggml.pre: llama.cpp's default".to_string(),
        }
    ));
    if pre.ignore_merges {
        dec.push(format!(
            "ignore_merges=true <- llama.cpp for tokenizer.ggml.pre={pre_name:?}"
        ));
    }
}

/// `tokenizer.json` for a SentencePiece (`llama`) vocabulary: BPE with byte fallback, the merges
/// derived from the piece scores, the dummy prefix as the GGUF says.
fn spm_tokenizer(
    g: &GgufFile,
    tokens: &[String],
    types: &[i64],
    unk: Option<String>,
    post: Value,
    dec: &mut Vec<String>,
) -> Value {
    let flag = |k: &str| match g.meta(k) {
        Some(MetaValue::Bool(b)) => Some(*b),
        _ => None,
    };
    let scores = floats(g.meta("tokenizer.ggml.scores"));
    let merges = spm_merges(tokens, types, &scores);
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
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
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
    tokenizer_json(
        tokens,
        types,
        normalizer,
        Value::Null,
        post,
        json!({"type": "Sequence", "decoders": decoders}),
        json!({
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab_map(tokens), "merges": merges,
        }),
    )
}

/// The chat template: the GGUF's own (returned as `own`), else the family's standard one with
/// its end-of-turn token; returns (own, template, end of turn).
fn chat_template(
    g: &GgufFile,
    arch: &str,
    index: &HashMap<&str, usize>,
    dec: &mut Vec<String>,
) -> (Option<String>, String, Option<&'static str>) {
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
    (own, template, end_of_turn)
}

/// `tokenizer.json` for a GGUF BPE (`gpt2`) vocabulary as llama.cpp runs it with `pre`: what
/// [`tokenizer_files`] writes for such a GGUF, less the BOS post-processor. `merges` are the
/// GGUF's `"left right"` strings.
pub fn bpe_tokenizer(
    tokens: &[String],
    types: &[i64],
    merges: &[String],
    pre: &PreTokenizer,
) -> Value {
    tokenizer_json(
        tokens,
        types,
        pre.normalizer_json(),
        pre.pre_tokenizer_json(),
        Value::Null,
        pre.decoder_json(),
        json!({
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": pre.encoding != Encoding::ByteLevel,
            "ignore_merges": pre.ignore_merges, "vocab": vocab_map(tokens), "merges": merges,
        }),
    )
}

/// Token text -> id.
fn vocab_map(tokens: &[String]) -> serde_json::Map<String, Value> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect()
}

/// The whole `tokenizer.json`; control, user-defined and unknown pieces become added tokens
/// (matched before the model, as llama.cpp partitions special tokens first).
fn tokenizer_json(
    tokens: &[String],
    types: &[i64],
    normalizer: Value,
    pre: Value,
    post: Value,
    decoder: Value,
    model: Value,
) -> Value {
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.get(i).copied().unwrap_or(NORMAL);
        if ty == CONTROL || ty == USER_DEFINED || ty == UNKNOWN {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty != USER_DEFINED,
            }));
        }
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post,
        "decoder": decoder, "model": model,
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
