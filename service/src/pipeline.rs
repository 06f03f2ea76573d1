//! One choice's output pipeline: token ids in, typed pieces out.
//!
//! Tokens are detokenized incrementally (`detok`), then stop strings are
//! found in the whole output (`stop`, reasoning included, as in vLLM), then
//! what they release is split into reasoning and answer (`reasoning`), then
//! the answer into content and tool calls (`tools`). Every stage holds back
//! text that may still begin one of its markers (`holdback`), so no marker
//! or stop string ever reaches the output, even when split across tokens.
//!
//! The pipeline knows nothing of the engine or of gRPC: `choice` maps engine
//! events through it to proto messages, and it is tested on its own.

use gyre_api::v1::FinishReason;
use tokenizers::Tokenizer;

use crate::detok::IncrementalDecoder;
use crate::reasoning::Splitter;
use crate::stop::{StopMatcher, StopOutcome};
use crate::tools::{CallPiece, ToolFormat, ToolParser};

/// What a choice's output is parsed for.
pub struct Config {
    /// Leave special tokens out of the text.
    pub skip_special: bool,
    /// Stop strings (the output ends at the first one).
    pub stop: Vec<String>,
    /// Keep a matched stop string in the output.
    pub include_stop: bool,
    /// Split reasoning from the answer with this splitter.
    pub reasoning: Option<Splitter>,
    /// Parse tool calls out of the answer, in this format.
    pub tool_format: Option<ToolFormat>,
    /// The calls are forced: what the tool parser still holds when the
    /// output ends (a call cut off before it began: its name and the first
    /// bracket of its arguments) is call syntax, never content.
    pub forced_tools: bool,
    /// At most one call (`parallel_tool_calls: false`): the pieces of any
    /// later call the model writes are dropped.
    pub single_call: bool,
    /// The prompt's token ids, or its last few (they start the
    /// detokenizer's window, see [`IncrementalDecoder::with_context`]);
    /// empty: none.
    pub context: Vec<u32>,
}

/// A tool call, or a fragment of one: the first fragment of a call carries
/// its `id` and `name`, later ones only more `arguments` text (empty `id`
/// and `name`); a call's fragments concatenate to its whole arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallPiece {
    /// The call's position among this choice's calls (0, 1, ...).
    pub index: u32,
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What one step of the pipeline released.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    /// New answer text.
    pub text: String,
    /// New reasoning text (markers excluded).
    pub reasoning: String,
    /// New tool calls or fragments of them.
    pub tool_calls: Vec<ToolCallPiece>,
    /// A stop string matched: the output ends here (nothing after it is
    /// released), and this is the string.
    pub stop: Option<String>,
}

impl Output {
    /// Nothing released and no stop.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
            && self.reasoning.is_empty()
            && self.tool_calls.is_empty()
            && self.stop.is_none()
    }
}

/// One choice's pipeline.
pub struct Pipeline {
    detok: IncrementalDecoder,
    stops: StopMatcher,
    include_stop: bool,
    reasoning: Option<Splitter>,
    tools: Option<(ToolFormat, Box<dyn ToolParser>)>,
    forced_tools: bool,
    single_call: bool,
    /// Calls started so far.
    calls: u32,
}

impl Pipeline {
    pub fn new(config: Config) -> Self {
        Self {
            detok: IncrementalDecoder::with_context(config.skip_special, &config.context),
            stops: StopMatcher::new(config.stop),
            include_stop: config.include_stop,
            reasoning: config.reasoning,
            tools: config.tool_format.map(|f| (f, f.parser())),
            forced_tools: config.forced_tools,
            single_call: config.single_call,
            calls: 0,
        }
    }

    /// One generated token (not a stop or end-of-sequence token).
    pub fn push_token(&mut self, tok: &Tokenizer, id: u32) -> Result<Output, tokenizers::Error> {
        let piece = self.detok.push(tok, id)?;
        Ok(self.push_text(&piece, 1))
    }

