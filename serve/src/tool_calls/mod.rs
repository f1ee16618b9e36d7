//! Tool calls: which format a model writes them in, how to read them from its output, and the
//! grammar that makes a forced call valid.
//!
//! A model learns one tool-call format in training, and its chat template shows it (the template
//! describes the format to the model in the tools' system text, and renders earlier calls in it).
//! So the format is detected from the template, as llama.cpp's server does:
//!
//! | format | written as | families |
//! |---|---|---|
//! | [`Format::Hermes`] | `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` | Qwen 2.5/3, Granite 4, Hermes |
//! | [`Format::QwenXml`] | `<tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n</function>\n</tool_call>` | Qwen 3.5, Qwen3-Coder |
//! | [`Format::Hunyuan`] | `<tool_calls><tool_call>NAME\n```json\n{…}\n```</tool_call></tool_calls>` | Hunyuan |
//! | [`Format::Lfm2`] | `<\|tool_call_start\|>[name(a=1, b="x")]<\|tool_call_end\|>` | LFM2 |
//! | [`Format::Llama3`] | `{"name": …, "parameters": {…}}` (after `<\|python_tag\|>` at times) | Llama 3.1–3.3 |
//! | [`Format::Mistral`] | `[TOOL_CALLS][{"name": …, "arguments": {…}}]` | Mistral |
//!
//! A template that renders tools in none of these gets [`Format::Generic`] ([`generic`]): the
//! tools described in a system message, the answer held by grammar to a JSON object that calls
//! them or answers in text.

pub mod generic;
mod grammar;
mod parse;
mod pythonic;

use serde_json::Value;

pub use grammar::forced_grammar;
pub use parse::parse_calls;

/// A tool-call format (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Hermes JSON in `<tool_call>` tags.
    Hermes,
    /// Qwen's XML function calls in `<tool_call>` tags.
    QwenXml,
    /// Hunyuan's name and fenced JSON arguments in `<tool_calls>`.
    Hunyuan,
    /// LFM2's Python-style calls between `<|tool_call_start|>` and `<|tool_call_end|>`.
    Lfm2,
    /// Llama 3.x's bare JSON object.
    Llama3,
    /// Mistral's `[TOOL_CALLS]` JSON array.
    Mistral,
    /// The generic JSON answer, for templates without a format of their own ([`generic`]).
    Generic,
}

impl Format {
    /// The format `template` teaches its model, or `None` when it renders no tool calls.
    pub fn detect(template: &str) -> Option<Format> {
        let has = |s: &str| template.contains(s);
        if !has("tools") {
            return None;
        }
        Some(if has("<tool_calls>") {
            Format::Hunyuan
        } else if has("<function=") {
            Format::QwenXml
        } else if has("<tool_call>") {
            Format::Hermes
        } else if has("<|tool_call_start|>") || has("<|tool_list_start|>") {
            Format::Lfm2
        } else if has("[TOOL_CALLS]") || has("[AVAILABLE_TOOLS]") {
            Format::Mistral
        } else if has("<|python_tag|>") || (has("<|eot_id|>") && has("parameters")) {
            Format::Llama3
        } else {
            return None;
        })
    }

    /// The text that opens a tool call in this format: output from it on is a call, not an answer.
    /// Llama 3's calls have no opening tag: an answer that starts with `{` is one.
    pub fn opening(self) -> &'static str {
        match self {
            Format::Hermes | Format::QwenXml => "<tool_call>",
            Format::Hunyuan => "<tool_calls>",
            Format::Lfm2 => "<|tool_call_start|>",
            Format::Llama3 => "<|python_tag|>",
            Format::Mistral => "[TOOL_CALLS]",
            Format::Generic => "{",
        }
    }

    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Hermes => "Hermes <tool_call> JSON",
            Format::QwenXml => "Qwen <tool_call><function=…> XML",
            Format::Hunyuan => "Hunyuan <tool_calls>",
            Format::Lfm2 => "LFM2 <|tool_call_start|> Python calls",
            Format::Llama3 => "Llama 3 JSON",
            Format::Mistral => "Mistral [TOOL_CALLS]",
            Format::Generic => "generic JSON",
        }
    }
}

/// One function a request offers (OpenAI's `tools[i].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// Its parameters' JSON schema (`{"type": "object"}` when the request gave none).
    pub parameters: Value,
}

/// One call read from a model's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The function called.
    pub name: String,
    /// Its arguments, JSON text of an object (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// What the model's output held: its text outside the calls, and the calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// The answer's text before the first call (trimmed).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<Call>,
}

/// Where in `text` (an answer so far) a tool call begins or may be beginning, so a stream holds
/// back everything from there: the opening tag, a prefix of it at the end, or for Llama 3 an answer
/// that starts with `{`.
pub fn call_start(format: Format, text: &str) -> Option<usize> {
    // A generic answer is one JSON object from its first character: all of it is held.
    if format == Format::Generic {
        return Some(0);
    }
    let open = format.opening();
    if let Some(at) = text.find(open) {
        return Some(at);
    }
    if format == Format::Llama3 {
        let lead = text.len() - text.trim_start().len();
        if text[lead..].starts_with('{') {
            return Some(lead);
        }
    }
    // The end may be the opening's first characters: held back as a stop string's would be.
    let k = onebit_runtime::generate::held_back(text, &[open]);
    (k > 0).then(|| text.len() - k)
}

#[cfg(test)]
#[path = "forced_tests.rs"]
mod forced_tests;
