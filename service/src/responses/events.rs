//! The event builder: the output pipeline's typed pieces (a `Delta`'s
//! reasoning, text and tool-call fragments, then the `Finish`) in, OpenAI's
//! stream of response events out, numbered from 0 by one, while the
//! `Response` they describe is kept up to date.
//!
//! Items open as their first piece arrives and close (their `done` events)
//! when another kind of item opens or the output ends: a reasoning item
//! (one `reasoning_text` part), a message (one `output_text` part), one
//! function call per call. Answer text that is only whitespace opens no
//! message until more text follows (so the blank text a tool-call format
//! leaves between calls makes no empty message). Item ids in the events are
//! those of the final response, and each item's deltas concatenate to its
//! `done` text. Calls past `max_tool_calls` are dropped.

use gyre_api::v1::{
    self, ArgumentsDelta, ArgumentsDone, ContentPart, FinishReason, FunctionCallItem, Item,
    ItemEvent, MessageItem, OutputText, PartEvent, ReasoningItem, Response, ResponseError,
    ResponseEvent, ResponseUsage, TextDelta, TextDone, TokenLogprob, content_part::Part,
    item::Item as It, response_event::Event as Ev,
};

use super::ids;

/// What the builder is told about the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Return token logprobs with the output text.
    pub logprobs: bool,
    /// Keep at most this many function calls.
    pub max_tool_calls: Option<u32>,
}

/// The item being written.
enum Open {
    Reasoning(usize),
    Message(usize),
    /// A function call: its output index and its index among the choice's
    /// calls.
    Call(usize, u32),
}

/// Builds one response's events.
pub struct Builder {
    resp: Response,
    opts: Options,
    seq: u64,
    open: Option<Open>,
    /// Whitespace-only answer text not yet given to a message.
    blank: String,
    /// Logprobs of tokens whose text was not yet sent.
    logprobs: Vec<TokenLogprob>,
    calls: u32,
}

impl Builder {
    pub fn new(resp: Response, opts: Options) -> Self {
        Self {
            resp,
            opts,
            seq: 0,
            open: None,
            blank: String::new(),
            logprobs: Vec::new(),
            calls: 0,
        }
    }

    /// The response as it stands.
    pub fn response(&self) -> &Response {
        &self.resp
    }

    /// Whether the response ended.
    pub fn ended(&self) -> bool {
        !super::store::RUNNING.contains(&self.resp.status.as_str())
    }

    fn ev(&mut self, e: Ev) -> ResponseEvent {
        let n = self.seq;
        self.seq += 1;
        ResponseEvent {
            sequence_number: n,
            event: Some(e),
        }
    }

    /// `created` (with the status the response has), and `queued` when it
    /// is queued.
    pub fn created(&mut self) -> Vec<ResponseEvent> {
        let mut out = vec![self.ev(Ev::Created(self.resp.clone()))];
        if self.resp.status == "queued" {
            out.push(self.ev(Ev::Queued(self.resp.clone())));
        }
        out
    }

    /// The response starts running: `in_progress`.
    pub fn in_progress(&mut self) -> Vec<ResponseEvent> {
        self.resp.status = "in_progress".into();
        vec![self.ev(Ev::InProgress(self.resp.clone()))]
    }

