//! `/v1/responses`: each route is one `gyre.v1.Responses` call.
//!
//! `POST /v1/responses` answers the final `response` object (drained from
//! the `Create` stream; with `background`, the queued response at once) or,
//! with `stream`, the events as SSE; `GET /v1/responses/{id}` answers the
//! stored response (`?stream=true&starting_after=N`: its events replayed);
//! `DELETE`, `POST .../cancel`, `GET .../input_items` and
//! `POST /v1/responses/input_tokens` map to `Delete`, `Cancel`,
//! `ListInputItems` and `CountInputTokens`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use gyre_api::v1 as pb;
use serde_json::json;

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::extract::JsonObject;
use crate::notice::ModelNotice;
use crate::openai::responses_output::{item_list, response};
use crate::openai::responses_request::ResponsesRequest;
use crate::responses_upstream::EventStream;
use crate::upstream::grpc_request;

/// The query string of a GET, as key -> value (a key given twice: the last).
pub(crate) type QueryMap = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The path's id, or a 400 when it cannot be read.
pub(crate) fn path_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|e| ApiError::invalid_request(format!("Invalid path: {}", e.body_text()), None))
}

/// The query's key -> value map, or a 400 when it cannot be read.
pub(crate) fn query(q: QueryMap) -> Result<HashMap<String, String>, ApiError> {
    q.map(|Query(q)| q).map_err(|e| {
        ApiError::invalid_request(format!("Invalid query string: {}", e.body_text()), None)
    })
}

/// A query parameter parsed as `T`, or a 400 naming it.
pub(crate) fn query_param<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    name: &str,
    expected: &str,
) -> Result<Option<T>, ApiError> {
    q.get(name)
        .map(|v| {
            v.parse::<T>().map_err(|_| {
                ApiError::invalid_request(
                    format!(
                        "Invalid value for '{name}': expected {expected}, got '{}'.",
                        gyre_api::clip(v)
                    ),
                    Some(name),
                )
                .with_code(Some("invalid_value".into()))
            })
        })
        .transpose()
}

/// The cursor of a list route: `after`, `limit` and `order` (their ranges
/// are the service's to check).
pub(crate) struct Page {
    pub after: Option<String>,
    pub limit: Option<u32>,
    pub order: Option<String>,
}

/// The [`Page`] of a list route's query.
pub(crate) fn page(q: &HashMap<String, String>) -> Result<Page, ApiError> {
    Ok(Page {
        // An empty `?after=` is no cursor (not an unknown item).
        after: q.get("after").filter(|a| !a.is_empty()).cloned(),
        limit: query_param(q, "limit", "an integer")?,
        order: q.get("order").cloned(),
    })
}

fn grpc_err(status: tonic::Status) -> ApiError {
    ApiError::from_status(&status, Api::Responses)
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let request = ResponsesRequest::from_body(&body)?;
    drop(body);
    let background = request.proto.background.unwrap_or(false);
    let mut client = state.responses.clone();
    let call = client
        .create(grpc_request(&state, &headers, request.proto))
        .await;
    let events = EventStream::start(&state, call).await?;
    if request.stream {
        return Ok(events.sse());
    }
    let notice = events.notice().clone();
    let done = events.final_response(background).await?;
    Ok(notice.apply(Json(response(&done)).into_response()))
}

/// `GET /v1/responses/{id}` (with `?stream=true`: the events, replayed).
pub async fn retrieve(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: QueryMap,
) -> Result<Response, ApiError> {
    let response_id = path_id(id)?;
    let q = query(q)?;
    let stream = query_param::<bool>(&q, "stream", "true or false")?.unwrap_or(false);
    let starting_after = query_param::<u64>(&q, "starting_after", "an integer")?;
    let mut client = state.responses.clone();
    if stream {
        let message = pb::ReplayResponseRequest {
            response_id,
            starting_after,
        };
        let call = client.replay(grpc_request(&state, &headers, message)).await;
        return Ok(EventStream::start(&state, call).await?.sse());
    }
    let r = client
        .get(grpc_request(
            &state,
            &headers,
            pb::GetResponseRequest { response_id },
        ))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&r, response))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let message = pb::DeleteResponseRequest {
        response_id: path_id(id)?,
    };
    let mut client = state.responses.clone();
    let r = client
        .delete(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(
        &r,
        |r| json!({"id": r.id, "object": "response", "deleted": r.deleted}),
    ))
}

/// `POST /v1/responses/{id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let message = pb::CancelResponseRequest {
        response_id: path_id(id)?,
    };
    let mut client = state.responses.clone();
    let r = client
        .cancel(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&r, response))
}

/// `GET /v1/responses/{id}/input_items`.
pub async fn input_items(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: QueryMap,
) -> Result<Response, ApiError> {
    let response_id = path_id(id)?;
    let Page {
        after,
        limit,
        order,
    } = page(&query(q)?)?;
    let message = pb::ListInputItemsRequest {
        response_id,
        after,
        limit,
        order,
    };
    let mut client = state.responses.clone();
    let list = client
        .list_input_items(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&list, item_list))
}

/// `POST /v1/responses/input_tokens`.
pub async fn input_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let request = ResponsesRequest::from_body(&body)?;
    drop(body);
    let mut client = state.responses.clone();
    let count = client
        .count_input_tokens(grpc_request(&state, &headers, request.proto))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&count, |c| {
        json!({
            "object": "response.input_tokens",
            "input_tokens": c.input_tokens,
        })
    }))
}
