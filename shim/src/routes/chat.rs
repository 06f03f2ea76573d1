//! `POST /v1/chat/completions`: one `GenerateStream` call per request,
//! answered as a `chat.completion` or as `chat.completion.chunk` events.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::convert::ChatRequest;
use crate::error::{Api, ApiError};
use crate::extract::JsonObject;
use crate::openai::response::{
    ChatChunk, ChatCompletion, ChunkChoice, ChunkDelta, Meta, ToolCallOut, Usage, chat_logprobs,
};
use crate::routes::models::default_model;
use crate::sse::{self, ChunkFormat, json_event};
use crate::upstream::{Finish, Merged};
use gyre_api::v1::TokenLogprob;

/// The handler.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let request = ChatRequest::from_body(&body)?;
    drop(body);
    // max_completion_tokens wins over max_tokens; errors name what was sent.
    let completion_tokens = request.common.max_completion_tokens.is_some();
    let spelled = |e: ApiError| match completion_tokens {
        true => e.renamed("max_tokens", "max_completion_tokens"),
        false => e,
    };
    let mut meta = Meta::new("chatcmpl", &request.common.model);
    let (mut proto, mode) = request.into_proto(&meta.id)?;
    if proto.model.is_empty() {
        meta.model = default_model(&state, &headers).await?;
        proto.model.clone_from(&meta.model);
    }
    let n = proto.n.unwrap_or(1);
    let want_logprobs = proto.logprobs.is_some();
    // A stream waits for its first step no longer than a heartbeat.
    let patience = state.sse_heartbeat.filter(|_| mode.stream);
    let generation = Merged::start(&state, &headers, vec![proto], Api::Chat, patience)
        .await
        .map_err(|e| spelled(e.for_model(&meta.model)))?;
    let notice = generation.notice().clone();
    if let Some(id) = &notice.model {
        meta.model.clone_from(id);
    }
    if mode.stream {
        let format = ChatChunks {
            meta,
            include_usage: mode.include_usage,
        };
        let annotations = sse::Annotations {
            list: mode.annotations,
            per_prompt: n,
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
    let reasoning = out.choices.iter().map(|c| c.reasoning.clone()).collect();
    let choices = out
        .choices
        .into_iter()
        .map(|c| {
            let calls = c
                .tool_calls
                .iter()
                .map(|c| ToolCallOut::from_delta(c, false))
                .collect();
            (
                c.text,
                c.finish.as_str(),
                want_logprobs.then(|| chat_logprobs(&c.logprobs)),
                calls,
            )
        })
        .collect();
    let completion = ChatCompletion::new(meta, choices, out.usage).with_reasoning(reasoning);
    Ok(notice.apply(Json(completion).into_response()))
}

/// Chunk shapes of a streamed chat completion.
struct ChatChunks {
    meta: Meta,
    include_usage: bool,
}

impl ChatChunks {
    fn chunk(
        &self,
        index: u32,
        delta: ChunkDelta<'_>,
        logprobs: Option<serde_json::Value>,
        finish_reason: Option<&'static str>,
    ) -> Event {
        json_event(&ChatChunk {
            meta: &self.meta,
            object: "chat.completion.chunk",
            choices: vec![ChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason,
            }],
            usage: self.include_usage.then_some(None),
        })
    }
}

impl ChunkFormat for ChatChunks {
    fn opening(&self, index: u32) -> Option<Event> {
        let delta = ChunkDelta {
            role: Some("assistant"),
            content: Some(""),
            ..Default::default()
        };
        Some(self.chunk(index, delta, None, None))
    }

    fn text(&mut self, index: u32, text: &str, logprobs: &[TokenLogprob]) -> Event {
        let delta = ChunkDelta {
            role: None,
            content: Some(text),
            ..Default::default()
        };
        let logprobs = (!logprobs.is_empty()).then(|| chat_logprobs(logprobs));
        self.chunk(index, delta, logprobs, None)
    }

    fn tool_calls(&mut self, index: u32, calls: &[gyre_api::v1::ToolCallDelta]) -> Event {
        let delta = ChunkDelta {
            role: None,
            content: None,
            tool_calls: calls
                .iter()
                .map(|c| ToolCallOut::from_delta(c, true))
                .collect(),
            ..Default::default()
        };
        self.chunk(index, delta, None, None)
    }

    fn reasoning(&mut self, index: u32, text: &str) -> Option<Event> {
        let delta = ChunkDelta {
            reasoning_content: Some(text),
            reasoning: Some(text),
            ..Default::default()
        };
        Some(self.chunk(index, delta, None, None))
    }

    /// The prompt is never part of a chat answer (only of annotations).
    fn echo(&mut self, _index: u32, _echo: &gyre_api::v1::PromptEcho) -> Option<Event> {
        None
    }

    fn empty_chunk(&self) -> serde_json::Value {
        serde_json::to_value(ChatChunk {
            meta: &self.meta,
            object: "chat.completion.chunk",
            choices: vec![],
            usage: self.include_usage.then_some(None),
        })
        .unwrap_or_default()
    }

    fn finish(&self, index: u32, reason: Finish) -> Event {
        self.chunk(index, ChunkDelta::default(), None, Some(reason.as_str()))
    }

    fn usage(&self, usage: Usage) -> Option<Event> {
        self.include_usage.then(|| {
            json_event(&ChatChunk {
                meta: &self.meta,
                object: "chat.completion.chunk",
                choices: vec![],
                usage: Some(Some(usage)),
            })
        })
    }
}
