//! Incremental detokenization: turns a growing list of token ids into text
//! pieces that are always complete UTF-8.
//!
//! It keeps two offsets into the ids: text is decoded over a small window
//! starting at `prefix_offset` (so tokenizers that depend on the previous
//! token, like SentencePiece's leading-space handling, decode correctly), and
//! a piece is released only when the window's text grew past what was
//! already released and does not end in U+FFFD (an incomplete character).

use tokenizers::Tokenizer;

pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special: bool) -> Self {
        Self {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
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
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let piece = full[prefix.len()..].to_string();
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
        if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            Ok(full[prefix.len()..].to_string())
        } else {
            Ok(String::new())
        }
    }
}
