//! The text side against transformers, on the fixture models' real
//! tokenizers and chat templates:
//! - chat templates render byte for byte as transformers' `apply_chat_template`
//!   (and tokenize to the same ids);
//! - the incremental detokenizer, fed one token at a time, never emits a
//!   broken character and adds up to the full decode, including text whose
//!   characters are split across byte-fallback tokens.

use std::path::PathBuf;

use gyre_service::detok::{IncrementalDecoder, TokenTexts};
use gyre_service::runtime::load_text;
use serde_json::Value;

const MODELS: [&str; 3] = ["tiny-llama", "tiny-mistral", "tiny-qwen2"];

fn model_dir(name: &str) -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join(name)
}

fn golden(name: &str) -> Value {
    let p = model_dir(name).join("golden.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the fixtures first: `make models`",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("golden.json parses")
}

#[test]
fn chat_templates_render_like_transformers() {
    let mut checked = 0;
    for name in MODELS {
        let (tok, template) = load_text(&model_dir(name)).expect("loads");
        let template = template.expect("fixture models have chat templates");
        let g = golden(name);
        for case in g["chat_renders"].as_array().expect("renders") {
            let msgs: Vec<Value> = case["messages"].as_array().expect("messages").clone();
            let agp = case["add_generation_prompt"].as_bool().expect("agp");
            let ours = template.render(&msgs, agp);
            match case.get("text").and_then(Value::as_str) {
                Some(want) => {
                    let ours = ours.unwrap_or_else(|e| panic!("{name}: render failed: {e}"));
                    assert_eq!(
                        ours, want,
                        "{name}: render differs for {}",
                        case["messages"]
                    );
                    let ids = tok
                        .encode(ours.as_str(), false)
                        .expect("encode")
                        .get_ids()
                        .to_vec();
                    let want_ids: Vec<u32> = case["token_ids"]
                        .as_array()
                        .expect("ids")
                        .iter()
                        .map(|x| x.as_u64().expect("id") as u32)
                        .collect();
                    assert_eq!(
                        ids, want_ids,
                        "{name}: token ids differ for {}",
                        case["messages"]
                    );
                }
                None => assert!(ours.is_err(), "{name}: transformers raised, we rendered"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} renders checked");
}

#[test]
fn incremental_decode_is_whole_characters_and_lossless() {
    let text = "Ünïcödé 日本語 🙂🦀 龘𝔘𝔫𝔦 naïve café — ok";
    for name in MODELS {
        let (tok, _) = load_text(&model_dir(name)).expect("loads");
        let ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
        let full = tok.decode(&ids, true).expect("decode");
        let mut d = IncrementalDecoder::new(true);
        let mut out = String::new();
        let mut pieces = 0;
        for &id in &ids {
            let piece = d.push(&tok, id).expect("push");
            assert!(
                !piece.contains('\u{FFFD}'),
                "{name}: broken character emitted: {piece:?}"
            );
            if !piece.is_empty() {
                pieces += 1;
            }
            out.push_str(&piece);
        }
        out.push_str(&d.flush(&tok).expect("flush"));
        assert_eq!(out, full, "{name}: incremental != full decode");
        // Tokens holding part of a character must have been held back.
        let split = ids
            .iter()
            .filter(|&&id| {
                tok.decode(&[id], true)
                    .expect("decode")
                    .contains('\u{FFFD}')
            })
            .count();
        assert!(
            split > 0,
            "{name}: the text should split some characters across tokens"
        );
        assert!(
            pieces < ids.len(),
            "{name}: {split} partial tokens, yet nothing was held back"
        );
    }
}

/// The first generated token decodes as it does after the prompt: split a
/// text's ids anywhere into a prompt and an output, and the output streamed
/// token by token adds up to the whole text's decode past the prompt's (a
/// completion appended to its prompt reads as the whole text). Without the
/// prompt's tokens, a SentencePiece tokenizer drops the output's leading
/// space (" sat" came out as "sat").
#[test]
fn the_first_token_keeps_its_leading_space_after_the_prompt() {
    let text = "The cat sat on the mat, naïve café 🙂 and 日本語 ok";
    let mut dropped = 0;
    for name in MODELS {
        let (tok, _) = load_text(&model_dir(name)).expect("loads");
        let ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
        let whole = tok.decode(&ids, true).expect("decode");
        let mut checked = 0;
        for k in 1..ids.len() {
            let before = tok.decode(&ids[..k], true).expect("decode");
            // A split inside a character: the prompt's text is not a prefix.
            let Some(want) = whole.strip_prefix(before.as_str()) else {
                continue;
            };
            let stream = |mut d: IncrementalDecoder| {
                let mut out = String::new();
                for &id in &ids[k..] {
                    out.push_str(&d.push(&tok, id).expect("push"));
                }
                out + &d.flush(&tok).expect("flush")
            };
            let got = stream(IncrementalDecoder::with_context(true, &ids[..k]));
            assert_eq!(got, want, "{name}: output after {before:?}");
            checked += 1;
            if want.starts_with(' ') && !stream(IncrementalDecoder::new(true)).starts_with(' ') {
                dropped += 1;
            }
        }
        assert!(checked > 10, "{name}: only {checked} splits checked");
    }
    // The SentencePiece fixtures drop the space without the prompt, so the
    // check above is one that the old decoder fails.
    assert!(dropped > 0, "no split would have lost a leading space");
}

/// Log-probabilities' token strings, each read after the tokens before it,
/// add up to the text past the first token (so `text_offset` counts into
/// the text); and a token's string does not depend on which others were
/// read after the same context before it (a listing's alternatives).
/// Decoded alone, the SentencePiece fixtures' strings lose their words'
/// leading spaces, which the last check makes sure of.
#[test]
fn logprob_token_strings_add_up_to_the_text() {
    let text = "The cat sat on the mat. Then it said: \"hello, world\" twice, and 42 left.";
    let mut alone_short = 0;
    for name in MODELS {
        let (tok, _) = load_text(&model_dir(name)).expect("loads");
        let ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
        let whole = tok.decode(&ids, false).expect("decode");
        let first = tok.decode(&ids[..1], false).expect("decode");
        let want = whole.strip_prefix(first.as_str()).expect("a prefix");
        let mut got = String::new();
        for k in 1..ids.len() {
            let s = TokenTexts::after(&tok, &ids[..k]).text(ids[k]);
            let mut shared = TokenTexts::after(&tok, &ids[..k]);
            for &other in &ids[..k] {
                shared.text(other);
            }
            assert_eq!(shared.text(ids[k]), s, "{name}: token {k}");
            got += &s;
        }
        assert_eq!(got, want, "{name}");
        let alone: String = ids[1..]
            .iter()
            .map(|&id| tok.decode(&[id], false).expect("decode"))
            .collect();
        if alone.len() < want.len() {
            alone_short += 1;
        }
    }
    assert!(alone_short > 0, "no tokenizer lost a space decoded alone");
}

/// Log-probabilities' bytes add up to the text's UTF-8 even where its
/// characters are split across tokens (byte-fallback bytes on the
/// SentencePiece fixtures, partial byte-level pieces on tiny-qwen2's),
/// where the tokens' strings hold U+FFFD; the strings' own UTF-8 would not.
#[test]
fn logprob_token_bytes_add_up_to_the_text() {
    let text = "Tea 🍵 and 日本語, naïve café 🙂 ok";
    let mut split = 0;
    for name in MODELS {
        let (tok, _) = load_text(&model_dir(name)).expect("loads");
        let ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
        let first = tok.decode(&ids[..1], false).expect("decode");
        let want = text
            .strip_prefix(first.as_str())
            .expect("a prefix")
            .as_bytes();
        let (mut got, mut utf8) = (Vec::<u8>::new(), Vec::<u8>::new());
        for k in 1..ids.len() {
            let mut texts = TokenTexts::after(&tok, &ids[..k]);
            let s = texts.text(ids[k]);
            got.extend(texts.bytes(ids[k], &s));
            utf8.extend(s.as_bytes());
        }
        assert_eq!(got, want, "{name}: {:?}", String::from_utf8_lossy(&got));
        if utf8 != want {
            split += 1;
        }
    }
    assert_eq!(
        split,
        MODELS.len(),
        "some tokenizer kept every character whole"
    );
}

/// Found by the `detok` fuzz target: a byte-level piece that continues a
/// character begun before it and then holds whole ones ('½æķ°': the
/// byte 0xBD, then "数") reads "数" after 'ë' (0xEB), the 0xBD folding into
/// the context's U+FFFD; its bytes are still all four of its own.
#[test]
fn a_piece_continuing_a_character_keeps_its_bytes() {
    let (tok, _) = load_text(&model_dir("tiny-qwen2")).expect("loads");
    let id = |piece: &str| tok.token_to_id(piece).expect("in the vocabulary");
    let ids = [id("CharArray"), id("ë"), id("½æķ°")];
    let mut texts = TokenTexts::after(&tok, &ids[..2]);
    let text = texts.text(ids[2]);
    assert_eq!(text, "数");
    assert_eq!(texts.bytes(ids[2], &text), [0xBD, 0xE6, 0x95, 0xB0]);
}

/// Found by the `detok` fuzz target: with a byte-fallback tokenizer, a
/// stray byte token right after a complete multi-byte character makes the
/// whole byte run decode as replacement characters, so the window's text no
/// longer extends what was released. The decoder then held back everything
/// that followed, to the end of the output.
#[test]
fn a_stray_byte_after_a_character_does_not_swallow_the_rest() {
    let (tok, _) = load_text(&model_dir("tiny-mistral")).expect("loads");
    let byte = |b: u8| {
        tok.token_to_id(&format!("<0x{b:02X}>"))
            .expect("byte-fallback vocabulary")
    };
    let mut ids = tok
        .encode("wine", false)
        .expect("encode")
        .get_ids()
        .to_vec();
    ids.extend("🍷".bytes().map(byte));
    ids.push(byte(0xF0)); // the start of a character that never comes
    ids.extend(tok.encode("and cheese", false).expect("encode").get_ids());
    let whole = tok.decode(&ids, true).expect("decode");
    let tail = whole.rsplit('\u{FFFD}').next().unwrap_or_default();
    assert!(tail.trim() == "and cheese", "decode: {whole:?}");

    let mut d = IncrementalDecoder::new(true);
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&d.push(&tok, id).expect("push"));
    }
    assert!(out.ends_with(tail), "streamed before flush: {out:?}");
    out.push_str(&d.flush(&tok).expect("flush"));
    assert!(out.starts_with("wine🍷"), "{out:?}");
    assert!(out.ends_with(&format!("\u{FFFD}{tail}")), "{out:?}");
}

#[test]
fn broken_tokenizer_file_fails_with_a_clear_error() {
    // A BPE tokenizer whose merge names tokens missing from its vocabulary.
    let dir = std::env::temp_dir().join(format!("gyre-broken-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let broken = concat!(
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"#,
        r#""normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,"#,
        r#""model":{"type":"BPE","vocab":{"a":0},"merges":["x y"]}}"#
    );
    std::fs::write(dir.join("tokenizer.json"), broken).expect("write tokenizer.json");
    let err = load_text(&dir).err().expect("must fail").to_string();
    std::fs::remove_dir_all(&dir).ok();
    assert!(err.contains("tokenizer.json"), "unclear error: {err}");
}
