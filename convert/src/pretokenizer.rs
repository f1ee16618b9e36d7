//! llama.cpp's BPE pre-tokenizers as `tokenizers` pipelines.
//!
//! A GGUF names its pre-tokenizer by `tokenizer.ggml.pre`; llama.cpp (`src/llama-vocab.cpp`,
//! `llm_tokenizer_bpe`) maps each name to a list of regexes, applies them in order (each splits
//! the pieces the previous one left, keeping matches and the text between them as pieces), then
//! GPT-2's byte-level encoding (or none, for the SentencePiece-style BPE vocabularies), then BPE
//! merges per piece. The same pipeline in `tokenizers` is `Split(regex, Isolated)` per regex and
//! `ByteLevel(use_regex = false)`. This table holds every name llama.cpp knows at the vendored
//! version (llama-cpp-python 0.3.36), with the flags that change token ids (`ignore_merges`, the
//! default of `add_bos`, spaces escaped as `▁`).
//!
//! The regexes are llama.cpp's, in the form that gives its ids under `fancy-regex` (the engine
//! our `tokenizers` build uses). Where llama.cpp does not run a regex as written, the table says
//! what it runs instead:
//! - it matches the regexes that use Unicode categories on a "collapsed" text in which every
//!   non-ASCII code point is replaced by one byte per category, so `\p{Lu}`, `\p{Ll}`,
//!   `\p{Lt}`, `\p{Lm}` and `\p{Lo}` all mean "a letter": written here as `\p{L}`;
//! - it replaces some regexes by hand-written splitters (digit groups of three counted from the
//!   right for `\p{AFMoE_digits}` and tiny_aya's `\d{1,3}(?=(?:\d{3})*\b)`, the whole Kimi-K2
//!   pattern for `\p{Han}+`): written here as the regex each splitter implements;
//! - `\d` in a regex without categories is ECMAScript's ASCII `[0-9]`.
//!
//! The test `convert/tests/it/pretokenizers.rs` holds every entry to llama.cpp's own ids
//! (`llama-tokenize`) on a multilingual text (`scripts/oracle/pretokenizers.py` made them).

use serde_json::{Value, json};

/// How a pre-tokenizer turns text into BPE symbols after splitting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// GPT-2's byte-to-unicode map (`byte_encode = true` in llama.cpp).
    ByteLevel,
    /// Raw UTF-8 with `<0xXX>` byte tokens for what the vocabulary lacks; spaces escaped as
    /// `▁` before splitting when `escape_spaces` (the SentencePiece-style BPE vocabularies).
    Raw {
        /// Spaces become U+2581 before the split (llama.cpp's `escape_whitespaces`).
        escape_spaces: bool,
    },
}

/// One llama.cpp pre-tokenizer name (or group of names sharing every setting).
#[derive(Debug)]
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` values.
    pub names: &'static [&'static str],
    /// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`, for messages and the decision log.
    pub kind: &'static str,
    /// Regexes applied in order, each to the pieces the previous left.
    pub splits: &'static [&'static str],
    /// Byte-level or raw symbols.
    pub encoding: Encoding,
    /// A piece that is itself a token is taken whole, before any merge.
    pub ignore_merges: bool,
    /// llama.cpp's default for adding BOS when the GGUF does not say.
    pub add_bos: bool,
    /// llama.cpp forces BOS on whatever the GGUF says (its Gemma 4 workaround).
    pub force_bos: bool,
    /// Detokenization removes spaces before punctuation (llama.cpp's `clean_spaces`).
    pub clean_spaces: bool,
}

impl PreTokenizer {
    /// The `pre_tokenizer` object of `tokenizer.json`.
    pub fn pre_tokenizer_json(&self) -> Value {
        let mut steps: Vec<Value> = self
            .splits
            .iter()
            .map(|r| {
                json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false})
            })
            .collect();
        if self.encoding == Encoding::ByteLevel {
            steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
        }
        json!({"type": "Sequence", "pretokenizers": steps})
    }

    /// The `normalizer` object of `tokenizer.json` (`null` unless spaces are escaped).
    pub fn normalizer_json(&self) -> Value {
        match self.encoding {
            Encoding::Raw {
                escape_spaces: true,
            } => json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
            _ => Value::Null,
        }
    }

    /// The `decoder` object of `tokenizer.json`.
    pub fn decoder_json(&self) -> Value {
        match self.encoding {
            Encoding::ByteLevel => {
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})
            }
            Encoding::Raw { escape_spaces } => {
                let mut decoders = Vec::new();
                if escape_spaces {
                    decoders.push(
                        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                    );
                }
                decoders.push(json!({"type": "ByteFallback"}));
                decoders.push(json!({"type": "Fuse"}));
                json!({"type": "Sequence", "decoders": decoders})
            }
        }
    }
}

