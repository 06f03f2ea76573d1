//! The pipeline on real tokenizers (`tests/data/tokenizers/`), token by
//! token, without an engine.

use super::*;
use crate::reasoning::PARSERS;
use serde_json::Value;

fn tokenizer(name: &str, file: &str) -> Tokenizer {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tokenizers")
        .join(name)
        .join(file);
    Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn qwen() -> Tokenizer {
    tokenizer("qwen2.5-instruct", "tokenizer.RECONSTRUCTED.json")
}

fn phi() -> Tokenizer {
    tokenizer("phi-3-mini-instruct", "tokenizer.json")
}

fn config() -> Config {
    Config {
        skip_special: true,
        stop: Vec::new(),
        include_stop: false,
        reasoning: None,
        tool_format: None,
        forced_tools: false,
        single_call: false,
        context: Vec::new(),
    }
}

/// Everything one choice released, and every step's output.
#[derive(Default)]
struct Run {
    text: String,
    reasoning: String,
    calls: Vec<ToolCallPiece>,
    stop: Option<String>,
    steps: Vec<Output>,
    reason: Option<FinishReason>,
}

/// Encodes `text` and feeds its tokens one at a time, as the engine would.
fn run(tok: &Tokenizer, config: Config, text: &str) -> Run {
    let ids = tok.encode(text, false).expect("encodes").get_ids().to_vec();
    assert!(ids.len() > 3, "{text:?} is several tokens");
    let mut pipe = Pipeline::new(config);
    let mut r = Run::default();
    let add = |r: &mut Run, o: Output| {
        r.text.push_str(&o.text);
        r.reasoning.push_str(&o.reasoning);
        r.calls.extend(o.tool_calls.iter().cloned());
        r.stop = r.stop.take().or(o.stop.clone());
        r.steps.push(o);
    };
    for id in ids {
        let o = pipe.push_token(tok, id).expect("decodes");
        add(&mut r, o);
        if r.stop.is_some() {
            r.reason = Some(pipe.stop_reason());
            return r;
        }
    }
    let o = pipe.finish(tok);
    add(&mut r, o);
    r.reason = Some(pipe.stop_reason());
    r
}

#[test]
fn plain_text_passes_through_whole() {
    for tok in [qwen(), phi()] {
        let text = "Hello there, 日本語 and émojis 🎉 too.";
        let r = run(&tok, config(), text);
        assert_eq!((r.text.as_str(), r.reasoning.as_str()), (text, ""));
        assert_eq!(r.reason, Some(FinishReason::Stop));
    }
}

#[test]
fn stop_string_split_across_tokens_ends_the_output() {
    let c = || Config {
        stop: vec!["STOP HERE".into()],
        ..config()
    };
    let r = run(&qwen(), c(), "Some answer STOP HERE and more text after");
    assert_eq!(r.text, "Some answer ");
    assert_eq!(r.stop.as_deref(), Some("STOP HERE"));
    assert!(r.steps.iter().all(|o| !o.text.contains("STOP")));
    let r = run(
        &qwen(),
        Config {
            include_stop: true,
            ..c()
        },
        "Some answer STOP HERE and more",
    );
    assert_eq!(r.text, "Some answer STOP HERE");
}

#[test]
fn reasoning_then_answer_with_markers_split_across_tokens() {
    let splitter = || Some(Splitter::new(&PARSERS[0], false));
    let text = "<think>Let me think: 2 + 2.</think>\n\nThe answer is 4.";
    let r = run(
        &qwen(),
        Config {
            reasoning: splitter(),
            ..config()
        },
        text,
    );
    assert_eq!(r.reasoning, "Let me think: 2 + 2.");
    assert_eq!(r.text, "\n\nThe answer is 4.");
    for o in &r.steps {
        assert!(!o.text.contains('<') && !o.reasoning.contains('<'), "{o:?}");
    }
    // A stop string applies to the whole output, reasoning included.
    let r = run(
        &qwen(),
        Config {
            reasoning: splitter(),
            stop: vec!["2 + 2".into()],
            ..config()
        },
        text,
    );
    assert_eq!(
        (r.reasoning.as_str(), r.text.as_str()),
        ("Let me think: ", "")
    );
    assert_eq!(r.stop.as_deref(), Some("2 + 2"));
}

#[test]
fn hermes_calls_after_reasoning_and_text() {
    let text = "<think>need weather</think>Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let r = run(
        &qwen(),
        Config {
            reasoning: Some(Splitter::new(&PARSERS[0], false)),
            tool_format: Some(ToolFormat::Hermes),
            ..config()
        },
        text,
    );
    assert_eq!(r.reasoning, "need weather");
    assert_eq!(r.text, "Checking.");
    let calls = whole_calls(&r.calls);
    assert_eq!(
        calls,
        vec![
            (
                "get_weather".to_string(),
                serde_json::json!({"city": "Paris"})
            ),
            ("get_time".to_string(), serde_json::json!({})),
        ]
    );
    assert_eq!(r.reason, Some(FinishReason::ToolCalls));
    for o in &r.steps {
        assert!(!o.text.contains('<'), "markup leaked: {o:?}");
    }
}

