//! `/v1/conversations`: create, retrieve, delete and list the items of a
//! stored conversation, each one `gyre.v1.Responses` call. Responses created
//! with `conversation` read their history from it and append to it.

use std::collections::HashMap;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use gyre_api::v1 as pb;
use serde::Deserialize;
use serde_json::{Value, json};

use super::responses::{Page, QueryMap, page, path_id, query};
use crate::AppState;
use crate::error::{Api, ApiError};
use crate::extract::{JsonObject, fields};
use crate::notice::ModelNotice;
use crate::openai::responses_input::{items, wrong_type};
use crate::openai::responses_output::{conversation, item_list};
use crate::upstream::grpc_request;

fn grpc_err(status: tonic::Status) -> ApiError {
    ApiError::from_status(&status, Api::Responses)
}

#[derive(Deserialize)]
struct CreateParams {
    metadata: Option<HashMap<String, String>>,
}

/// `POST /v1/conversations`: `{"items": [...], "metadata": {...}}`, both
/// optional.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let params: CreateParams = fields(&body)?;
    let items = match body.get("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => items(list, "items")?,
        Some(other) => return Err(wrong_type("items", "an array", other)),
    };
    let message = pb::CreateConversationRequest {
        items,
        metadata: params.metadata.unwrap_or_default(),
    };
    let mut client = state.responses.clone();
    let c = client
        .create_conversation(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&c, conversation))
}

/// `GET /v1/conversations/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let message = pb::GetConversationRequest {
        conversation_id: path_id(id)?,
    };
    let mut client = state.responses.clone();
    let c = client
        .get_conversation(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&c, conversation))
}

/// `DELETE /v1/conversations/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let message = pb::DeleteConversationRequest {
        conversation_id: path_id(id)?,
    };
    let mut client = state.responses.clone();
    let r = client
        .delete_conversation(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(
        &r,
        |r| json!({"id": r.id, "object": "conversation.deleted", "deleted": r.deleted}),
    ))
}

/// `GET /v1/conversations/{id}/items`.
pub async fn list_items(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: QueryMap,
) -> Result<Response, ApiError> {
    let conversation_id = path_id(id)?;
    let Page {
        after,
        limit,
        order,
    } = page(&query(q)?)?;
    let message = pb::ListConversationItemsRequest {
        conversation_id,
        after,
        limit,
        order,
    };
    let mut client = state.responses.clone();
    let list = client
        .list_conversation_items(grpc_request(&state, &headers, message))
        .await
        .map_err(grpc_err)?;
    Ok(ModelNotice::json(&list, item_list))
}
