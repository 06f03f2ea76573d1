//! Every format's parser: whole and streamed in pieces.

use super::*;
use serde_json::json;

fn stream_in_pieces(format: ToolFormat, text: &str, size: usize) -> (String, Vec<ParsedCall>) {
    let mut s = ToolStream::new(format);
    let (mut content, mut calls) = (String::new(), Vec::new());
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(size) {
        let (c, k) = s.push(&piece.iter().collect::<String>());
        content.push_str(&c);
        calls.extend(k);
    }
    let (c, k) = s.finish();
    content.push_str(&c);
    calls.extend(k);
    (content, join(&calls))
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

#[test]
fn hermes_calls_with_text_before_and_split_markers() {
    let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let want = (
        "Let me check.".to_string(),
        vec![
            call("get_weather", r#"{"city": "Paris"}"#),
            call("get_time", "{}"),
        ],
    );
    assert_eq!(parse_all(ToolFormat::Hermes, text), want);
    for size in [1, 2, 3, 7, 13] {
        assert_eq!(
            stream_in_pieces(ToolFormat::Hermes, text, size),
            want,
            "pieces of {size}"
        );
    }
}

#[test]
fn hermes_plain_text_and_broken_calls_stay_content() {
    let plain = "a < b and <tool is not a call";
    assert_eq!(
        parse_all(ToolFormat::Hermes, plain),
        (plain.to_string(), vec![])
    );
    assert_eq!(
        stream_in_pieces(ToolFormat::Hermes, plain, 1),
        (plain.to_string(), vec![])
    );
    let broken = "x<tool_call>{not json}</tool_call>";
    assert_eq!(
        parse_all(ToolFormat::Hermes, broken),
        (broken.to_string(), vec![])
    );
    // Arguments given as JSON text are kept as that text.
    let s = r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#;
    assert_eq!(
        parse_all(ToolFormat::Hermes, s).1,
        vec![call("f", r#"{"a": 1}"#)]
    );
}

#[test]
fn llama3_json_whole_output_calls() {
    let text = r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
    let want = (
        String::new(),
        vec![call("get_weather", r#"{"city": "Oslo"}"#)],
    );
    assert_eq!(parse_all(ToolFormat::Llama3Json, text), want);
    assert_eq!(stream_in_pieces(ToolFormat::Llama3Json, text, 2), want);
    let tagged = format!("<|python_tag|>{text}; {text}");
    assert_eq!(parse_all(ToolFormat::Llama3Json, &tagged).1.len(), 2);
    let prose = "The weather is {fine}.";
    assert_eq!(
        stream_in_pieces(ToolFormat::Llama3Json, prose, 3),
        (prose.to_string(), vec![])
    );
    let not_a_call = "{this is not json";
    assert_eq!(
        parse_all(ToolFormat::Llama3Json, not_a_call),
        (not_a_call.to_string(), vec![])
    );
}

#[test]
fn mistral_both_formats() {
    let old = r#"Sure.[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]"#;
    let want = (
        "Sure.".to_string(),
        vec![call("f", r#"{"x": 1}"#), call("g", "{}")],
    );
    assert_eq!(parse_all(ToolFormat::Mistral, old), want);
    assert_eq!(stream_in_pieces(ToolFormat::Mistral, old, 3), want);
    let new = r#"[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}"#;
    assert_eq!(
        parse_all(ToolFormat::Mistral, new).1,
        vec![call("f", r#"{"x": 1}"#), call("g", "{}")]
    );
}

#[test]
fn deepseek_both_formats() {
    let v31 = "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let want = (
        "Let me see.".to_string(),
        vec![
            call("get_weather", r#"{"city": "Oslo"}"#),
            call("get_time", "{}"),
        ],
    );
    assert_eq!(parse_all(ToolFormat::DeepSeek, v31), want);
    assert_eq!(stream_in_pieces(ToolFormat::DeepSeek, v31, 2), want);
    let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(
        parse_all(ToolFormat::DeepSeek, v3),
        (
            String::new(),
            vec![call("get_weather", r#"{"city": "Oslo"}"#)]
        )
    );
    assert_eq!(
        ToolFormat::detect("{{'<｜tool▁calls▁begin｜>'}}"),
        ToolFormat::DeepSeek
    );
}

#[test]
fn detection_and_ids() {
    assert_eq!(
        ToolFormat::detect("{{ '<tool_call>' }}"),
        ToolFormat::Hermes
    );
    assert_eq!(ToolFormat::detect("[TOOL_CALLS] x"), ToolFormat::Mistral);
    assert_eq!(ToolFormat::detect("<|python_tag|>"), ToolFormat::Llama3Json);
    assert_eq!(ToolFormat::detect("plain"), ToolFormat::Json);
    let a = ToolFormat::Hermes.call_id();
    assert!(
        a.len() >= 9 && a.chars().all(|c| c.is_ascii_alphanumeric()),
        "{a}"
    );
    assert_ne!(a, ToolFormat::Hermes.call_id());
    assert_eq!(ToolFormat::Mistral.call_id().len(), 9);
}

#[test]
fn forcing_grammars_name_every_function() {
    let fs = vec![
        FunctionSpec {
            name: "f".into(),
            parameters: json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
        },
        FunctionSpec {
            name: "g".into(),
            parameters: Value::Null,
        },
    ];
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Mistral,
        ToolFormat::Llama3Json,
        ToolFormat::Json,
    ] {
        for parallel in [false, true] {
            let g = forcing_grammar(format, &fs, parallel);
            assert!(g.starts_with("start:") && g.contains("%json"), "{g}");
            assert!(
                g.contains(r#""const":"f""#) && g.contains(r#""const":"g""#),
                "{g}"
            );
        }
    }
}

/// Forced arguments are always an object: a schema naming no type gets
/// `"type": "object"`, and only schemas that can describe an object are
/// taken.
#[test]
fn forced_arguments_are_objects() {
    let spec = |parameters: Value| FunctionSpec {
        name: "f".into(),
        parameters,
    };
    assert_eq!(
        spec(json!({})).parameters_schema(),
        json!({"type": "object"})
    );
    assert_eq!(
        spec(json!({"properties": {"a": {}}})).parameters_schema(),
        json!({"type": "object", "properties": {"a": {}}})
    );
    assert_eq!(
        spec(Value::Null).parameters_schema(),
        json!({"type": "object"})
    );
    let typed = json!({"type": ["object", "null"]});
    assert_eq!(spec(typed.clone()).parameters_schema(), typed);
    for ok in [Value::Null, json!({}), json!({"type": "object"}), typed] {
        assert!(parameters_are_an_object(&ok), "{ok}");
    }
    for bad in [
        json!({"type": "string"}),
        json!({"type": ["array"]}),
        json!("x"),
        json!(3),
    ] {
        assert!(!parameters_are_an_object(&bad), "{bad}");
    }
}

/// The pieces of a Hermes output streamed one character at a time.
fn hermes_pieces(text: &str) -> (String, Vec<CallPiece>) {
    let mut s = ToolFormat::Hermes.parser();
    let (mut content, mut pieces) = (String::new(), Vec::new());
    for c in text.chars() {
        let (t, k) = s.push(&c.to_string());
        content.push_str(&t);
        pieces.extend(k);
    }
    let (t, k) = s.finish();
    content.push_str(&t);
    pieces.extend(k);
    (content, pieces)
}

#[test]
fn hermes_arguments_stream_as_they_are_written() {
    let args = r#"{"city": "Pa\"ris}", "days": [1, {"n": 2}]}"#;
    let text = format!(
        "Hi.<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n<tool_call>{{\"name\":\"t\",\"arguments\":{{}}}}</tool_call>"
    );
    let (content, pieces) = hermes_pieces(&text);
    assert_eq!(content, "Hi.");
    // The call begins as soon as the arguments' first bracket is in, and
    // every later character of them is released as it comes.
    assert_eq!(pieces[0], CallPiece::Begin("get_weather".into()));
    let first: Vec<String> = pieces[1..]
        .iter()
        .take_while(|p| matches!(p, CallPiece::Args(_)))
        .map(|p| match p {
            CallPiece::Args(a) => a.clone(),
            CallPiece::Begin(_) => String::new(),
        })
        .collect();
    assert_eq!(first.len(), args.chars().count(), "{pieces:?}");
    assert_eq!(first.concat(), args);
    assert_eq!(
        join(&pieces),
        vec![call("get_weather", args), call("t", "{}")]
    );
    assert_eq!(parse_all(ToolFormat::Hermes, &text).1, join(&pieces));
}

#[test]
fn hermes_other_shapes_are_parsed_whole() {
    // Arguments first, or as a JSON string: one piece at the close.
    for body in [
        r#"{"arguments": {"a": 1}, "name": "f"}"#,
        r#"{"name": "f", "arguments": "{\"a\": 1}"}"#,
    ] {
        let (content, pieces) = hermes_pieces(&format!("<tool_call>{body}</tool_call>"));
        assert_eq!(content, "");
        assert_eq!(pieces.len(), 2, "{pieces:?}");
        assert_eq!(join(&pieces)[0].name, "f");
    }
    // A streamed call the output breaks off keeps what it had.
    let (content, pieces) = hermes_pieces(r#"<tool_call>{"name": "f", "arguments": {"a": [1"#);
    assert_eq!(
        (content.as_str(), join(&pieces)),
        ("", vec![call("f", r#"{"a": [1"#)])
    );
}

#[test]
fn every_format_streams_calls_as_begin_then_arguments() {
    let outputs = [
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
        ),
        (
            ToolFormat::Mistral,
            r#"[TOOL_CALLS][{"name": "f", "arguments": {"x": [1, 2]}}]"#,
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\": [1, 2]}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::Llama3Json,
            r#"{"name": "f", "parameters": {"x": [1, 2]}}"#,
        ),
        (
            ToolFormat::Json,
            r#"{"name": "f", "arguments": {"x": [1, 2]}}"#,
        ),
    ];
    for (format, text) in outputs {
        let mut s = format.parser();
        let mut pieces = Vec::new();
        for c in text.chars() {
            pieces.extend(s.push(&c.to_string()).1);
        }
        pieces.extend(s.finish().1);
        // A call begins (with its name) before any of its arguments, and
        // its argument pieces concatenate to the whole call's arguments.
        assert_eq!(
            pieces.first(),
            Some(&CallPiece::Begin("f".into())),
            "{format:?}"
        );
        assert!(
            pieces[1..].iter().all(|p| matches!(p, CallPiece::Args(_))),
            "{format:?}: {pieces:?}"
        );
        let calls = join(&pieces);
        assert_eq!(calls, parse_all(format, text).1, "{format:?}");
        let args: Value = serde_json::from_str(&calls[0].arguments).expect("JSON");
        assert_eq!(args, json!({"x": [1, 2]}), "{format:?}");
    }
}
