//! Reasoning splitter (`service/src/reasoning.rs`), every parser. Input:
//! byte 0 picks the parser and whether the prompt opened the section, byte
//! 1 seeds the split into stream pieces, the rest is the output (lossy
//! UTF-8).
//!
//! Properties: no panic; the streamed split (pieces of 1-8 characters, each
//! counted as one token) gives the same reasoning and content as one push
//! of the whole text; the reasoning never holds the end marker (the section
//! ends at its first one); counted reasoning tokens never exceed the tokens
//! pushed.
#![no_main]

use gyre_fuzz::input::{Rng, pieces, split_header};
use gyre_fuzz::reasoning::{PARSERS, Split, Splitter};
use libfuzzer_sys::fuzz_target;

fn run(splitter: &mut Splitter, pieces: &[&str]) -> Split {
    let mut all = Split::default();
    for piece in pieces {
        let s = splitter.push(piece, 1);
        all.reasoning.push_str(&s.reasoning);
        all.content.push_str(&s.content);
    }
    let s = splitter.finish();
    all.reasoning.push_str(&s.reasoning);
    all.content.push_str(&s.content);
    all
}

fuzz_target!(|data: &[u8]| {
    let Some((head, payload)) = split_header(data, 2) else {
        return;
    };
    let parser = &PARSERS[usize::from(head[0] >> 1) % PARSERS.len()];
    let open = head[0] & 1 == 1 || parser.starts_open;
    let text = String::from_utf8_lossy(payload);

    let whole = run(&mut Splitter::new(parser, open), &[&text]);
    let mut rng = Rng::new(u64::from(head[1]) << 32 | payload.len() as u64);
    let split = pieces(&text, &mut rng, 8);
    let mut streamed = Splitter::new(parser, open);
    let parts = run(&mut streamed, &split);
    assert_eq!(
        parts, whole,
        "{} (open {open}): streamed split of {split:?} differs from the whole",
        parser.name
    );
    assert!(
        !whole.reasoning.contains(parser.end),
        "{}: reasoning {:?} holds the end marker",
        parser.name,
        whole.reasoning
    );
    assert!(
        streamed.reasoning_tokens() as usize <= split.len(),
        "{}: {} reasoning tokens of {} pushed",
        parser.name,
        streamed.reasoning_tokens(),
        split.len()
    );
});
