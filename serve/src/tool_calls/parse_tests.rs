//! Each format's calls read back, and answers that are not calls left as text.

use serde_json::json;

use super::*;
use crate::tool_calls::{Format, Tool, call_start};

fn call(name: &str, args: serde_json::Value) -> Call {
    Call {
        name: name.into(),
        arguments: args.to_string(),
    }
}

fn weather() -> Vec<Tool> {
    vec![Tool {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}}, "required": ["city"]}),
    }]
}

#[test]
fn every_format_reads_its_calls() {
    let paris = || call("get_weather", json!({"city": "Paris", "days": 3}));
    let cases = [
        (
            Format::Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
            "Let me check.",
            1,
        ),
        (
            Format::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"}\n</tool_call>",
            "",
            2,
        ),
        (
            Format::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "",
            1,
        ),
        (
            Format::Hunyuan,
            "<tool_calls><tool_call>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 3}\n```</tool_call></tool_calls>",
            "",
            1,
        ),
        (
            Format::Lfm2,
            "<|tool_call_start|>[get_weather(city=\"Paris\", days=3)]<|tool_call_end|>",
            "",
            1,
        ),
        (
            Format::Lfm2,
            "<|tool_call_start|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]<|tool_call_end|>",
            "",
            1,
        ),
        (
            Format::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}",
            "",
            1,
        ),
        (
            Format::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}",
            "",
            1,
        ),
        (
            Format::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]",
            "",
            1,
        ),
    ];
    for (format, text, content, n) in cases {
        let out = parse_calls(format, text, &weather());
        assert_eq!(out.content, content, "{format:?}: {text}");
        assert_eq!(out.calls, vec![paris(); n], "{format:?}: {text}");
    }
}

#[test]
fn answers_that_are_not_calls_stay_text() {
    for (format, text) in [
        (Format::Hermes, "The weather is fine."),
        (
            Format::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
        ),
        (Format::Llama3, "{\"answer\": 42}"),
        (
            Format::Lfm2,
            "<|tool_call_start|>[get_weather(city=]<|tool_call_end|>",
        ),
        (
            Format::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis",
        ),
    ] {
        let out = parse_calls(format, text, &weather());
        assert!(out.calls.is_empty(), "{format:?}: {text}");
        assert_eq!(out.content, text);
    }
}

#[test]
fn python_literals_read_as_json() {
    let c = pythonic::calls("[f(a='x\\'y', b=[1, 2.5, True, None], c={'k': (1, 2)}), g()]")
        .expect("reads");
    assert_eq!(
        c,
        vec![
            call(
                "f",
                json!({"a": "x'y", "b": [1, 2.5, true, null], "c": {"k": [1, 2]}})
            ),
            call("g", json!({})),
        ]
    );
    assert_eq!(pythonic::calls("f(a=1) trailing"), None);
}

#[test]
fn a_stream_holds_back_from_where_a_call_may_begin() {
    assert_eq!(call_start(Format::Hermes, "Sure. <tool"), Some(6));
    assert_eq!(call_start(Format::Hermes, "Sure. <tool_call>\n{"), Some(6));
    assert_eq!(call_start(Format::Hermes, "Sure."), None);
    assert_eq!(call_start(Format::Llama3, "  {\"name\""), Some(2));
    assert_eq!(call_start(Format::Llama3, "Hello {"), None);
    assert_eq!(call_start(Format::Lfm2, "ok <|tool"), Some(3));
}

#[test]
fn templates_name_their_format() {
    let t = |s: &str| Format::detect(&format!("{{% if tools %}}{s}{{% endif %}}"));
    assert_eq!(
        t("<tool_call>\n{\"name\": …}\n</tool_call>"),
        Some(Format::Hermes)
    );
    assert_eq!(t("<tool_call>\n<function=example>"), Some(Format::QwenXml));
    assert_eq!(
        t("print <tool_calls><tool_call>name"),
        Some(Format::Hunyuan)
    );
    assert_eq!(t("List of tools: <|tool_list_start|>"), Some(Format::Lfm2));
    assert_eq!(t("<|python_tag|>"), Some(Format::Llama3));
    assert_eq!(t("[AVAILABLE_TOOLS]"), Some(Format::Mistral));
    assert_eq!(Format::detect("{{ messages }}"), None);
}
