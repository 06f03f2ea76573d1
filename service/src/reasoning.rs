//! Reasoning sections: which markers a model wraps its reasoning in, and a
//! streaming splitter that routes generated text to "reasoning" or "content"
//! without ever letting a marker (even one split across tokens) leak.
//!
//! A parser is chosen per model from its chat template (or `--reasoning-parser`).
//! Per request, the rendered prompt decides where the output starts: a
//! prompt that ends inside an open section (DeepSeek-R1 distills and QwQ end
//! their generation prompt with `<think>\n`) starts the output in reasoning,
//! with no start marker expected; otherwise the output is reasoning only if
//! it begins (after whitespace) with the start marker.

use std::str::FromStr;

/// A named pair of reasoning markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParser {
    pub name: &'static str,
    pub start: &'static str,
    pub end: &'static str,
    /// The output is in reasoning from its first token even when the prompt
    /// does not open a section (the original DeepSeek-R1 behaviour: the
    /// model often omits `<think>`).
    pub starts_open: bool,
}

/// Every parser `--reasoning-parser` accepts (besides `auto` and `none`).
pub const PARSERS: &[ReasoningParser] = &[
    // Qwen3, QwQ, SmolLM3, DeepSeek-V3.1, Granite 3.3, R1 distills.
    ReasoningParser {
        name: "think",
        start: "<think>",
        end: "</think>",
        starts_open: false,
    },
    ReasoningParser {
        name: "deepseek_r1",
        start: "<think>",
        end: "</think>",
        starts_open: true,
    },
    // Magistral.
    ReasoningParser {
        name: "mistral",
        start: "[THINK]",
        end: "[/THINK]",
        starts_open: false,
    },
];

/// Other names of the `think` parser (vLLM's).
const THINK_ALIASES: &[&str] = &["qwen3", "qwq", "smollm3", "granite", "deepseek_v3"];

/// `--reasoning-parser`: detect from the template, none, or a named one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParserChoice {
    #[default]
    Auto,
    None,
    Named(ReasoningParser),
}

impl FromStr for ParserChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let name = if THINK_ALIASES.contains(&s) {
            "think"
        } else {
            s
        };
        match name {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            _ => PARSERS
                .iter()
                .find(|p| p.name == name)
                .map(|p| Self::Named(*p))
                .ok_or_else(|| {
                    let names: Vec<_> = PARSERS.iter().map(|p| p.name).collect();
                    format!(
                        "unknown reasoning parser `{s}` (auto, none, {}, or aliases {})",
                        names.join(", "),
                        THINK_ALIASES.join(", ")
                    )
                }),
        }
    }
}

impl ParserChoice {
    /// The parser for a model whose chat template is `template`.
    pub fn resolve(self, template: Option<&str>) -> Option<ReasoningParser> {
        match self {
            Self::None => None,
            Self::Named(p) => Some(p),
            Self::Auto => {
                let t = template?;
                PARSERS
                    .iter()
                    .find(|p| !p.starts_open && t.contains(p.end))
                    .copied()
            }
        }
    }
}

