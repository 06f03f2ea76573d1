//! `POST /v1/embeddings` (also `/embeddings`): one gRPC `Embed` call,
//! answered as OpenAI's `CreateEmbeddingResponse`, with the model's
//! deprecation notices as headers (as chat's).

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse as _, Response};
use gyre_api::v1::{self as pb, EmbedRequest, embed_request};

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::extract::JsonObject;
use crate::notice::ModelNotice;
use crate::openai::embeddings::{
    Embedding, EmbeddingInput, EmbeddingList, EmbeddingRequest, EmbeddingUsage, Vector,
};
use crate::upstream::grpc_request;

/// The handler.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let req = EmbeddingRequest::from_body(&body)?;
    drop(body);
    let inputs = match req.input {
        EmbeddingInput::Texts(texts) => embed_request::Inputs::Texts(pb::Texts { texts }),
        EmbeddingInput::TokenIds(lists) => embed_request::Inputs::TokenIds(pb::TokenIdLists {
            lists: lists.into_iter().map(|ids| pb::TokenIds { ids }).collect(),
        }),
    };
    let message = EmbedRequest {
        model: req.model.clone(),
        inputs: Some(inputs),
        truncate_prompt_tokens: req.truncate_prompt_tokens,
        dimensions: req.dimensions,
    };
    let mut call = grpc_request(&state, &headers, message);
    if let Some(t) = state.request_timeout {
        call.set_timeout(t);
    }
    let mut client = state.embeddings.clone();
    let response = client
        .embed(call)
        .await
        .map_err(|status| ApiError::from_status(&status, Api::Embeddings).for_model(&req.model))?;
    let notice = ModelNotice::from_metadata(response.metadata());
    let out = response.into_inner();
    let usage = out.usage.unwrap_or_default();
    let list = EmbeddingList {
        object: "list",
        data: out
            .embeddings
            .into_iter()
            .enumerate()
            .map(|(index, e)| Embedding {
                object: "embedding",
                index,
                embedding: Vector::new(e.values, req.encoding_format),
            })
            .collect(),
        model: out.model,
        usage: EmbeddingUsage {
            prompt_tokens: usage.prompt_tokens,
            total_tokens: usage.total_tokens,
        },
    };
    Ok(notice.apply(Json(list).into_response()))
}