/// The pre-tokenizer llama.cpp runs for `tokenizer.ggml.pre` = `name`, if it knows the name.
pub fn pre_tokenizer(name: &str) -> Option<&'static PreTokenizer> {
    PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name))
}

/// Every name llama.cpp knows, in table order.
pub fn known_names() -> impl Iterator<Item = &'static str> {
    PRE_TOKENIZERS.iter().flat_map(|p| p.names.iter().copied())
}

/// llama.cpp's pre-tokenizer when a GGUF names none (it warns that quality degrades).
pub const MISSING: &str = "default";

/// Byte-level symbols (GPT-2's map).
const BYTES: Encoding = Encoding::ByteLevel;
/// Raw UTF-8 symbols.
const RAW: Encoding = Encoding::Raw {
    escape_spaces: false,
};
/// Raw UTF-8 symbols, spaces escaped as `▁` first.
const RAW_ESCAPED: Encoding = Encoding::Raw {
    escape_spaces: true,
};
/// [`PreTokenizer::ignore_merges`].
const IGNORE_MERGES: u8 = 1;
/// [`PreTokenizer::add_bos`].
const ADD_BOS: u8 = 2;
/// [`PreTokenizer::force_bos`].
const FORCE_BOS: u8 = 4;
/// [`PreTokenizer::clean_spaces`].
const CLEAN_SPACES: u8 = 8;

/// One row of [`PRE_TOKENIZERS`]: names, llama.cpp's kind, regexes, symbols, and the flags set.
const fn pt(
    names: &'static [&'static str],
    kind: &'static str,
    splits: &'static [&'static str],
    encoding: Encoding,
    flags: u8,
) -> PreTokenizer {
    PreTokenizer {
        names,
        kind,
        splits,
        encoding,
        ignore_merges: flags & IGNORE_MERGES != 0,
        add_bos: flags & ADD_BOS != 0,
        force_bos: flags & FORCE_BOS != 0,
        clean_spaces: flags & CLEAN_SPACES != 0,
    }
}

