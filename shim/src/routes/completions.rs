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
use crate::openai::response::{Meta, TextChoice, TextCompletion, Usage};
use crate::sse::{self, ChunkFormat, json_event};
use crate::upstream::Generation;

const OBJECT: &str = "text_completion";

/// The handler.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let request = CompletionRequest::from_body(&body)?;
    drop(body);
    let meta = Meta::new("cmpl", &request.common.model);
    let (proto, mode) = request.into_proto(&meta.id)?;
    let generation = Generation::start(&state, &headers, proto, Api::Completions).await?;
    if mode.stream {
        let format = TextChunks {
            meta,
            include_usage: mode.include_usage,
        };
        return Ok(sse::response(generation, format));
    }
    let out = generation.collect().await?;
    let completion = TextCompletion {
        meta: &meta,
        object: OBJECT,
        choices: vec![choice(&out.text, Some(out.finish_reason))],
        usage: Some(Some(out.usage)),
    };
    Ok(Json(completion).into_response())
}

fn choice<'a>(text: &'a str, finish_reason: Option<&'static str>) -> TextChoice<'a> {
    TextChoice {
        index: 0,
        text,
        logprobs: None,
        finish_reason,
    }
}

/// Chunk shapes of a streamed text completion.
struct TextChunks {
    meta: Meta,
    include_usage: bool,
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
    fn opening(&self) -> Option<Event> {
        None
    }

    fn text(&self, text: &str) -> Event {
        self.chunk(vec![choice(text, None)], None)
    }

    fn finish(&self, reason: &'static str) -> Event {
        self.chunk(vec![choice("", Some(reason))], None)
    }

    fn usage(&self, usage: Usage) -> Option<Event> {
        self.include_usage.then(|| self.chunk(vec![], Some(usage)))
    }
}
