//! Tool-call fragments as the pipeline emits them, for every format: a
//! call's first fragment carries its index, a fresh id and the name; later
//! ones the index and more arguments only; a call's fragments concatenate to
//! exactly its arguments, which arrive in several fragments as the text
//! streams in.

use super::*;

/// Outputs of every format: two calls, the second with empty arguments.
fn outputs() -> Vec<(ToolFormat, String)> {
    let args = r#"{"city": "Oslo", "note": "say \"hi\" {ok}"}"#;
    vec![
        (
            ToolFormat::Hermes,
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
            ),
        ),
        (
            ToolFormat::Mistral,
            format!(
                "[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {args}}}, {{\"name\": \"get_time\", \"arguments\": {{}}}}]"
            ),
        ),
        (
            ToolFormat::DeepSeek,
            format!(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{{}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            ),
        ),
        (
            ToolFormat::Llama3Json,
            format!(
                "{{\"name\": \"get_weather\", \"parameters\": {args}}}; {{\"name\": \"get_time\", \"parameters\": {{}}}}"
            ),
        ),
        (
            ToolFormat::Json,
            format!(
                "[{{\"name\": \"get_weather\", \"arguments\": {args}}}, {{\"name\": \"get_time\", \"arguments\": {{}}}}]"
            ),
        ),
    ]
}

/// Parsing `format`'s calls, special tokens kept.
fn config_of(format: ToolFormat) -> Config {
    Config {
        skip_special: false,
        stop: Vec::new(),
        include_stop: false,
        reasoning: None,
        tool_format: Some(format),
        forced_tools: false,
        single_call: false,
        context: Vec::new(),
    }
}

/// A pipeline parsing `format`'s calls, forced or not.
fn pipeline(format: ToolFormat, forced_tools: bool) -> Pipeline {
    Pipeline::new(Config {
        forced_tools,
        ..config_of(format)
    })
}

/// With `parallel_tool_calls: false` a model that writes two calls (under
/// `auto`, nothing forces one) gets the first alone, whole, and no text.
#[test]
fn one_call_at_most_when_not_parallel() {
    for (format, text) in outputs() {
        let mut pipe = Pipeline::new(Config {
            single_call: true,
            ..config_of(format)
        });
        let mut calls: Vec<ToolCallPiece> = Vec::new();
        let mut content = String::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            let o = pipe.push_text(&piece.iter().collect::<String>(), 1);
            content.push_str(&o.text);
            calls.extend(o.tool_calls);
        }
        let end = pipe.finish_text("");
        content.push_str(&end.text);
        calls.extend(end.tool_calls);
        assert_eq!(content, "", "{format:?}");
        assert!(calls.iter().all(|c| c.index == 0), "{format:?}: {calls:?}");
        let args: String = calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(calls[0].name, "get_weather", "{format:?}");
        assert_eq!(
            args, r#"{"city": "Oslo", "note": "say \"hi\" {ok}"}"#,
            "{format:?}"
        );
    }
}

#[test]
fn every_format_streams_fragments_of_the_openai_shape() {
    let args = r#"{"city": "Oslo", "note": "say \"hi\" {ok}"}"#;
    for (format, text) in outputs() {
        let mut pipe = pipeline(format, false);
        let mut fragments: Vec<ToolCallPiece> = Vec::new();
        // Pieces of three characters, as tokens would come.
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            let o = pipe.push_text(&piece.iter().collect::<String>(), 1);
            assert_eq!(o.text, "", "{format:?}");
            fragments.extend(o.tool_calls);
        }
        let o = pipe.finish_text("");
        assert_eq!(o.text, "", "{format:?}");
        fragments.extend(o.tool_calls);
        assert_eq!(pipe.stop_reason(), FinishReason::ToolCalls);

        let mut calls: Vec<(String, String, String, usize)> = Vec::new();
        for f in &fragments {
            let i = f.index as usize;
            if i == calls.len() {
                assert!(
                    f.id.len() >= 9 && f.id.chars().all(|c| c.is_ascii_alphanumeric()),
                    "{format:?}: first fragment {f:?}"
                );
                calls.push((f.id.clone(), f.name.clone(), String::new(), 0));
            } else {
                assert_eq!(i + 1, calls.len(), "{format:?}: index {f:?}");
                assert!(
                    f.id.is_empty() && f.name.is_empty() && !f.arguments.is_empty(),
                    "{format:?}: later fragment {f:?}"
                );
            }
            calls[i].2.push_str(&f.arguments);
            calls[i].3 += 1;
        }
        let got: Vec<(&str, &str)> = calls
            .iter()
            .map(|(_, n, a, _)| (n.as_str(), a.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![("get_weather", args), ("get_time", "{}")],
            "{format:?}"
        );
        assert_ne!(calls[0].0, calls[1].0, "{format:?}: ids repeat");
        // The first call's arguments came in many fragments, not whole.
        assert!(
            calls[0].3 >= args.chars().count() / 3,
            "{format:?}: {fragments:?}"
        );
    }
}

/// A forced call cut off before its name is complete (max_tokens) ends
/// with neither content nor a call: the held-back syntax is not text. Not
/// forced, the same text is the model's content (it never became a call).
/// Cut inside the arguments, the call keeps the ones it had, forced or not.
#[test]
fn a_forced_call_cut_off_leaves_no_text() {
    for (format, text) in outputs() {
        let at = text.find("weather").expect("the first call's name") + 3;
        // Into the arguments: the call has begun.
        let later = text.find("city").expect("the first call's arguments") + 2;
        for (cut, named) in [(&text[..at], false), (&text[..later], true)] {
            for forced in [true, false] {
                let mut pipe = pipeline(format, forced);
                let mut out = pipe.push_text(cut, 1);
                let end = pipe.finish_text("");
                out.text.push_str(&end.text);
                out.tool_calls.extend(end.tool_calls);
                let names: Vec<&str> = out.tool_calls.iter().map(|c| c.name.as_str()).collect();
                if named {
                    assert_eq!(
                        names.first(),
                        Some(&"get_weather"),
                        "{format:?} forced {forced}: {cut:?}"
                    );
                } else {
                    assert!(names.is_empty(), "{format:?} forced {forced}: {names:?}");
                }
                if forced || named {
                    assert_eq!(out.text, "", "{format:?} forced {forced}: {cut:?}");
                } else {
                    // (Mistral's marker aside, which is never content.)
                    assert!(
                        out.text.ends_with(r#"{"name": "get_wea"#) || out.text.ends_with("get_wea"),
                        "{format:?}: the text it never made a call of: {:?}",
                        out.text
                    );
                }
            }
        }
    }
}
