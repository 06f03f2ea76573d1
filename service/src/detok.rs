//! Incremental detokenization: turns a growing list of token ids into text
//! pieces that are always complete UTF-8.
//!
//! It keeps two offsets into the ids: text is decoded over a small window
//! starting at `prefix_offset` (so tokenizers that depend on the previous
//! token, like SentencePiece's leading-space handling, decode correctly), and
//! a piece is released only when the window's text grew past what was
//! already released and does not end in U+FFFD (an incomplete character).
//! Text is never withheld for good: when a token changes how the window's
//! earlier tokens decode (see `released`), what differs is released again.
//!
//! The window starts on the prompt's last few tokens ([`CONTEXT`],
//! [`IncrementalDecoder::with_context`]), so the first generated token
//! decodes as it does after the prompt: a SentencePiece tokenizer drops a
//! word's leading space at the start of a text, and decoded alone the
//! first token of " world" after "Hello" came out as "world" (llama.cpp's
//! server and vLLM keep the space).

use tokenizers::Tokenizer;

/// Prompt tokens the window starts on (vLLM's initial offset, 5).
pub const CONTEXT: usize = 5;

/// The prompt's tokens a decoder's window starts on: its last [`CONTEXT`].
pub fn context(prompt: &[u32]) -> &[u32] {
    &prompt[prompt.len().saturating_sub(CONTEXT)..]
}

pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special: bool) -> Self {
        Self::with_context(skip_special, &[])
    }

    /// A decoder whose first token follows `prompt` (its last [`CONTEXT`]
    /// tokens, [`context`], are the window's start; none of their text is
    /// released).
    pub fn with_context(skip_special: bool, prompt: &[u32]) -> Self {
        let ids = context(prompt).to_vec();
        Self {
            read_offset: ids.len(),
            ids,
            prefix_offset: 0,
            skip_special,
        }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, tokenizers::Error> {
        self.ids.push(id);
        let prefix = tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        let start = released(&prefix, &full);
        if full.len() > start && !full.ends_with('\u{FFFD}') {
            let piece = full[start..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back (an incomplete character at the very end).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, tokenizers::Error> {
        let prefix = tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        let start = released(&prefix, &full);
        if full.len() > start {
            Ok(full[start..].to_string())
        } else {
            Ok(String::new())
        }
    }
}

/// How much of `full` (the window's text now) was already released as
/// `prefix` (its text before the new tokens). Normally all of `prefix`; but
/// a new token can change how earlier ones decode: a byte-fallback
/// tokenizer decodes a run of byte tokens that is not valid UTF-8 as one
/// U+FFFD per byte, so a complete character followed by a stray byte
/// becomes replacement characters. Then only the common start counts as
/// released, and the rest is released again once complete, rather than
/// never (the window would otherwise never again extend `prefix`).
fn released(prefix: &str, full: &str) -> usize {
    if full.starts_with(prefix) {
        return prefix.len();
    }
    prefix
        .char_indices()
        .zip(full.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(full.len()), |((at, _), _)| at)
}

/// Token strings for log-probabilities: each token's text as it reads after
/// the tokens before it (their last [`CONTEXT`]), so the strings of a
/// choice's tokens add up to its text and `text_offset` counts into it.
/// Decoded alone, a SentencePiece token loses the leading space of the word
/// it starts (" Paris" came out as "Paris"); llama.cpp's server and vLLM
/// keep it. A token whose text after the context is not an extension of the
/// context's own (a byte-fallback byte that completes or breaks a
/// character) is decoded alone, as before.
pub struct TokenTexts<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    /// The context's text; none where it is empty or failed to decode.
    prefix: Option<String>,
}

impl<'a> TokenTexts<'a> {
    /// Texts of tokens that follow `before`.
    pub fn after(tok: &'a Tokenizer, before: &[u32]) -> Self {
        let ids = context(before).to_vec();
        let prefix = match ids.is_empty() {
            true => None,
            false => tok.decode(&ids, false).ok(),
        };
        Self { tok, ids, prefix }
    }

    /// `id`'s text after the context.
    pub fn text(&mut self, id: u32) -> String {
        if let Some(prefix) = &self.prefix {
            self.ids.push(id);
            let full = self.tok.decode(&self.ids, false);
            self.ids.pop();
            if let Some(rest) = full
                .as_deref()
                .ok()
                .and_then(|f| f.strip_prefix(prefix.as_str()))
            {
                return rest.to_string();
            }
        }
        self.tok.decode(&[id], false).unwrap_or_default()
    }
}