#[test]
fn an_unfinished_marker_at_the_end_is_text() {
    let r = run(
        &phi(),
        Config {
            tool_format: Some(ToolFormat::Hermes),
            ..config()
        },
        "a b <tool_ca",
    );
    assert_eq!(r.text, "a b <tool_ca");
    assert!(r.calls.is_empty());
    assert_eq!(r.reason, Some(FinishReason::Stop));
}

#[test]
fn whole_output_calls_on_a_byte_fallback_tokenizer() {
    let r = run(
        &phi(),
        Config {
            tool_format: Some(ToolFormat::Llama3Json),
            ..config()
        },
        r#"{"name": "lookup", "parameters": {"q": "日本語 🎉"}}"#,
    );
    assert_eq!(r.text, "");
    assert_eq!(
        whole_calls(&r.calls),
        vec![("lookup".to_string(), serde_json::json!({"q": "日本語 🎉"}))]
    );
}

/// Calls rebuilt from their pieces (as an OpenAI client accumulates them):
/// name and arguments per index, arguments parsed.
fn whole_calls(pieces: &[ToolCallPiece]) -> Vec<(String, Value)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for p in pieces {
        let i = p.index as usize;
        if i == calls.len() {
            assert!(!p.id.is_empty() && !p.name.is_empty(), "first piece: {p:?}");
            calls.push((p.id.clone(), p.name.clone(), String::new()));
        } else {
            assert!(
                i + 1 == calls.len() && p.id.is_empty() && p.name.is_empty(),
                "{p:?}"
            );
        }
        calls[i].2.push_str(&p.arguments);
    }
    calls
        .into_iter()
        .map(|(_, name, args)| {
            let v = serde_json::from_str(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            (name, v)
        })
        .collect()
}

#[test]
fn hermes_arguments_arrive_in_several_fragments() {
    let args = r#"{"city": "Paris", "days": 3, "units": "C"}"#;
    let text =
        format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>");
    let r = run(
        &qwen(),
        Config {
            tool_format: Some(ToolFormat::Hermes),
            ..config()
        },
        &text,
    );
    let fragments: Vec<&ToolCallPiece> = r.steps.iter().flat_map(|o| &o.tool_calls).collect();
    assert!(fragments.len() > 3, "{fragments:?}");
    assert_eq!(fragments[0].name, "get_weather");
    let joined: String = fragments.iter().map(|f| f.arguments.as_str()).collect();
    assert_eq!(joined, args);
    assert_eq!(
        whole_calls(&r.calls),
        vec![(
            "get_weather".to_string(),
            serde_json::json!({"city": "Paris", "days": 3, "units": "C"})
        )]
    );
    assert_eq!(
        (r.text.as_str(), r.reason),
        ("", Some(FinishReason::ToolCalls))
    );
}
