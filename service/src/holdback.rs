//! The one hold-back rule shared by stop strings, reasoning markers and
//! tool-call markers: text that may still become a marker is not released
//! until the next text decides it.
//!
//! Only the longest suffix of the text that is a proper prefix of some marker
//! is held; everything before it is safe to release.

/// The length in bytes of the longest suffix of `text` that is a proper,
/// non-empty prefix of one of `markers` (always on a character boundary).
pub fn partial_len<'a>(text: &str, markers: impl IntoIterator<Item = &'a str>) -> usize {
    markers
        .into_iter()
        .map(|marker| {
            text.char_indices()
                .map(|(i, _)| &text[i..])
                .find(|tail| tail.len() < marker.len() && marker.starts_with(tail))
                .map_or(0, str::len)
        })
        .max()
        .unwrap_or(0)
}

/// Takes from `buf` what is safe to release (all but the held-back suffix).
pub fn release<'a>(buf: &mut String, markers: impl IntoIterator<Item = &'a str>) -> String {
    let keep = partial_len(buf, markers);
    let cut = buf.len() - keep;
    buf.drain(..cut).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_longest_suffix_that_may_begin_any_marker() {
        assert_eq!(partial_len("abc <to", ["<tool_call>"]), 3);
        assert_eq!(partial_len("abc <to", ["</x>", "<tool_call>", "c <"]), 3);
        assert_eq!(partial_len("a</th", ["</think>", "th"]), 4);
        // A whole marker is not a proper prefix: the caller finds it itself.
        assert_eq!(partial_len("x END", ["END"]), 0);
        assert_eq!(partial_len("nothing", ["<"]), 0);
        assert_eq!(partial_len("", ["<"]), 0);
        assert_eq!(partial_len("a<", std::iter::empty()), 0);
    }

    #[test]
    fn multibyte_suffixes_stay_on_character_boundaries() {
        let mark = "<｜tool▁calls▁begin｜>";
        let text = "日本<｜tool▁";
        assert_eq!(partial_len(text, [mark]), "<｜tool▁".len());
        let mut buf = text.to_string();
        assert_eq!(release(&mut buf, [mark]), "日本");
        assert_eq!(buf, "<｜tool▁");
    }
}