    /// The text of `tokens` more generated tokens.
    pub fn push_text(&mut self, piece: &str, tokens: u32) -> Output {
        match self.stops.push(piece) {
            StopOutcome::Continue(text) => self.split(text, tokens, false),
            StopOutcome::Stopped(text, stop) => self.stopped(text, stop, tokens),
        }
    }

    /// Generation ended (not at a stop string): releases everything held.
    /// A tail the tokenizer cannot decode is dropped; what the other stages
    /// hold is still released.
    pub fn finish(&mut self, tok: &Tokenizer) -> Output {
        let tail = self.detok.flush(tok).unwrap_or_default();
        self.finish_text(&tail)
    }

    /// The same, with the detokenizer's last text given.
    pub fn finish_text(&mut self, tail: &str) -> Output {
        match self.stops.push(tail) {
            StopOutcome::Continue(text) => {
                let rest = self.stops.finish();
                self.split(text + &rest, 0, true)
            }
            StopOutcome::Stopped(text, stop) => self.stopped(text, stop, 0),
        }
    }

    /// Why the output ended, when it ended normally (a stop string or
    /// token, or end of sequence): TOOL_CALLS once it made calls.
    pub fn stop_reason(&self) -> FinishReason {
        if self.calls > 0 {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        }
    }

    /// Tokens of the reasoning section, when reasoning is parsed.
    pub fn reasoning_tokens(&self) -> Option<u32> {
        self.reasoning.as_ref().map(Splitter::reasoning_tokens)
    }

    fn stopped(&mut self, mut text: String, stop: String, tokens: u32) -> Output {
        if self.include_stop {
            text.push_str(&stop);
        }
        let mut out = self.split(text, tokens, true);
        out.stop = Some(stop);
        out
    }

    /// Routes released text to reasoning, content and calls; `last`: the
    /// output ends here, release everything.
    fn split(&mut self, text: String, tokens: u32, last: bool) -> Output {
        let (answer, reasoning) = match self.reasoning.as_mut() {
            None => (text, String::new()),
            Some(s) => {
                let mut out = s.push(&text, tokens);
                if last {
                    let rest = s.finish();
                    out.content.push_str(&rest.content);
                    out.reasoning.push_str(&rest.reasoning);
                }
                (out.content, out.reasoning)
            }
        };
        let Some((format, parser)) = self.tools.as_mut() else {
            return Output {
                text: answer,
                reasoning,
                ..Output::default()
            };
        };
        let format = *format;
        let (mut text, mut calls) = parser.push(&answer);
        if last {
            let (c, k) = parser.finish();
            if !self.forced_tools {
                text.push_str(&c);
            }
            calls.extend(k);
        }
        let mut tool_calls: Vec<ToolCallPiece> = Vec::new();
        for c in calls {
            self.piece(format, c, &mut tool_calls);
        }
        Output {
            text,
            reasoning,
            tool_calls,
            stop: None,
        }
    }

    /// Adds a parser's call piece to this step's pieces: a new call gets
    /// an index, an id and its name; more arguments of the current call
    /// extend this step's last piece when it is that call's.
    fn piece(&mut self, format: ToolFormat, piece: CallPiece, out: &mut Vec<ToolCallPiece>) {
        match piece {
            // A call after the one counts (its arguments are told from the
            // first's) but none of it is released.
            CallPiece::Begin(_) if self.single_call && self.calls >= 1 => self.calls += 1,
            CallPiece::Args(_) if self.single_call && self.calls >= 2 => {}
            CallPiece::Begin(name) => {
                out.push(ToolCallPiece {
                    index: self.calls,
                    id: format.call_id(),
                    name,
                    arguments: String::new(),
                });
                self.calls += 1;
            }
            CallPiece::Args(text) => {
                let Some(index) = self.calls.checked_sub(1) else {
                    return;
                };
                match out.last_mut() {
                    Some(last) if last.index == index => last.arguments.push_str(&text),
                    _ => out.push(ToolCallPiece {
                        index,
                        id: String::new(),
                        name: String::new(),
                        arguments: text,
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "pipeline_tool_tests.rs"]
mod tool_tests;
