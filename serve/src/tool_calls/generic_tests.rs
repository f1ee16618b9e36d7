use serde_json::json;

use super::*;

fn msg(role: &str, content: &str) -> Message {
    Message {
        role: role.into(),
        content: content.into(),
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}),
    }
}

#[test]
fn a_tool_conversation_becomes_alternating_plain_turns() {
    let mut call = msg("assistant", "");
    call.tool_calls = Some(json!([{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]));
    let mut r1 = msg("tool", "{\"temp\": 21}");
    r1.tool_call_id = Some("c1".into());
    r1.name = Some("get_weather".into());
    let r2 = msg("tool", "sunny");
    let conv = vec![msg("user", "weather?"), call, r1, r2];
    assert!(needs_polyfill(&conv));
    let out = polyfill(&conv, Some("TOOLS"));
    let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(out[0].content, "TOOLS");
    assert_eq!(
        serde_json::from_str::<Value>(&out[2].content).expect("JSON"),
        json!({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]})
    );
    // Both results in one user turn, each a tool_response object; JSON content kept as JSON.
    let parts: Vec<Value> = out[3]
        .content
        .split("\n\n")
        .map(|p| serde_json::from_str(p).expect("JSON"))
        .collect();
    assert_eq!(
        parts,
        [
            json!({"tool_response": {"name": "get_weather", "id": "c1", "content": {"temp": 21}}}),
            json!({"tool_response": {"content": "sunny"}}),
        ]
    );
    assert!(out.iter().all(|m| m.tool_calls.is_none()));
}

#[test]
fn the_tools_text_joins_a_system_message_already_there() {
    let out = polyfill(
        &[msg("system", "Be brief."), msg("user", "hi")],
        Some("TOOLS"),
    );
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].content, "Be brief.\n\nTOOLS");
    assert!(!needs_polyfill(&[msg("user", "hi")]));
}

#[test]
fn answers_are_read_as_calls_or_as_the_response_text() {
    let calls =
        parse(r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}"#);
    assert_eq!(calls.content, "");
    assert_eq!(
        calls.calls,
        [Call {
            name: "get_weather".into(),
            arguments: r#"{"city":"Oslo"}"#.into()
        }]
    );
    let text = parse(r#"{"response": "It is sunny."}"#);
    assert_eq!(text.content, "It is sunny.");
    assert!(text.calls.is_empty());
    // Cut off by the budget: the calls it completed, or the text as written.
    let cut = parse(r#"{"tool_calls": [{"name": "get_wea"#);
    assert_eq!(cut.content, r#"{"tool_calls": [{"name": "get_wea"#);
    let two = parse(
        r#"{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}, {"name": "#,
    );
    let names: Vec<&str> = two.calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!((names, two.content.as_str()), (vec!["a", "b"], ""));
}

#[test]
fn the_grammar_offers_a_response_only_when_no_call_is_required() {
    let auto = grammar(&[weather()], false, true);
    let required = grammar(&[weather()], true, false);
    assert!(auto.contains("\\\"response\\\": "), "{auto}");
    assert!(!required.contains("response"), "{required}");
    assert!(auto.contains("(\", \" call)*"), "{auto}");
    assert!(!required.contains("call)*"), "{required}");
    assert!(
        required.contains("\\\"name\\\": \\\"get_weather\\\""),
        "{required}"
    );
    let listed = [json!({"type": "function", "function": {"name": "get_weather"}})];
    let must = system_text(&listed, Use::Must);
    assert!(
        must.contains("get_weather") && !must.contains("response"),
        "{must}"
    );
    assert!(system_text(&listed, Use::May).contains("\"response\""));
    assert!(!system_text(&listed, Use::Not).contains("tool_calls"));
}
