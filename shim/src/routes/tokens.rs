//! vLLM-compatible utility routes: `POST /tokenize` (a prompt, or chat
//! messages rendered with the model's template), `POST /detokenize`,
//! `GET /health` (200 when the service reports SERVING, else 503) and `GET /version`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use gyre_api::v1::{self as pb, DetokenizeRequest, TokenizeRequest, tokenize_request};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::AppState;
use crate::convert::{chat_messages, json_to_struct};
use crate::error::{Api, ApiError};
use crate::extract::{JsonObject, fields, require};
use crate::notice::ModelNotice;
use crate::openai::request::ChatMessage;
use crate::upstream::grpc_request;

#[derive(Deserialize)]
struct TokenizeBody {
    #[serde(default)]
    model: String,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    chat_template: Option<String>,
    add_special_tokens: Option<bool>,
}

/// `POST /tokenize`: `{"model", "prompt"}` or `{"model", "messages"}` ->
/// `{"tokens", "count", "max_model_len"}`.
pub async fn tokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let b: TokenizeBody = fields(&body)?;
    let input = match (b.prompt, b.messages) {
        (Some(text), None) => tokenize_request::Input::Text(text),
        (None, Some(messages)) => tokenize_request::Input::Chat(pb::ChatInput {
            messages: chat_messages(messages)?,
            add_generation_prompt: b.add_generation_prompt,
            continue_final_message: b.continue_final_message,
            chat_template_kwargs: b.chat_template_kwargs.map(json_to_struct),
            tools: Vec::new(),
            chat_template: b.chat_template,
            tool_choice: None,
            parallel_tool_calls: None,
        }),
        _ => {
            return Err(ApiError::invalid_request(
                "Send exactly one of 'prompt' or 'messages'.",
                Some("prompt"),
            ));
        }
    };
    let model = b.model;
    let request = TokenizeRequest {
        model: model.clone(),
        input: Some(input),
        add_special_tokens: b.add_special_tokens,
    };
    let mut client = state.client.clone();
    let response = client
        .tokenize(grpc_request(&state, &headers, request))
        .await
        .map_err(|status| ApiError::from_status(&status, Api::Completions).for_model(&model))?;
    let notice = ModelNotice::from_metadata(response.metadata());
    let out = response.into_inner();
    Ok(notice.apply(
        Json(json!({
            "tokens": out.token_ids,
            "count": out.token_ids.len(),
            "max_model_len": out.max_model_len,
        }))
        .into_response(),
    ))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    #[serde(default)]
    model: String,
    tokens: Vec<u32>,
}

/// `POST /detokenize`: `{"model", "tokens"}` -> `{"prompt"}`.
pub async fn detokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    require(&body, &["tokens"])?;
    let b: DetokenizeBody = fields(&body)?;
    let model = b.model;
    let request = DetokenizeRequest {
        model: model.clone(),
        token_ids: b.tokens,
        skip_special_tokens: None,
    };
    let mut client = state.client.clone();
    let response = client
        .detokenize(grpc_request(&state, &headers, request))
        .await
        .map_err(|status| {
            // The ids are the completions API's prompt there; here `tokens`.
            ApiError::from_status(&status, Api::Completions)
                .for_model(&model)
                .renamed("prompt", "tokens")
        })?;
    let notice = ModelNotice::from_metadata(response.metadata());
    let out = response.into_inner();
    Ok(notice.apply(Json(json!({ "prompt": out.text })).into_response()))
}

/// `GET /health`: 200 when the gRPC service reports SERVING
/// (grpc.health.v1, overall status), 503 while it is unreachable, still
/// loading, or draining for shutdown.
pub async fn health(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let mut client = state.health.clone();
    // The client's key goes along: a service with a keys file may keep its
    // health check behind it (`--open-endpoints` leaves it open).
    let mut request = crate::upstream::grpc_request(
        &state,
        &headers,
        HealthCheckRequest {
            service: String::new(),
        },
    );
    request.set_timeout(std::time::Duration::from_secs(5));
    let reason = match client.check(request).await {
        Ok(r) if r.get_ref().status == ServingStatus::Serving as i32 => return Ok(StatusCode::OK),
        Err(status) if status.code() == tonic::Code::Unauthenticated => {
            return Err(ApiError::from_status(&status, Api::Models));
        }
        Ok(r) => format!(
            "status {:?}",
            ServingStatus::try_from(r.get_ref().status).unwrap_or_default()
        ),
        Err(status) => format!("{}", status.code()),
    };
    Err(ApiError::from_status(
        &tonic::Status::unavailable(format!("the gRPC service is not serving ({reason})")),
        Api::Models,
    ))
}

/// `GET /version`.
pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
