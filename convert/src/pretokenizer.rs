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
//! The test `convert/tests/pretokenizers.rs` holds every entry to llama.cpp's own ids
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

/// Every pre-tokenizer llama.cpp knows (`llama_vocab::impl::load`, the BPE branch), in its order.
pub static PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        names: &["default"],
        kind: "DEFAULT",
        splits: DEFAULT,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["minicpm5"],
        kind: "MINICPM5",
        splits: MINICPM5,
        encoding: Encoding::ByteLevel,
        ignore_merges: true,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        kind: "LLAMA3",
        splits: LLAMA3,
        encoding: Encoding::ByteLevel,
        ignore_merges: true,
        add_bos: true,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["deepseek-llm"],
        kind: "DEEPSEEK_LLM",
        splits: DEEPSEEK_LLM,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["deepseek-coder"],
        kind: "DEEPSEEK_CODER",
        splits: DEEPSEEK_CODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["deepseek-v3"],
        kind: "DEEPSEEK3_LLM",
        splits: DEEPSEEK3_LLM,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["spark2_5"],
        kind: "SPARK2_5",
        splits: SPARK2_5,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["youtu"],
        kind: "YOUTU",
        splits: YOUTU,
        encoding: Encoding::ByteLevel,
        ignore_merges: true,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["falcon"],
        kind: "FALCON",
        splits: FALCON,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["mpt"],
        kind: "MPT",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["starcoder"],
        kind: "STARCODER",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
        ],
        kind: "GPT2",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["jais-2"],
        kind: "JAIS2",
        splits: JAIS2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["gemma4", "granite-embed-multi-311m"],
        kind: "GEMMA4",
        splits: GEMMA4,
        encoding: Encoding::Raw {
            escape_spaces: true,
        },
        ignore_merges: false,
        add_bos: true,
        force_bos: true,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["sarvam-moe"],
        kind: "SARVAM_MOE",
        splits: GEMMA4,
        encoding: Encoding::Raw {
            escape_spaces: true,
        },
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["jina-v1-en", "jina-v2-code", "roberta-bpe"],
        kind: "GPT2",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["whitespace"],
        kind: "WHITESPACE",
        splits: WHITESPACE,
        encoding: Encoding::Raw {
            escape_spaces: false,
        },
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["refact"],
        kind: "REFACT",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["command-r"],
        kind: "COMMAND_R",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"],
        kind: "QWEN2",
        splits: QWEN2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["qwen35"],
        kind: "QWEN35",
        splits: QWEN35,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["stablelm2"],
        kind: "STABLELM2",
        splits: QWEN2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["olmo"],
        kind: "OLMO",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["dbrx"],
        kind: "DBRX",
        splits: LLAMA3,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["smaug-bpe"],
        kind: "SMAUG",
        splits: LLAMA3,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["poro-chat"],
        kind: "PORO",
        splits: PORO,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["chatglm-bpe"],
        kind: "CHATGLM4",
        splits: LLAMA3,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["glm4", "glm5"],
        kind: "CHATGLM4",
        splits: LLAMA3,
        encoding: Encoding::ByteLevel,
        ignore_merges: true,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["viking"],
        kind: "VIKING",
        splits: VIKING,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["jais"],
        kind: "JAIS",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["tekken"],
        kind: "TEKKEN",
        splits: TEKKEN,
        encoding: Encoding::ByteLevel,
        ignore_merges: true,
        add_bos: true,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["smollm"],
        kind: "SMOLLM",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["codeshell"],
        kind: "CODESHELL",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["bloom"],
        kind: "BLOOM",
        splits: PORO,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["gpt3-finnish"],
        kind: "GPT3_FINNISH",
        splits: PORO,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["exaone"],
        kind: "EXAONE",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["exaone4"],
        kind: "GPT2",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["exaone-moe"],
        kind: "EXAONE_MOE",
        splits: EXAONE_MOE,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["chameleon"],
        kind: "CHAMELEON",
        splits: CHAMELEON,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: true,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["minerva-7b"],
        kind: "MINERVA",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["megrez"],
        kind: "QWEN2",
        splits: QWEN2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
    PreTokenizer {
        names: &["gpt-4o", "llama4", "kanana2", "talkie"],
        kind: "GPT4O",
        splits: GPT4O,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["granite-embed-multi-97m"],
        kind: "GRANITE_EMB_MULTI",
        splits: GRANITE_EMB_MULTI,
        encoding: Encoding::ByteLevel,
        ignore_merges: true,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["tiny_aya", "cohere2moe"],
        kind: "TINY_AYA",
        splits: TINY_AYA,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["superbpe"],
        kind: "SUPERBPE",
        splits: SUPERBPE,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["trillion"],
        kind: "TRILLION",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["granite-docling"],
        kind: "GRANITE_DOCLING",
        splits: GPT2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["bailingmoe", "bailingmoe2", "llada-moe"],
        kind: "BAILINGMOE",
        splits: BAILINGMOE,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["seed-coder"],
        kind: "SEED_CODER",
        splits: SEED_CODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["hunyuan"],
        kind: "HUNYUAN",
        splits: QWEN2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["hunyuan-dense"],
        kind: "HUNYUAN_DENSE",
        splits: DEEPSEEK3_LLM,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["hy_v4"],
        kind: "HY_V4",
        splits: DEEPSEEK3_LLM,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["joyai-llm"],
        kind: "JOYAI_LLM",
        splits: DEEPSEEK3_LLM,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["kimi-k2"],
        kind: "KIMI_K2",
        splits: KIMI_K2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["ufakzeka"],
        kind: "UFAKZEKA",
        splits: UFAKZEKA,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["grok-2"],
        kind: "GROK_2",
        splits: QWEN2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["afmoe"],
        kind: "AFMOE",
        splits: AFMOE,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["laguna"],
        kind: "LAGUNA",
        splits: LAGUNA,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["minimax-m2"],
        kind: "MINIMAX_M2",
        splits: GPT4O,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["solar-open"],
        kind: "SOLAR_OPEN",
        splits: QWEN2,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: false,
    },
    PreTokenizer {
        names: &["mellum2"],
        kind: "MELLUM2",
        splits: STARCODER,
        encoding: Encoding::ByteLevel,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        clean_spaces: true,
    },
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