    /// The events of one delta of the pipeline.
    pub fn delta(&mut self, d: &v1::Delta) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if self.opts.logprobs {
            self.logprobs.extend(d.logprobs.iter().cloned());
        }
        if !d.reasoning.is_empty() {
            self.reasoning(&d.reasoning, &mut out);
        }
        if !d.text.is_empty() {
            self.text(&d.text, &mut out);
        }
        for c in &d.tool_calls {
            self.call(c, &mut out);
        }
        out
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<ResponseEvent>) {
        let idx = match self.open {
            Some(Open::Reasoning(i)) => i,
            _ => {
                self.close(out, "completed");
                let item = Item {
                    id: ids::new("rs"),
                    status: "in_progress".into(),
                    item: Some(It::Reasoning(ReasoningItem::default())),
                };
                let i = self.add(item, out);
                let part = ContentPart {
                    part: Some(Part::ReasoningText(String::new())),
                };
                out.push(self.part_event(i, part, true));
                self.open = Some(Open::Reasoning(i));
                i
            }
        };
        if let Some(It::Reasoning(r)) = &mut self.resp.output[idx].item {
            r.text.push_str(text);
        }
        self.logprobs.clear();
        let e = Ev::ReasoningTextDelta(self.text_delta(idx, text.to_string(), Vec::new()));
        out.push(self.ev(e));
    }

    fn text(&mut self, text: &str, out: &mut Vec<ResponseEvent>) {
        let idx = match self.open {
            Some(Open::Message(i)) => i,
            _ if text.trim().is_empty() => {
                self.blank.push_str(text);
                return;
            }
            _ => {
                self.close(out, "completed");
                let item = Item {
                    id: ids::new("msg"),
                    status: "in_progress".into(),
                    item: Some(It::Message(MessageItem {
                        role: "assistant".into(),
                        content: Vec::new(),
                    })),
                };
                let i = self.add(item, out);
                let part = ContentPart {
                    part: Some(Part::OutputText(OutputText::default())),
                };
                out.push(self.part_event(i, part.clone(), true));
                if let Some(It::Message(m)) = &mut self.resp.output[i].item {
                    m.content.push(part);
                }
                self.open = Some(Open::Message(i));
                i
            }
        };
        let text = std::mem::take(&mut self.blank) + text;
        let logprobs = std::mem::take(&mut self.logprobs);
        if let Some(It::Message(m)) = &mut self.resp.output[idx].item
            && let Some(ContentPart {
                part: Some(Part::OutputText(t)),
            }) = m.content.first_mut()
        {
            t.text.push_str(&text);
            t.logprobs.extend(logprobs.iter().cloned());
        }
        let e = Ev::OutputTextDelta(self.text_delta(idx, text, logprobs));
        out.push(self.ev(e));
    }

    fn call(&mut self, c: &v1::ToolCallDelta, out: &mut Vec<ResponseEvent>) {
        if self.opts.max_tool_calls.is_some_and(|m| c.index >= m) {
            return;
        }
        let idx = match self.open {
            Some(Open::Call(i, index)) if index == c.index && c.name.is_empty() => i,
            _ if c.name.is_empty() => return,
            _ => {
                self.close(out, "completed");
                self.blank.clear();
                let call_id = if c.id.len() == 9 {
                    // Mistral's templates need its 9-character ids.
                    c.id.clone()
                } else {
                    format!("call_{}", c.id)
                };
                let item = Item {
                    id: ids::new("fc"),
                    status: "in_progress".into(),
                    item: Some(It::FunctionCall(FunctionCallItem {
                        call_id,
                        name: c.name.clone(),
                        arguments: String::new(),
                    })),
                };
                let i = self.add(item, out);
                self.open = Some(Open::Call(i, c.index));
                self.calls += 1;
                i
            }
        };
        self.logprobs.clear();
        if c.arguments.is_empty() {
            return;
        }
        if let Some(It::FunctionCall(f)) = &mut self.resp.output[idx].item {
            f.arguments.push_str(&c.arguments);
        }
        let e = Ev::FunctionCallArgumentsDelta(ArgumentsDelta {
            item_id: self.resp.output[idx].id.clone(),
            output_index: idx as u32,
            delta: c.arguments.clone(),
        });
        out.push(self.ev(e));
    }

    /// Appends an output item and its `output_item_added`.
    fn add(&mut self, item: Item, out: &mut Vec<ResponseEvent>) -> usize {
        let i = self.resp.output.len();
        self.resp.output.push(item.clone());
        out.push(self.ev(Ev::OutputItemAdded(ItemEvent {
            output_index: i as u32,
            item: Some(item),
        })));
        i
    }

    fn part_event(&mut self, idx: usize, part: ContentPart, added: bool) -> ResponseEvent {
        let p = PartEvent {
            item_id: self.resp.output[idx].id.clone(),
            output_index: idx as u32,
            content_index: 0,
            part: Some(part),
        };
        self.ev(if added {
            Ev::ContentPartAdded(p)
        } else {
            Ev::ContentPartDone(p)
        })
    }

    fn text_delta(&self, idx: usize, delta: String, logprobs: Vec<TokenLogprob>) -> TextDelta {
        TextDelta {
            item_id: self.resp.output[idx].id.clone(),
            output_index: idx as u32,
            content_index: 0,
            delta,
            logprobs,
        }
    }

    /// Closes the open item with `status`: its `done` events.
    fn close(&mut self, out: &mut Vec<ResponseEvent>, status: &str) {
        let Some(open) = self.open.take() else {
            return;
        };
        let idx = match open {
            Open::Reasoning(i) | Open::Message(i) | Open::Call(i, _) => i,
        };
        self.resp.output[idx].status = status.to_string();
        let item = self.resp.output[idx].clone();
        let id = item.id.clone();
        match &item.item {
            Some(It::Reasoning(r)) => {
                let e = Ev::ReasoningTextDone(TextDone {
                    item_id: id,
                    output_index: idx as u32,
                    content_index: 0,
                    text: r.text.clone(),
                    logprobs: Vec::new(),
                });
                out.push(self.ev(e));
                let part = ContentPart {
                    part: Some(Part::ReasoningText(r.text.clone())),
                };
                out.push(self.part_event(idx, part, false));
            }
            Some(It::Message(m)) => {
                let t = match m.content.first() {
                    Some(ContentPart {
                        part: Some(Part::OutputText(t)),
                    }) => t.clone(),
                    _ => OutputText::default(),
                };
                let e = Ev::OutputTextDone(TextDone {
                    item_id: id,
                    output_index: idx as u32,
                    content_index: 0,
                    text: t.text.clone(),
                    logprobs: t.logprobs.clone(),
                });
                out.push(self.ev(e));
                let part = ContentPart {
                    part: Some(Part::OutputText(t)),
                };
                out.push(self.part_event(idx, part, false));
            }
            Some(It::FunctionCall(f)) => {
                let e = Ev::FunctionCallArgumentsDone(ArgumentsDone {
                    item_id: id,
                    output_index: idx as u32,
                    name: f.name.clone(),
                    arguments: f.arguments.clone(),
                });
                out.push(self.ev(e));
            }
            _ => {}
        }
        out.push(self.ev(Ev::OutputItemDone(ItemEvent {
            output_index: idx as u32,
            item: Some(item),
        })));
    }

    /// The generation ended: closes the open item and ends the response
    /// (`completed`, `incomplete` or `failed`; a cancelled response gets no
    /// further event).
    pub fn finish(&mut self, f: &v1::Finish, now: i64) -> Vec<ResponseEvent> {
        if let Some(u) = &f.usage {
            self.resp.usage = Some(ResponseUsage {
                input_tokens: u.prompt_tokens,
                cached_tokens: u.cached_tokens,
                output_tokens: u.completion_tokens,
                reasoning_tokens: u.reasoning_tokens.unwrap_or(0),
            });
        }
        let reason = FinishReason::try_from(f.reason).unwrap_or(FinishReason::Stop);
        match reason {
            FinishReason::Error => {
                let (code, message) = match &f.error {
                    Some(e) => (error_code(e.code), e.message.clone()),
                    None => ("server_error".to_string(), "generation failed".to_string()),
                };
                self.fail(&code, &message)
            }
            FinishReason::Cancelled => {
                self.cancel();
                Vec::new()
            }
            FinishReason::Length => {
                let mut out = Vec::new();
                self.close(&mut out, "incomplete");
                self.resp.status = "incomplete".into();
                self.resp.incomplete_reason = Some("max_output_tokens".into());
                out.push(self.ev(Ev::Incomplete(self.resp.clone())));
                out
            }
            _ => {
                let mut out = Vec::new();
                self.close(&mut out, "completed");
                self.resp.status = "completed".into();
                self.resp.completed_at = Some(now);
                out.push(self.ev(Ev::Completed(self.resp.clone())));
                out
            }
        }
    }

    /// The response failed: open items end incomplete, then `failed`.
    pub fn fail(&mut self, code: &str, message: &str) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        self.close(&mut out, "incomplete");
        self.resp.status = "failed".into();
        self.resp.error = Some(ResponseError {
            code: code.to_string(),
            message: message.to_string(),
        });
        out.push(self.ev(Ev::Failed(self.resp.clone())));
        out
    }

    /// The response was cancelled: open items are left incomplete and no
    /// event is sent (OpenAI's stream has no cancelled event).
    pub fn cancel(&mut self) {
        if let Some(Open::Reasoning(i) | Open::Message(i) | Open::Call(i, _)) = self.open.take() {
            self.resp.output[i].status = "incomplete".into();
        }
        self.resp.status = "cancelled".into();
    }
}

/// OpenAI's error code for a google.rpc code of a failed generation.
fn error_code(code: i32) -> String {
    match tonic::Code::from_i32(code) {
        tonic::Code::ResourceExhausted => "rate_limit_exceeded",
        tonic::Code::InvalidArgument => "invalid_prompt",
        _ => "server_error",
    }
    .to_string()
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
