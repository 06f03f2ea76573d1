//! Every format streams a call's arguments as they are generated: fed one
//! character at a time, a call begins at its arguments' first bracket and
//! every later character of them is released as soon as it is in; fed in
//! pieces split anywhere, the calls and content are the same.

use super::*;

/// Arguments with braces, brackets, quotes, escapes and markup inside
/// strings, nesting, and multi-byte characters.
const ARGS: &str = r#"{"city": "Pa\"ris}{", "q": "a\\b [x] \u00e9", "html": "<b>}</b>", "days": [1, {"n": 2}], "e": "日本 🎉"}"#;

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// Outputs of every format with several calls (the second with empty
/// arguments) and, where the format allows, text before them: (format,
/// output, content).
fn outputs() -> Vec<(ToolFormat, String, &'static str)> {
    let ds = |c: &str| format!("<｜tool▁calls▁begin｜>{c}<｜tool▁calls▁end｜>");
    vec![
        (
            ToolFormat::Hermes,
            format!(
                "Let me check.<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {ARGS}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"t\", \"arguments\": {{}}}}\n</tool_call>"
            ),
            "Let me check.",
        ),
        (
            ToolFormat::Mistral,
            format!(
                "Sure.[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {ARGS}}}, {{\"name\": \"t\", \"arguments\": {{}}}}]"
            ),
            "Sure.",
        ),
        (
            ToolFormat::Mistral,
            format!("Sure. [TOOL_CALLS]get_weather[ARGS]{ARGS}[TOOL_CALLS]t[ARGS]{{}}"),
            "Sure. ",
        ),
        (
            ToolFormat::DeepSeek,
            format!(
                "Let me see.{}",
                ds(&format!(
                    "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜><｜tool▁call▁begin｜>t<｜tool▁sep｜>{{}}<｜tool▁call▁end｜>"
                ))
            ),
            "Let me see.",
        ),
        (
            ToolFormat::DeepSeek,
            ds(&format!(
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{ARGS}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>t\n```json\n{{}}\n```<｜tool▁call▁end｜>"
            )),
            "",
        ),
        (
            ToolFormat::Llama3Json,
            format!(
                "<|python_tag|>{{\"name\": \"get_weather\", \"parameters\": {ARGS}}}; {{\"name\": \"t\", \"parameters\": {{}}}}"
            ),
            "",
        ),
        (
            ToolFormat::Llama3Json,
            format!(
                " [{{\"name\": \"get_weather\", \"parameters\": {ARGS}}},{{\"name\":\"t\",\"parameters\":{{}}}}]"
            ),
            "",
        ),
        (
            ToolFormat::Json,
            format!(
                "{{\"name\": \"get_weather\", \"arguments\": {ARGS}}}; {{\"name\": \"t\", \"arguments\": {{}}}}"
            ),
            "",
        ),
        (
            ToolFormat::Json,
            format!(
                "[\n  {{\"name\": \"get_weather\", \"arguments\": {ARGS}}},\n  {{\"name\": \"t\", \"arguments\": {{}}}}\n]"
            ),
            "",
        ),
    ]
}

/// Where each call's arguments are in `text`: the first occurrence of
/// each after the previous one.
fn spans(text: &str, calls: &[ParsedCall]) -> Vec<(usize, usize)> {
    let mut from = 0;
    calls
        .iter()
        .map(|c| {
            let start = from + text[from..].find(&c.arguments).expect("arguments in text");
            from = start + c.arguments.len();
            (start, from)
        })
        .collect()
}

