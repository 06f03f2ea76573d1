//! `POST /v1/completions` (legacy text completions): one `GenerateStream`
//! call per request, answered as a `text_completion`, whole or streamed.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::convert::CompletionRequest;
use crate::error::{Api, ApiError};
use crate::extract::JsonObject;
use crate::openai::response::{Meta, TextChoice, TextCompletion, TextLogprobs, Usage};
use crate::routes::models::default_model;
use crate::sse::{self, ChunkFormat, json_event};
use crate::upstream::{Finish, Merged};
use gyre_api::v1::{PromptEcho, TokenLogprob};

const OBJECT: &str = "text_completion";

/// The handler.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let request = CompletionRequest::from_body(&body)?;
    drop(body);
    let mut meta = Meta::new("cmpl", &request.common.model);
    let (mut protos, mode) = request.into_protos(&meta.id)?;
    if meta.model.is_empty() {
        meta.model = default_model(&state, &headers).await?;
        for p in &mut protos {
            p.model.clone_from(&meta.model);
        }
    }
    let per_prompt = protos.first().and_then(|p| p.n).unwrap_or(1);
    // Choice j of prompt i is choice i * per_prompt + j.
    let n = per_prompt * protos.len() as u32;
    let want_logprobs = protos.first().is_some_and(|p| p.logprobs.is_some());
    // A stream waits for its first step no longer than a heartbeat.
    let patience = state.sse_heartbeat.filter(|_| mode.stream);
    let generation = Merged::start(&state, &headers, protos, Api::Completions, patience)
        .await
        .map_err(|e| e.for_model(&meta.model))?;
    let notice = generation.notice().clone();
    if let Some(id) = &notice.model {
        meta.model.clone_from(id);
    }
    if mode.stream {
        let format = TextChunks {
            meta,
            include_usage: mode.include_usage,
            offsets: (0..n).map(|_| TextLogprobs::default()).collect(),
            logprobs: want_logprobs,
            echo: mode.echo,
        };
        let annotations = sse::Annotations {
            list: mode.annotations,
            per_prompt,
        };
        return Ok(notice.apply(sse::response(
            generation,
            n,
            annotations,
            format,
            state.sse_heartbeat,
        )));
    }
    let out = generation.collect(n).await?;
    // With echo, each choice's text (and logprobs listing) starts with the prompt.
    let texts: Vec<String> = out
        .choices
        .iter()
        .map(|c| match &c.echo {
            Some(e) if mode.echo => format!("{}{}", e.text, c.text),
            _ => c.text.clone(),
        })
        .collect();
    let completion = TextCompletion {
        meta: &meta,
        object: OBJECT,
        choices: (0u32..)
            .zip(out.choices.iter().zip(&texts))
            .map(|(index, (c, text))| {
                let logprobs = want_logprobs.then(|| {
                    let (first, prompt) = prompt_listing(c.echo.as_ref());
                    TextLogprobs::default().listing(first, prompt.iter().chain(&c.logprobs))
                });
                choice(index, text, logprobs, Some(c.finish.as_str()))
            })
            .collect(),
        usage: Some(Some(out.usage)),
    };
    Ok(notice.apply(Json(completion).into_response()))
}

/// The echoed prompt's part of a logprobs listing: its first token (without
/// log-probability) and the log-probabilities of the others.
fn prompt_listing(echo: Option<&PromptEcho>) -> (Option<&str>, &[TokenLogprob]) {
    match echo {
        Some(e) if !e.token_ids.is_empty() => (Some(e.first_token.as_str()), &e.logprobs),
        _ => (None, &[]),
    }
}

fn choice<'a>(
    index: u32,
    text: &'a str,
    logprobs: Option<serde_json::Value>,
    finish_reason: Option<&'static str>,
) -> TextChoice<'a> {
    TextChoice {
        index,
        text,
        logprobs,
        finish_reason,
    }
}

/// Chunk shapes of a streamed text completion.
struct TextChunks {
    meta: Meta,
    include_usage: bool,
    /// Per choice: where the next token's `text_offset` starts.
    offsets: Vec<TextLogprobs>,
    /// Whether the request asked for logprobs.
    logprobs: bool,
    /// Whether each choice's text starts with the prompt.
    echo: bool,
}

impl TextChunks {
    fn chunk(&self, choices: Vec<TextChoice<'_>>, usage: Option<Usage>) -> Event {
        json_event(&TextCompletion {
            meta: &self.meta,
            object: OBJECT,
            choices,
            usage: self.include_usage.then_some(usage),
        })
    }
}

impl ChunkFormat for TextChunks {
    fn opening(&self, _index: u32) -> Option<Event> {
        None
    }

    fn text(&mut self, index: u32, text: &str, logprobs: &[TokenLogprob]) -> Event {
        let logprobs = match self.offsets.get_mut(index as usize) {
            Some(o) if !logprobs.is_empty() => Some(o.build(logprobs)),
            _ => None,
        };
        self.chunk(vec![choice(index, text, logprobs, None)], None)
    }

    fn empty_chunk(&self) -> serde_json::Value {
        serde_json::to_value(TextCompletion {
            meta: &self.meta,
            object: OBJECT,
            choices: vec![],
            usage: self.include_usage.then_some(None),
        })
        .unwrap_or_default()
    }

    /// With `echo`, the prompt is the choice's first chunk.
    fn echo(&mut self, index: u32, echo: &PromptEcho) -> Option<Event> {
        if !self.echo {
            return None;
        }
        let logprobs = match self.offsets.get_mut(index as usize) {
            Some(o) if self.logprobs => {
                let (first, prompt) = prompt_listing(Some(echo));
                Some(o.listing(first, prompt.iter()))
            }
            _ => None,
        };
        Some(self.chunk(vec![choice(index, &echo.text, logprobs, None)], None))
    }

    fn finish(&self, index: u32, reason: Finish) -> Event {
        self.chunk(vec![choice(index, "", None, Some(reason.as_str()))], None)
    }

    fn usage(&self, usage: Usage) -> Option<Event> {
        self.include_usage.then(|| self.chunk(vec![], Some(usage)))
    }
}
