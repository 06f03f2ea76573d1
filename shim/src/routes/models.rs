//! `GET /v1/models`, `GET /v1/models/{id}` (an id or an alias) and NVIDIA
//! Dynamo's `GET /dynamo/alpha/list-models`, all over the `ListModels`
//! call. Model ids may contain '/', hence the wildcard route. Also
//! [`default_model`]: which model a generation asking for `""` runs on.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use gyre_api::v1::{ListModelsRequest, Model};

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::notice::ModelNotice;
use crate::openai::response::{ModelList, ModelObject};
use crate::upstream::grpc_request;

/// `GET /v1/models`.
pub async fn list(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let (models, notice) = fetch(&state, &headers).await?;
    Ok(notice.apply(
        Json(ModelList {
            object: "list",
            data: models.into_iter().map(ModelObject::from).collect(),
        })
        .into_response(),
    ))
}

/// `GET /v1/models/{*id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (models, notice) = fetch(&state, &headers).await?;
    models
        .into_iter()
        .find(|m| m.id == id || m.aliases.contains(&id))
        .map(|m| notice.apply(Json(ModelObject::from(m)).into_response()))
        .ok_or_else(|| ApiError::model_not_found(&id))
}

/// `GET /dynamo/alpha/list-models`: Dynamo's listing, the names requests
/// may use (ids and aliases) by what they serve (`chat_completion_models`:
/// models with a chat template; `completion_models`: every generative
/// model), plus the catalogue as `/v1/models` lists it (`object`, `data`).
pub async fn dynamo_list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (models, notice) = fetch(&state, &headers).await?;
    fn names(m: &Model) -> Vec<String> {
        std::iter::once(m.id.clone())
            .chain(m.aliases.iter().cloned())
            .collect()
    }
    let generative = |m: &&Model| m.kind.is_empty() || m.kind == "generate";
    let chat: Vec<String> = models
        .iter()
        .filter(generative)
        .filter(|m| m.chat)
        .flat_map(names)
        .collect();
    let completion: Vec<String> = models.iter().filter(generative).flat_map(names).collect();
    let data: Vec<ModelObject> = models.into_iter().map(ModelObject::from).collect();
    Ok(notice.apply(
        Json(serde_json::json!({
            "chat_completion_models": chat,
            "completion_models": completion,
            "object": "list",
            "data": data,
        }))
        .into_response(),
    ))
}

/// The service's default (its first) model, which a generation asking for
/// model `""` runs on: responses name it, and the request asks for it by id.
pub(crate) async fn default_model(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    fetch(state, headers)
        .await?
        .0
        .into_iter()
        .next()
        .map(|m| m.id)
        .ok_or_else(|| ApiError::model_not_found(""))
}

/// The catalogue, and the call's headers for the HTTP answer.
async fn fetch(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<(Vec<Model>, ModelNotice), ApiError> {
    let mut client = state.client.clone();
    let response = client
        .list_models(grpc_request(state, headers, ListModelsRequest {}))
        .await
        .map_err(|status| ApiError::from_status(&status, Api::Models))?;
    let notice = ModelNotice::from_metadata(response.metadata());
    Ok((response.into_inner().models, notice))
}
