//! Incremental detokenizer (`service/src/detok.rs`) with real tokenizers:
//! the byte-level BPE of tiny-qwen2 and the SentencePiece-style BPE with
//! byte fallback of tiny-mistral, read from the fixture models that
//! `make models` builds (`$GYRE_FUZZ_MODELS`, default `../.gyre/models`).
//! Input: byte 0 picks the tokenizer (bit 0) and `skip_special_tokens`
//! (bit 1); then every 3 bytes are one token id (modulo the vocabulary,
//! added tokens included).
//!
//! Properties: no panic; the pieces `push` releases, plus `flush`,
//! concatenate to exactly the one-shot `decode` of all the ids when that is
//! valid text; with invalid UTF-8 (U+FFFD in the decode) no text is lost:
//! the stream ends with what follows the decode's last U+FFFD. And the
//! log-probabilities' token strings and bytes (`TokenTexts`, each of the
//! first 128 ids after the ids before it) never panic; with tiny-qwen2's byte-level pieces the
//! bytes add up to the pieces' own bytes, valid UTF-8 or not.
#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use gyre_fuzz::detok::{IncrementalDecoder, TokenTexts};
use gyre_fuzz::input::split_header;
use libfuzzer_sys::fuzz_target;
use tokenizers::Tokenizer;

const MODELS: [&str; 2] = ["tiny-qwen2", "tiny-mistral"];

/// Each tokenizer with its vocabulary size (added tokens included), which
/// `get_vocab_size` computes by copying the whole vocabulary.
static TOKENIZERS: LazyLock<Vec<(Tokenizer, u32)>> = LazyLock::new(|| {
    let dir = std::env::var_os("GYRE_FUZZ_MODELS")
        .map_or_else(|| PathBuf::from("../.gyre/models"), PathBuf::from);
    MODELS
        .iter()
        .map(|m| {
            let path = dir.join(m).join("tokenizer.json");
            let tok = Tokenizer::from_file(&path).unwrap_or_else(|e| {
                panic!(
                    "cannot load {} ({e}): run `make models` first",
                    path.display()
                )
            });
            let vocab = tok.get_vocab_size(true) as u32;
            (tok, vocab)
        })
        .collect()
});

fuzz_target!(|data: &[u8]| {
    let Some((head, payload)) = split_header(data, 1) else {
        return;
    };
    let (tok, vocab) = &TOKENIZERS[usize::from(head[0] & 1)];
    let skip_special = head[0] & 2 != 0;
    let ids: Vec<u32> = payload
        .chunks_exact(3)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], 0]) % vocab)
        .collect();

    // Each token's string reads only the 5 ids before it, so a bug there
    // shows within a short input: the first 128 ids keep long inputs from
    // spending their time here.
    token_texts(tok, head[0] & 1 == 0, &ids[..ids.len().min(128)]);
    let Ok(whole) = tok.decode(&ids, skip_special) else {
        return;
    };
    let mut decoder = IncrementalDecoder::new(skip_special);
    let mut pieces = Vec::new();
    for &id in &ids {
        match decoder.push(tok, id) {
            Ok(piece) => pieces.push(piece),
            Err(e) => panic!("push({id}) failed where decode of all ids did not: {e}"),
        }
    }
    match decoder.flush(tok) {
        Ok(rest) => pieces.push(rest),
        Err(e) => panic!("flush failed where decode of all ids did not: {e}"),
    }
    let streamed: String = pieces.concat();
    if !whole.contains('\u{FFFD}') {
        assert_eq!(
            streamed, whole,
            "ids {ids:?} (skip_special {skip_special}): pieces {pieces:?}"
        );
    } else {
        // Invalid UTF-8 in the ids: a byte-fallback tokenizer decodes a run
        // of byte tokens that is not valid UTF-8 as one U+FFFD per byte, so
        // text already released (a complete character) can later decode as
        // replacement characters. Exactness is not possible then, but no
        // text is lost: what follows the last replacement character is the
        // end of the stream too.
        let tail = whole.rsplit('\u{FFFD}').next().unwrap_or_default();
        assert!(
            streamed.ends_with(tail),
            "ids {ids:?} (skip_special {skip_special}): the stream {streamed:?} lost the end {tail:?} \
             of the decode {whole:?}; pieces {pieces:?}"
        );
    }
});

/// Each id's log-probability string and bytes after the ids before it;
/// with `byte_level` (tiny-qwen2), the bytes past the first id are the
/// pieces' bytes in GPT-2's alphabet (a piece with a character outside it
/// stands for its own UTF-8, as tokenizers' ByteLevel decoder has it).
fn token_texts(tok: &Tokenizer, byte_level: bool, ids: &[u32]) {
    let mut bytes = Vec::new();
    for k in 1..ids.len() {
        let mut texts = TokenTexts::after(tok, &ids[..k]);
        let text = texts.text(ids[k]);
        bytes.extend(texts.bytes(ids[k], &text));
    }
    if !byte_level || ids.is_empty() {
        return;
    }
    let alphabet = gpt2_alphabet();
    let byte = |c: char| alphabet.iter().position(|&a| a == c).map(|b| b as u8);
    let want: Vec<u8> = ids[1..]
        .iter()
        .flat_map(|&id| {
            let piece = tok.id_to_token(id).unwrap_or_default();
            piece
                .chars()
                .map(byte)
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| piece.into_bytes())
        })
        .collect();
    assert_eq!(bytes, want, "ids {ids:?}");
}

/// GPT-2's byte-level alphabet, the character of each byte, built as the
/// published `bytes_to_unicode` builds it (independently of detok.rs).
fn gpt2_alphabet() -> Vec<char> {
    let kept: Vec<u32> = (u32::from('!')..=u32::from('~'))
        .chain(u32::from('¡')..=u32::from('¬'))
        .chain(u32::from('®')..=u32::from('ÿ'))
        .collect();
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            let code = if kept.contains(&b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(code).unwrap_or('?')
        })
        .collect()
}