#[test]
fn arguments_are_released_character_by_character() {
    let want = vec![call("get_weather", ARGS), call("t", "{}")];
    for (format, text, content) in outputs() {
        let name = format.name();
        assert_eq!(
            parse_all(format, &text),
            (content.to_string(), want.clone()),
            "{name}: {text}"
        );
        let spans = spans(&text, &want);
        let mut parser = format.parser();
        let (mut got, mut pieces) = (String::new(), Vec::new());
        for (i, ch) in text.char_indices() {
            let (c, k) = parser.push(&ch.to_string());
            got.push_str(&c);
            pieces.extend(k);
            // After the character ending at `end`, a call has begun iff its
            // arguments' first bracket is in, and its arguments so far are
            // exactly the text of them that is in.
            let end = i + ch.len_utf8();
            let calls = join(&pieces);
            for (j, &(start, stop)) in spans.iter().enumerate() {
                if end <= start {
                    assert!(calls.len() <= j, "{name}: call {j} began early at {end}");
                } else if end <= stop {
                    assert_eq!(calls.len(), j + 1, "{name}: call {j} at {end}: {pieces:?}");
                    assert_eq!(calls[j].arguments, text[start..end], "{name} at {end}");
                }
            }
        }
        let (c, k) = parser.finish();
        got.push_str(&c);
        pieces.extend(k);
        assert_eq!(
            (got.as_str(), join(&pieces)),
            (content, want.clone()),
            "{name}"
        );
        // Each call: its name first, then one piece per character.
        let mut begins = pieces.iter().enumerate().filter_map(|(i, p)| match p {
            CallPiece::Begin(n) => Some((i, n.as_str())),
            CallPiece::Args(_) => None,
        });
        let (a, b) = (begins.next(), begins.next());
        assert_eq!(
            (a, b, begins.next()),
            (
                Some((0, "get_weather")),
                Some((ARGS.chars().count() + 1, "t")),
                None
            ),
            "{name}: {pieces:?}"
        );
        assert_eq!(pieces.len(), ARGS.chars().count() + 4, "{name}: {pieces:?}");
    }
}

/// Feeds `text` in pieces cut at `cuts` (byte offsets on char boundaries).
fn feed(format: ToolFormat, text: &str, cuts: &[usize]) -> (String, Vec<ParsedCall>) {
    let mut parser = format.parser();
    let (mut content, mut pieces) = (String::new(), Vec::new());
    let mut at = 0;
    for &cut in cuts.iter().chain([&text.len()]) {
        let (c, k) = parser.push(&text[at..cut]);
        content.push_str(&c);
        pieces.extend(k);
        at = cut;
    }
    let (c, k) = parser.finish();
    content.push_str(&c);
    pieces.extend(k);
    (content, join(&pieces))
}

#[test]
fn any_split_gives_the_same_calls() {
    let want = vec![call("get_weather", ARGS), call("t", "{}")];
    for (format, text, content) in outputs() {
        let want = (content.to_string(), want.clone());
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        // Every single cut point (two pieces: any token boundary a
        // tokenizer could choose, inside any marker or bracket), and with
        // each a third of the later ones (three pieces).
        for (n, &a) in bounds.iter().enumerate() {
            assert_eq!(feed(format, &text, &[a]), want, "{format:?} cut at {a}");
            for &b in bounds[n + 1..].iter().step_by(3) {
                assert_eq!(feed(format, &text, &[a, b]), want, "{format:?} {a} {b}");
            }
        }
    }
}

/// Each of `cases` (format, output, content, calls) whole and streamed in
/// single characters.
fn check(cases: &[(ToolFormat, &str, &str, Vec<ParsedCall>)]) {
    for (format, text, content, calls) in cases {
        let want = (content.to_string(), calls.clone());
        assert_eq!(parse_all(*format, text), want, "{format:?}: {text}");
        let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        assert_eq!(
            feed(*format, text, &cuts),
            want,
            "{format:?} by char: {text}"
        );
    }
}

