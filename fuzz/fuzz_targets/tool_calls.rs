//! Tool-call parsers (`service/src/tools/`), every format. Input: byte 0
//! picks the format, byte 1 seeds how the text is split into stream pieces,
//! the rest is the model's output (lossy UTF-8).
//!
//! Properties: no panic; every format streams a call's arguments as written,
//! so a call's `arguments` is valid JSON unless it is a streamed object or
//! array (starting with `{` or `[`) that the output broke off; the streamed
//! parse (pieces of 1-8 characters through `ToolStream`) releases a call's
//! name before any of its arguments and no empty argument pieces, and its
//! pieces, a call's arguments concatenated, give exactly the content and
//! calls of the one-shot `parse_all`.
#![no_main]

use gyre_fuzz::input::{Rng, pieces, split_header};
use gyre_fuzz::tools::{CallPiece, ToolFormat, ToolStream, join, parse_all};
use libfuzzer_sys::fuzz_target;

const FORMATS: [&str; 5] = ["hermes", "mistral", "deepseek", "llama3_json", "json"];

fuzz_target!(|data: &[u8]| {
    let Some((head, payload)) = split_header(data, 2) else {
        return;
    };
    let name = FORMATS[usize::from(head[0]) % FORMATS.len()];
    let Some(format) = ToolFormat::from_name(name) else {
        panic!("format {name} unknown to ToolFormat::from_name");
    };
    let text = String::from_utf8_lossy(payload);

    let (content, calls) = parse_all(format, &text);
    for call in &calls {
        let streamed = call.arguments.starts_with(['{', '[']);
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&call.arguments)
            && !streamed
        {
            panic!("{name}: call {call:?} has arguments that are not JSON ({e}); output {text:?}");
        }
    }

    let mut rng = Rng::new(u64::from(head[1]) << 32 | payload.len() as u64);
    let mut stream = ToolStream::new(format);
    let (mut s_content, mut s_calls) = (String::new(), Vec::new());
    let split = pieces(&text, &mut rng, 8);
    for piece in &split {
        let (c, k) = stream.push(piece);
        s_content.push_str(&c);
        s_calls.extend(k);
    }
    let (c, k) = stream.finish();
    s_content.push_str(&c);
    s_calls.extend(k);
    if let Some(first) = s_calls.first() {
        assert!(
            matches!(first, CallPiece::Begin(_)),
            "{name}: arguments before any call began: {s_calls:?}"
        );
    }
    if let Some(p) = s_calls
        .iter()
        .find(|p| **p == CallPiece::Args(String::new()))
    {
        panic!("{name}: an empty piece of arguments {p:?} in {s_calls:?}");
    }
    let s_calls = join(&s_calls);
    assert_eq!(
        (&s_content, &s_calls),
        (&content, &calls),
        "{name}: streamed parse of {split:?} differs from the one-shot parse"
    );
});
