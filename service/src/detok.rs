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
///
/// And each token's bytes ([`TokenTexts::bytes`]): the bytes its piece
/// stands for where the vocabulary spells bytes (a byte-fallback `<0xNN>`
/// piece, any byte-level piece), otherwise its text's UTF-8. The two
/// differ where a character is split across tokens: the text then holds
/// U+FFFD, or lacks the bytes that continue a character begun before it
/// (they fold into the context's U+FFFD). So the bytes of a choice's tokens
/// add up to its text's UTF-8, as OpenAI's `bytes` do.
pub struct TokenTexts<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    /// The context's text; none where it is empty or failed to decode.
    prefix: Option<String>,
    pieces: Pieces,
}

impl<'a> TokenTexts<'a> {
    /// Texts of tokens that follow `before`.
    pub fn after(tok: &'a Tokenizer, before: &[u32]) -> Self {
        let ids = context(before).to_vec();
        let prefix = match ids.is_empty() {
            true => None,
            false => tok.decode(&ids, false).ok(),
        };
        Self {
            tok,
            ids,
            prefix,
            pieces: Pieces::of(tok),
        }
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

    /// `id`'s bytes, given its `text` ([`TokenTexts::text`]).
    pub fn bytes(&self, id: u32, text: &str) -> Vec<u8> {
        self.tok
            .id_to_token(id)
            .and_then(|piece| self.pieces.bytes(&piece))
            .unwrap_or_else(|| text.as_bytes().to_vec())
    }
}

/// How a tokenizer's vocabulary pieces spell bytes, from its decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// GPT-2's byte-level alphabet: each character of a piece stands for
    /// one byte (`ByteLevel`).
    ByteLevel,
    /// SentencePiece with byte fallback: a byte that is not a whole
    /// character is its own piece, `<0xNN>` (`ByteFallback`).
    ByteFallback,
    /// Neither: the decoded text is all there is.
    Text,
}

impl Pieces {
    fn of(tok: &Tokenizer) -> Self {
        use tokenizers::DecoderWrapper as D;
        let one = |d: &D| match d {
            D::ByteLevel(_) => Some(Self::ByteLevel),
            D::ByteFallback(_) => Some(Self::ByteFallback),
            _ => None,
        };
        match tok.get_decoder() {
            Some(D::Sequence(seq)) => seq.get_decoders().iter().find_map(one),
            Some(d) => one(d),
            None => None,
        }
        .unwrap_or(Self::Text)
    }

    /// The bytes `piece` stands for; none where it is not such a piece (an
    /// added token, a whole word).
    fn bytes(self, piece: &str) -> Option<Vec<u8>> {
        match self {
            Self::ByteLevel => piece.chars().map(byte_level).collect(),
            Self::ByteFallback => {
                let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
                (hex.len() == 2)
                    .then(|| u8::from_str_radix(hex, 16).ok())
                    .flatten()
                    .map(|b| vec![b])
            }
            Self::Text => None,
        }
    }
}

/// The byte GPT-2's byte-level alphabet spells with `c`: the printable
/// bytes (`!` to `~`, `¡` to `¬`, `®` to `ÿ`) stand for themselves, and
/// the other 68 bytes, in order, for U+0100 onwards.
fn byte_level(c: char) -> Option<u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let code = u32::from(c);
    if let Ok(b) = u8::try_from(code)
        && printable(b)
    {
        return Some(b);
    }
    let nth = usize::try_from(code.checked_sub(0x100)?).ok()?;
    (0..=255u8).filter(|&b| !printable(b)).nth(nth)
}

#[cfg(test)]
mod tests {
    /// GPT-2's byte-level alphabet: one character for each of the 256
    /// bytes, none for the characters past it.
    #[test]
    fn the_byte_level_alphabet_spells_every_byte_once() {
        let mut seen = [0u32; 256];
        for c in (0..0x200).filter_map(char::from_u32) {
            if let Some(b) = super::byte_level(c) {
                seen[usize::from(b)] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        assert_eq!(super::byte_level('Ġ'), Some(b' '));
        assert_eq!(super::byte_level('Ċ'), Some(b'\n'));
        assert_eq!(super::byte_level('a'), Some(b'a'));
        assert_eq!(super::byte_level(' '), None);
        assert_eq!(super::byte_level('\u{144}'), None);
    }
}
