//! The request parser's refusals, defaults and aliases.

use super::*;

use crate::values::json_body;
use axum::http::StatusCode;

fn body(s: &str) -> serde_json::Map<String, Value> {
    json_body(s.as_bytes()).expect("json")
}

/// `b` read as `route`'s fields (unknown ones refused), then parsed by `parse`.
fn parsed(
    b: &serde_json::Map<String, Value>,
    route: &Route,
    parse: fn(&Fields) -> Result<Parsed, ApiError>,
) -> Result<Parsed, ApiError> {
    let (fields, _) = Fields::checked(b.clone(), route, false)?;
    parse(&fields)
}

fn chat_of(b: &serde_json::Map<String, Value>) -> Result<Parsed, ApiError> {
    parsed(b, &CHAT, chat)
}

fn completion_of(b: &serde_json::Map<String, Value>) -> Result<Parsed, ApiError> {
    parsed(b, &COMPLETION, completion)
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        (
            r#"{"messages":[{"role":"wizard","content":"x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
            "max_tokens",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#,
            "temperature",
        ),
        (r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#, "n"),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"n":129}"#,
            "n",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"stop":[""]}"#,
            "stop[0]",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"stop":""}"#,
            "stop",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"repetition_penalty":1e-300}"#,
            "repetition_penalty",
        ),
        (
            r#"{"messages":[{"role":"user","content":{"a":1}}]}"#,
            "messages[0].content",
        ),
        (r#"{"messages":[]}"#, "messages"),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"frequency_penalty":2.5}"#,
            "frequency_penalty",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"presence_penalty":"1"}"#,
            "presence_penalty",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"min_p":1.5}"#,
            "min_p",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"typical_p":0}"#,
            "typical_p",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"repeat_last_n":-2}"#,
            "repeat_last_n",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"the":1}}"#,
            "logit_bias.the",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":101}}"#,
            "logit_bias.5",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":1,"05":2}}"#,
            "logit_bias.05",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":[1]}"#,
            "logit_bias",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"mirostat":2}"#,
            "mirostat",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":3}"#,
            "top_logprobs",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_token":3}"#,
            "max_token",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"prompt":"y"}"#,
            "prompt",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"store":true}"#,
            "store",
        ),
    ];
    for (s, field) in cases {
        let e = chat_of(&body(s)).expect_err(s);
        assert_eq!(e.param.as_deref(), Some(field), "{s}: {}", e.message);
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
    let e = completion_of(&body(r#"{"prompt":{"x":1}}"#)).expect_err("object prompt");
    assert_eq!(e.param.as_deref(), Some("prompt"));
    for (s, field) in [
        (r#"{"prompt":"x","min_p":-0.05}"#, "min_p"),
        (r#"{"prompt":"x","tfs_z":0.9}"#, "tfs_z"),
        (r#"{"prompt":"x","top_logprobs":2}"#, "top_logprobs"),
        (r#"{"prompt":"x","messages":[]}"#, "messages"),
    ] {
        let e = completion_of(&body(s)).expect_err(s);
        assert_eq!(e.param.as_deref(), Some(field), "{s}: {}", e.message);
    }
    // Labels that change no answer pass.
    chat_of(&body(
        r#"{"messages":[{"role":"user","content":"x"}],"user":"u1","metadata":{"a":"b"},"store":false,"tool_choice":"none","top_logprobs":0}"#,
    ))
    .expect("labels");
    let e = json_body(b"{\"prompt\": \"abc").expect_err("truncated");
    assert_eq!(e.code, Some("invalid_json"));
    let e = json_body(b"{\"prompt\": \"\xff\xfe\"}").expect_err("invalid utf-8");
    assert_eq!(e.code, Some("invalid_json"));
}

#[test]
fn sampling_fields_reach_the_sampler() {
    let p = completion_of(&body(
        r#"{"prompt":"x","min_p":0.1,"typical_p":0.9,"presence_penalty":0.5,
            "frequency_penalty":-0.25,"repeat_last_n":64,"logit_bias":{"7":-100,"3":2.5}}"#,
    ))
    .expect("sampling fields");
    let s = &p.common.sampler;
    assert_eq!((s.min_p, s.typical_p), (0.1, 0.9));
    assert_eq!((s.presence_penalty, s.frequency_penalty), (0.5, -0.25));
    assert_eq!(s.repeat_last_n, 64);
    assert_eq!(s.logit_bias, vec![(3, 2.5), (7, -100.0)]);
    let all = completion_of(&body(r#"{"prompt":"x","repeat_last_n":-1}"#)).expect("-1");
    assert_eq!(
        all.common.sampler.repeat_last_n,
        usize::MAX,
        "-1 is the whole context"
    );
    let e = check_logit_bias(s, 7).expect_err("id 7 of 7");
    assert_eq!(e.param.as_deref(), Some("logit_bias.7"));
    check_logit_bias(s, 8).expect("inside the vocabulary");
}

#[test]
fn lenient_drops_only_unknown_fields_and_names_them() {
    let b = body(r#"{"prompt":"x","mirostat":2,"min_p":0.1,"tfs_z":1}"#);
    let (fields, mut dropped) = Fields::checked(b.clone(), &COMPLETION, true).expect("lenient");
    dropped.sort();
    assert_eq!(dropped, ["mirostat", "tfs_z"]);
    let p = completion(&fields).expect("the rest parses");
    assert_eq!(p.common.sampler.min_p, 0.1);
    // A known field with a bad value is still refused.
    let b = body(r#"{"prompt":"x","mirostat":2,"min_p":2}"#);
    let (fields, _) = Fields::checked(b, &COMPLETION, true).expect("lenient");
    let e = completion(&fields).expect_err("min_p 2");
    assert_eq!(e.param.as_deref(), Some("min_p"));
}

#[test]
fn seeds_keep_all_64_bits() {
    let seed = |v: &str| {
        completion_of(&body(&format!(r#"{{"prompt":"x","seed":{v}}}"#)))
            .expect(v)
            .common
            .sampler
            .seed
    };
    assert_eq!(seed("3"), 3);
    assert_eq!(seed("9223372036854775808"), 1 << 63);
    assert_eq!(seed("18446744073709551615"), u64::MAX);
    assert_ne!(seed("9223372036854775808"), seed("18446744073709551615"));
    assert_eq!(seed("-1"), u64::MAX, "two's complement");
}

#[test]
fn requests_parse_with_defaults_and_aliases() {
    let p = chat_of(&body(
        r#"{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},
            {"role":"user","content":"hi"}],"max_completion_tokens":7,"temperature":0,"seed":3,
            "stop":"\n","stream":true,"stream_options":{"include_usage":true}}"#,
    ))
    .expect("chat");
    let Prompt::Chat(m) = &p.prompt else {
        panic!("not chat: {:?}", p.prompt)
    };
    assert_eq!(
        (m[0].role.as_str(), m[0].content.as_str()),
        ("system", "be brief")
    );
    assert_eq!(p.common.max_tokens, Some(7));
    assert_eq!(
        (p.common.sampler.temperature, p.common.sampler.seed),
        (0.0, 3)
    );
    assert_eq!(p.common.stop, vec!["\n".to_string()]);
    assert!(p.common.stream && p.common.include_usage);
    let p = completion_of(&body(r#"{"prompt":[1,2,3]}"#)).expect("tokens");
    assert!(matches!(p.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
    assert_eq!(
        p.common.sampler.temperature, 1.0,
        "OpenAI's default temperature"
    );
}

/// `tools`, `tool_choice`, tool messages and `response_format`: each wrong shape is refused under
/// its own field.
#[test]
fn tool_and_format_refusals_name_the_field() {
    let user = r#""messages":[{"role":"user","content":"x"}]"#;
    let f = r#"{"type":"function","function":{"name":"f"}}"#;
    let cases = [
        (format!(r#"{{{user},"tools":{{}}}}"#), "tools"),
        (
            format!(r#"{{{user},"tools":[{{"type":"retrieval"}}]}}"#),
            "tools[0].type",
        ),
        (
            format!(r#"{{{user},"tools":[{{"type":"function","function":{{"name":"a b"}}}}]}}"#),
            "tools[0].function.name",
        ),
        (format!(r#"{{{user},"tools":[{f},{f}]}}"#), "tools[1].function.name"),
        (
            format!(r#"{{{user},"tools":[{f}],"tool_choice":"sometimes"}}"#),
            "tool_choice",
        ),
        (
            format!(r#"{{{user},"tools":[{f}],"tool_choice":{{"type":"function","function":{{"name":"g"}}}}}}"#),
            "tool_choice",
        ),
        (format!(r#"{{{user},"tool_choice":"required"}}"#), "tool_choice"),
        (
            format!(r#"{{{user},"tools":[{f}],"parallel_tool_calls":1}}"#),
            "parallel_tool_calls",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{oops"}}]}]}"#.to_string(),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            format!(r#"{{{user},"response_format":{{"type":"yaml"}}}}"#),
            "response_format.type",
        ),
        (
            format!(r#"{{{user},"response_format":{{"type":"json_schema","json_schema":{{"name":"x"}}}}}}"#),
            "response_format.json_schema.schema",
        ),
        (format!(r#"{{{user},"response_format":"json"}}"#), "response_format"),
    ];
    for (b, field) in cases {
        let e = chat_of(&body(&b)).expect_err(&b);
        assert_eq!(e.param.as_deref(), Some(field), "{b}: {}", e.message);
    }
}

/// A tool conversation parses into what the template renders: the assistant's call with its
/// arguments as an object, the tool's result with its call id; `none` keeps the tools for the
/// template and reads no calls.
#[test]
fn a_tool_conversation_parses_for_the_template() {
    let b = body(
        r#"{"messages":[{"role":"user","content":"w?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
              "function":{"name":"f","arguments":"{\"a\": 1}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"sunny"}],
          "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}"#,
    );
    let p = chat_of(&b).expect("parses");
    let Prompt::ChatWith(m, extras) = &p.prompt else {
        panic!("tools are rendered: {:?}", p.prompt);
    };
    assert_eq!(extras.tools.len(), 1);
    assert_eq!(
        m[1].tool_calls
            .as_ref()
            .map(|c| c[0]["function"]["arguments"]["a"].clone()),
        Some(json!(1))
    );
    assert_eq!(
        (m[2].role.as_str(), m[2].tool_call_id.as_deref()),
        ("tool", Some("c1"))
    );
    let t = p.tools.expect("tools");
    assert_eq!(t.choice, crate::tool_fields::Choice::None);
}

#[test]
fn template_variables_and_reasoning_effort_reach_the_template_or_are_refused() {
    let b = body(
        r#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false}}"#,
    );
    let p = chat_of(&b).expect("kwargs");
    let Prompt::ChatWith(_, e) = &p.prompt else {
        panic!("{:?}", p.prompt)
    };
    assert_eq!(e.kwargs["enable_thinking"], json!(false));
    let b = body(r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"none"}"#);
    let p = chat_of(&b).expect("effort");
    let prompt =
        with_reasoning_effort(p.prompt, Some("{% if enable_thinking %}"), "none").expect("switch");
    let Prompt::ChatWith(_, e) = &prompt else {
        panic!("{prompt:?}")
    };
    assert_eq!(e.kwargs["enable_thinking"], json!(false));
    let p = chat_of(&b).expect("effort");
    let prompt =
        with_reasoning_effort(p.prompt, Some("{{ reasoning_effort }}"), "low").expect("as is");
    let Prompt::ChatWith(_, e) = &prompt else {
        panic!("{prompt:?}")
    };
    assert_eq!(e.kwargs["reasoning_effort"], json!("low"));
    let e = with_reasoning_effort(prompt, Some("{{ messages }}"), "low").expect_err("no switch");
    assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
    for (s, param) in [
        (
            r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}"#,
            "reasoning_effort",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}"#,
            "chat_template_kwargs",
        ),
    ] {
        let e = chat_of(&body(s)).expect_err(s);
        assert_eq!(e.param.as_deref(), Some(param));
    }
}