#[test]
fn a_call_the_output_breaks_off_keeps_what_was_streamed() {
    // The output ends inside the arguments: the call stays, with the text
    // it had (what was streamed is its whole arguments).
    let cut = r#"{"a": "x}"#;
    let f = || vec![call("f", cut)];
    check(&[
        (
            ToolFormat::Hermes,
            &format!(r#"<tool_call>{{"name": "f", "arguments": {cut}"#),
            "",
            f(),
        ),
        (
            ToolFormat::Mistral,
            &format!(r#"[TOOL_CALLS][{{"name": "f", "arguments": {cut}"#),
            "",
            f(),
        ),
        (
            ToolFormat::Mistral,
            &format!("[TOOL_CALLS]f[ARGS]{cut}"),
            "",
            f(),
        ),
        (
            ToolFormat::DeepSeek,
            &format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{cut}"),
            "",
            f(),
        ),
        (
            ToolFormat::Llama3Json,
            &format!(r#"{{"name": "f", "parameters": {cut}"#),
            "",
            f(),
        ),
        (
            ToolFormat::Json,
            &format!(r#"[{{"name": "f", "arguments": {cut}"#),
            "",
            f(),
        ),
    ]);
    // It ends before any call began: nothing was streamed, and the text is
    // content (after the marker, for the marked formats), as without tools.
    let head = r#"{"name": "f", "argu"#;
    check(&[
        (
            ToolFormat::Mistral,
            &format!("[TOOL_CALLS][{head}"),
            &format!("[{head}"),
            vec![],
        ),
        (ToolFormat::Mistral, "[TOOL_CALLS]f[AR", "f[AR", vec![]),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁s",
            "<｜tool▁call▁begin｜>f<｜tool▁s",
            vec![],
        ),
        (ToolFormat::Llama3Json, head, head, vec![]),
        (ToolFormat::Json, "[", "[", vec![]),
    ]);
    // A later call broken off before it began: the calls made stand.
    check(&[(
        ToolFormat::Llama3Json,
        r#"{"name": "f", "parameters": {}}; {"name": "g", "par"#,
        "",
        vec![call("f", "{}")],
    )]);
}

#[test]
fn text_that_is_not_calls_is_content() {
    check(&[
        (
            ToolFormat::Mistral,
            "Hi [TOOL_CALLS] sorry, no.",
            "Hi  sorry, no.",
            vec![],
        ),
        (ToolFormat::Mistral, "[TOOL_CALLS][1, 2]", "[1, 2]", vec![]),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜>oops",
            "oops",
            vec![],
        ),
        (
            ToolFormat::Llama3Json,
            "{this is not json}",
            "{this is not json}",
            vec![],
        ),
        (
            ToolFormat::Json,
            " [1, {\"name\": \"f\"}]",
            " [1, {\"name\": \"f\"}]",
            vec![],
        ),
        (ToolFormat::Json, "[]", "[]", vec![]),
        (
            ToolFormat::Json,
            "The {weather} is fine.",
            "The {weather} is fine.",
            vec![],
        ),
        (
            ToolFormat::Json,
            r#"{"arguments": {}}"#,
            r#"{"arguments": {}}"#,
            vec![],
        ),
    ]);
}

#[test]
fn what_follows_the_calls_is_dropped() {
    // Once calls were made, text that does not go on with calls is not
    // content: trailing prose, a next call that does not parse.
    check(&[
        (
            ToolFormat::Llama3Json,
            r#"{"name": "f", "parameters": {"a": 1}, "extra": "}"} and then"#,
            "",
            vec![call("f", r#"{"a": 1}"#)],
        ),
        (
            ToolFormat::Mistral,
            r#"[TOOL_CALLS][{"name": "f", "arguments": {}}, {"nope": 1}] ok"#,
            "",
            vec![call("f", "{}")],
        ),
        (
            ToolFormat::Mistral,
            r#"[TOOL_CALLS]f[ARGS]{"a": [1]} trailing"#,
            "",
            vec![call("f", r#"{"a": [1]}"#)],
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜> done",
            "",
            vec![call("f", "{}")],
        ),
    ]);
}

#[test]
fn calls_in_other_shapes_are_parsed_whole_among_streamed_ones() {
    // Arguments before the name, as a JSON string, or absent: the call is
    // read to its end and released as its name and one piece of arguments.
    let text = r#"[TOOL_CALLS][{"arguments": {"a": 1}, "name": "f"}, {"name": "g", "arguments": "{\"b\": 2}"}, {"name": "h"}, {"name": "i", "arguments": {"c": 3}}]"#;
    let want = vec![
        call("f", r#"{"a":1}"#),
        call("g", r#"{"b": 2}"#),
        call("h", "{}"),
        call("i", r#"{"c": 3}"#),
    ];
    check(&[(ToolFormat::Mistral, text, "", want.clone())]);
    let mut parser = ToolFormat::Mistral.parser();
    let mut pieces = Vec::new();
    for ch in text.chars() {
        pieces.extend(parser.push(&ch.to_string()).1);
    }
    pieces.extend(parser.finish().1);
    let whole: Vec<CallPiece> = want[..3]
        .iter()
        .flat_map(|c| {
            [
                CallPiece::Begin(c.name.clone()),
                CallPiece::Args(c.arguments.clone()),
            ]
        })
        .collect();
    assert_eq!(pieces[..6], whole[..]);
    // The last one streams: one piece per character.
    assert_eq!(pieces.len(), 6 + 1 + r#"{"c": 3}"#.len(), "{pieces:?}");
    // Bare values that are not objects, in the formats that allow them.
    check(&[
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS]f[ARGS] 7",
            "",
            vec![call("f", "7")],
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>\"x\"<｜tool▁call▁end｜>",
            "",
            vec![call("f", "\"x\"")],
        ),
    ]);
}