/// Every pre-tokenizer llama.cpp knows (`llama_vocab::impl::load`, the BPE branch), in its order:
/// the names, llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`, the regexes, the symbols and the flags that
/// change ids (one row each; the regexes are the constants below).
#[rustfmt::skip]
pub static PRE_TOKENIZERS: &[PreTokenizer] = &[
    pt(&["default"], "DEFAULT", DEFAULT, BYTES, CLEAN_SPACES),
    pt(&["minicpm5"], "MINICPM5", MINICPM5, BYTES, IGNORE_MERGES | CLEAN_SPACES),
    pt(
        &[
            "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
            "lfm2", "jina-v5-nano",
        ],
        "LLAMA3",
        LLAMA3,
        BYTES,
        IGNORE_MERGES | ADD_BOS | CLEAN_SPACES,
    ),
    pt(&["deepseek-llm"], "DEEPSEEK_LLM", DEEPSEEK_LLM, BYTES, 0),
    pt(&["deepseek-coder"], "DEEPSEEK_CODER", DEEPSEEK_CODER, BYTES, 0),
    pt(&["deepseek-v3"], "DEEPSEEK3_LLM", DEEPSEEK3_LLM, BYTES, 0),
    pt(&["spark2_5"], "SPARK2_5", SPARK2_5, BYTES, 0),
    pt(&["youtu"], "YOUTU", YOUTU, BYTES, IGNORE_MERGES),
    pt(&["falcon"], "FALCON", FALCON, BYTES, CLEAN_SPACES),
    pt(&["mpt"], "MPT", GPT2, BYTES, CLEAN_SPACES),
    pt(&["starcoder"], "STARCODER", STARCODER, BYTES, CLEAN_SPACES),
    pt(
        &[
            "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
            "a.x-4.0", "mellum", "modern-bert",
        ],
        "GPT2",
        GPT2,
        BYTES,
        CLEAN_SPACES,
    ),
    pt(&["jais-2"], "JAIS2", JAIS2, BYTES, CLEAN_SPACES),
    pt(
        &[
            "gemma4", "granite-embed-multi-311m",
        ],
        "GEMMA4",
        GEMMA4,
        RAW_ESCAPED,
        ADD_BOS | FORCE_BOS | CLEAN_SPACES,
    ),
    pt(&["sarvam-moe"], "SARVAM_MOE", GEMMA4, RAW_ESCAPED, 0),
    pt(&["jina-v1-en", "jina-v2-code", "roberta-bpe"], "GPT2", GPT2, BYTES, CLEAN_SPACES),
    pt(&["whitespace"], "WHITESPACE", WHITESPACE, RAW, CLEAN_SPACES),
    pt(&["refact"], "REFACT", STARCODER, BYTES, CLEAN_SPACES),
    pt(&["command-r"], "COMMAND_R", STARCODER, BYTES, 0),
    pt(&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], "QWEN2", QWEN2, BYTES, 0),
    pt(&["qwen35"], "QWEN35", QWEN35, BYTES, 0),
    pt(&["stablelm2"], "STABLELM2", QWEN2, BYTES, CLEAN_SPACES),
    pt(&["olmo"], "OLMO", GPT2, BYTES, CLEAN_SPACES),
    pt(&["dbrx"], "DBRX", LLAMA3, BYTES, CLEAN_SPACES),
    pt(&["smaug-bpe"], "SMAUG", LLAMA3, BYTES, CLEAN_SPACES),
    pt(&["poro-chat"], "PORO", PORO, BYTES, 0),
    pt(&["chatglm-bpe"], "CHATGLM4", LLAMA3, BYTES, CLEAN_SPACES),
    pt(&["glm4", "glm5"], "CHATGLM4", LLAMA3, BYTES, IGNORE_MERGES | CLEAN_SPACES),
    pt(&["viking"], "VIKING", VIKING, BYTES, 0),
    pt(&["jais"], "JAIS", GPT2, BYTES, CLEAN_SPACES),
    pt(&["tekken"], "TEKKEN", TEKKEN, BYTES, IGNORE_MERGES | ADD_BOS),
    pt(&["smollm"], "SMOLLM", STARCODER, BYTES, 0),
    pt(&["codeshell"], "CODESHELL", STARCODER, BYTES, CLEAN_SPACES),
    pt(&["bloom"], "BLOOM", PORO, BYTES, CLEAN_SPACES),
    pt(&["gpt3-finnish"], "GPT3_FINNISH", PORO, BYTES, CLEAN_SPACES),
    pt(&["exaone"], "EXAONE", STARCODER, BYTES, CLEAN_SPACES),
    pt(&["exaone4"], "GPT2", GPT2, BYTES, CLEAN_SPACES),
    pt(&["exaone-moe"], "EXAONE_MOE", EXAONE_MOE, BYTES, CLEAN_SPACES),
    pt(&["chameleon"], "CHAMELEON", CHAMELEON, BYTES, ADD_BOS),
    pt(&["minerva-7b"], "MINERVA", STARCODER, BYTES, CLEAN_SPACES),
    pt(&["megrez"], "QWEN2", QWEN2, BYTES, CLEAN_SPACES),
    pt(&["gpt-4o", "llama4", "kanana2", "talkie"], "GPT4O", GPT4O, BYTES, 0),
    pt(&["granite-embed-multi-97m"], "GRANITE_EMB_MULTI", GRANITE_EMB_MULTI, BYTES, IGNORE_MERGES),
    pt(&["tiny_aya", "cohere2moe"], "TINY_AYA", TINY_AYA, BYTES, 0),
    pt(&["superbpe"], "SUPERBPE", SUPERBPE, BYTES, 0),
    pt(&["trillion"], "TRILLION", GPT2, BYTES, 0),
    pt(&["granite-docling"], "GRANITE_DOCLING", GPT2, BYTES, 0),
    pt(&["bailingmoe", "bailingmoe2", "llada-moe"], "BAILINGMOE", BAILINGMOE, BYTES, 0),
    pt(&["seed-coder"], "SEED_CODER", SEED_CODER, BYTES, 0),
    pt(&["hunyuan"], "HUNYUAN", QWEN2, BYTES, 0),
    pt(&["hunyuan-dense"], "HUNYUAN_DENSE", DEEPSEEK3_LLM, BYTES, 0),
    pt(&["hy_v4"], "HY_V4", DEEPSEEK3_LLM, BYTES, 0),
    pt(&["joyai-llm"], "JOYAI_LLM", DEEPSEEK3_LLM, BYTES, 0),
    pt(&["kimi-k2"], "KIMI_K2", KIMI_K2, BYTES, 0),
    pt(&["ufakzeka"], "UFAKZEKA", UFAKZEKA, BYTES, 0),
    pt(&["grok-2"], "GROK_2", QWEN2, BYTES, 0),
    pt(&["afmoe"], "AFMOE", AFMOE, BYTES, 0),
    pt(&["laguna"], "LAGUNA", LAGUNA, BYTES, 0),
    pt(&["minimax-m2"], "MINIMAX_M2", GPT4O, BYTES, 0),
    pt(&["solar-open"], "SOLAR_OPEN", QWEN2, BYTES, 0),
    pt(&["mellum2"], "MELLUM2", STARCODER, BYTES, CLEAN_SPACES),
];

// Also CHATGLM4, DBRX and SMAUG (the same string in llama.cpp).
const LLAMA3: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const JAIS2: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"#,
];