impl ReasoningParser {
    /// Whether output that follows `prompt` starts inside a reasoning
    /// section: the prompt's last start marker is not closed after it.
    pub fn opened_by(&self, prompt: &str) -> bool {
        if self.starts_open {
            return true;
        }
        match prompt.rfind(self.start) {
            Some(at) => !prompt[at..].contains(self.end),
            None => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the start marker may still come.
    Start,
    Reasoning,
    Content,
}

/// One piece of output, split.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Splits one choice's text stream into reasoning and content.
pub struct Splitter {
    start: &'static str,
    end: &'static str,
    state: State,
    /// Text not yet released: a possible (part of a) marker.
    held: String,
    /// Tokens seen while still undecided in `Start`.
    undecided_tokens: u32,
    reasoning_tokens: u32,
}

impl Splitter {
    /// `open`: the output starts inside the section (see [`ReasoningParser::opened_by`]).
    pub fn new(p: &ReasoningParser, open: bool) -> Self {
        Self {
            start: p.start,
            end: p.end,
            state: if open { State::Reasoning } else { State::Start },
            held: String::new(),
            undecided_tokens: 0,
            reasoning_tokens: 0,
        }
    }

    /// Tokens of the reasoning section so far, markers included.
    pub fn reasoning_tokens(&self) -> u32 {
        self.reasoning_tokens
    }

    /// The text of `tokens` more generated tokens (possibly empty text).
    pub fn push(&mut self, text: &str, tokens: u32) -> Split {
        match self.state {
            State::Start => self.undecided_tokens += tokens,
            State::Reasoning => self.reasoning_tokens += tokens,
            State::Content => {}
        }
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(self.start) {
                        self.held = rest.to_string();
                        self.state = State::Reasoning;
                        self.reasoning_tokens += std::mem::take(&mut self.undecided_tokens);
                        continue;
                    }
                    if t.is_empty() || self.start.starts_with(t) {
                        return out;
                    }
                    self.state = State::Content;
                }
                State::Reasoning => {
                    if let Some(at) = self.held.find(self.end) {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + self.end.len());
                        self.state = State::Content;
                        continue;
                    }
                    let released = crate::holdback::release(&mut self.held, [self.end]);
                    out.reasoning.push_str(&released);
                    return out;
                }
                State::Content => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    return out;
                }
            }
        }
    }

    /// The output ended: releases what is held back (an unfinished marker
    /// is text of the section it is in).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Reasoning => Split {
                reasoning: held,
                content: String::new(),
            },
            State::Start | State::Content => Split {
                reasoning: String::new(),
                content: held,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think() -> ReasoningParser {
        PARSERS[0]
    }

    /// Feeds one token per piece; returns (reasoning, content, reasoning tokens).
    fn run(open: bool, pieces: &[&str]) -> (String, String, u32) {
        let mut s = Splitter::new(&think(), open);
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            let out = s.push(p, 1);
            r += &out.reasoning;
            c += &out.content;
        }
        let out = s.finish();
        (r + &out.reasoning, c + &out.content, s.reasoning_tokens())
    }

    #[test]
    fn markers_split_across_tokens_never_leak() {
        let pieces = [
            "<",
            "th",
            "ink>",
            "let me ",
            "see</",
            "thi",
            "nk>",
            "\n\nAnswer",
        ];
        let (r, c, n) = run(false, &pieces);
        assert_eq!((r.as_str(), c.as_str(), n), ("let me see", "\n\nAnswer", 7));
        // Every piece alone also never shows a marker fragment.
        let mut s = Splitter::new(&think(), false);
        for p in pieces {
            let out = s.push(p, 1);
            assert!(!out.content.contains('<') && !out.reasoning.contains('<'));
        }
    }

    #[test]
    fn whole_text_in_one_piece() {
        assert_eq!(
            run(false, &["<think>a</think>b"]),
            ("a".into(), "b".into(), 1)
        );
    }

    #[test]
    fn prompt_opened_section_has_no_start_marker() {
        assert_eq!(
            run(true, &["thinking", " hard", "</think>", "done"]),
            ("thinking hard".into(), "done".into(), 3)
        );
    }

    #[test]
    fn no_start_marker_means_all_content() {
        assert_eq!(
            run(false, &["  <thi", "s is</think> content"]),
            (String::new(), "  <this is</think> content".into(), 0)
        );
    }

    #[test]
    fn unfinished_section_is_all_reasoning() {
        assert_eq!(
            run(false, &["<think>", "still </th"]),
            ("still </th".into(), String::new(), 2)
        );
    }

    #[test]
    fn a_diverging_partial_end_marker_is_released_as_reasoning() {
        assert_eq!(
            run(true, &["a </thi", "s</think>"]),
            ("a </this".into(), String::new(), 2)
        );
    }

    #[test]
    fn multibyte_text_around_markers() {
        assert_eq!(
            run(true, &["日本</", "think>語"]),
            ("日本".into(), "語".into(), 2)
        );
    }

    #[test]
    fn prompt_state_and_auto_detection() {
        let p = think();
        assert!(p.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!p.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!p.opened_by("<|im_start|>assistant\n"));
        let r1: ParserChoice = "deepseek_r1".parse().expect("a parser");
        assert!(matches!(r1, ParserChoice::Named(p) if p.opened_by("")));
        assert_eq!(
            ParserChoice::Auto.resolve(Some("{{ '</think>' }}")),
            Some(p)
        );
        assert_eq!(ParserChoice::Auto.resolve(Some("{{ messages }}")), None);
        assert_eq!(ParserChoice::None.resolve(Some("</think>")), None);
        assert_eq!("qwen3".parse::<ParserChoice>(), Ok(ParserChoice::Named(p)));
        assert!("nope".parse::<ParserChoice>().is_err());
    }
}