const DEEPSEEK_LLM: &[&str] = &[
    r#"[\r\n]"#,
    r#"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"#,
    r#"\s?[!-/:-~！-／：-～‘-‟　-。]+"#,
    r#"\s+$"#,
    r#"[一-龥ࠀ-一가-퟿]+"#,
    r#"\p{N}+"#,
];

// Also HUNYUAN_DENSE, JOYAI_LLM, HY_V4.
const DEEPSEEK3_LLM: &[&str] = &[
    r#"\p{N}{1,3}"#,
    r#"[一-龥぀-ゟ゠-ヿ]+"#,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const SPARK2_5: &[&str] = &[
    r#"\p{N}{1,3}"#,
    r#"[一-龥぀-ゟ゠-ヿ]+"#,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
    r#"\p{N}"#,
];

// Second regex: llama.cpp folds \p{Lu}/\p{Ll}/\p{Lt}/\p{Lm}/\p{Lo} into "letter" (collapsed text).
const YOUTU: &[&str] = &[
    r#"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"#,
    r#"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]*[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+[\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const DEEPSEEK_CODER: &[&str] = &[
    r#"[\r\n]"#,
    r#"\s?\p{L}+"#,
    r#"\s?\p{P}+"#,
    r#"[一-龥ࠀ-一가-퟿]+"#,
    r#"\p{N}"#,
];

const FALCON: &[&str] = &[
    r#"[\p{P}\$\+<=>\^~\|`]+"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
    r#"[0-9][0-9][0-9]"#,
];

// Also REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2.
const STARCODER: &[&str] = &[
    r#"\p{N}"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
];

// Also MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING.
const GPT2: &[&str] =
    &[r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#];

// Also STABLELM2, HUNYUAN, SOLAR_OPEN, GROK_2 (the same string in llama.cpp).
const QWEN2: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const QWEN35: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

// Also BLOOM, GPT3_FINNISH.
const PORO: &[&str] = &[r#" ?[^(\s|.,!?…。，、।۔،)]+"#];

const VIKING: &[&str] = &[r#" ?[^(\s|.,!?…。，、।۔،)]+"#, r#"\p{N}"#];

const TEKKEN: &[&str] = &[
    r#"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const CHAMELEON: &[&str] = &[
    r#"<sentinel:[0-9]+>"#,
    r#"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"#,
    r#"([\t\n]|    |  )"#,
    r#"\p{N}"#,
    r#"[\p{P}!-/:-@\[-`{-~]"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
];

const GPT4O: &[&str] = &[
    r#"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const GRANITE_EMB_MULTI: &[&str] = &[
    r#"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

// First regex: llama.cpp runs its AFMoE digit splitter for `\d{1,3}(?=(?:\d{3})*\b)`; second: letter
// categories folded as for YOUTU.
const TINY_AYA: &[&str] = &[
    r#"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"#,
    r#"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]*[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+[\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

// llama.cpp runs a hand-written splitter for `\p{Han}+` that implements this whole pattern
// (letters are `\p{L}` without Han and without marks; contractions case-insensitive on ASCII).
const KIMI_K2: &[&str] = &[
    r#"\p{Han}+|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})\p{L})+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

// Second regex: llama.cpp's `(?=(\d{3})+(?!\d))` splits ASCII digit runs at every empty match; the
// pieces between are the groups of three counted from the right.
const SUPERBPE: &[&str] = &[r#"\p{N}+"#, r#"[0-9]{1,3}(?=(?:[0-9]{3})*(?![0-9]))"#];

const BAILINGMOE: &[&str] = &[
    r#"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"#,
];

const SEED_CODER: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const UFAKZEKA: &[&str] =
    &[r#"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#];

// First regex: llama.cpp's `\p{AFMoE_digits}` splitter (number runs in groups of three from the right).
const AFMOE: &[&str] = &[
    r#"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"#,
    r#"[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+"#,
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

const LAGUNA: &[&str] = &[
    r#"[^\n]+|[\n]+"#,
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const EXAONE_MOE: &[&str] = &[
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"#,
];

// Also SARVAM_MOE.
const GEMMA4: &[&str] = &[r#"[^\n]+|[\n]+"#];

const MINICPM5: &[&str] = &[
    r#"\p{N}{1,3}"#,
    r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
];

const WHITESPACE: &[&str] = &[r#"\S+"#];

// llama.cpp's `default:` branch (also what it runs when a GGUF names no pre-tokenizer).
const DEFAULT: &[&str] = &[
    r#"[\p{P}\$\+<=>\^~\|]+"#,
    r#"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"#,
    r#"\p{N}+"#,
    r#"[0-9][0-9][0-9]"#,
];
