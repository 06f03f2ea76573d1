//! `GET /v1/models` and `GET /v1/models/{id}` over the `ListModels` call.
//! Model ids may contain '/', hence the wildcard route. Also
//! [`default_model`]: which model a generation asking for `""` runs on.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use gyre_api::v1::{ListModelsRequest, Model};

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::openai::response::{ModelList, ModelObject};
use crate::upstream::grpc_request;

/// `GET /v1/models`.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<ModelList>, ApiError> {
    let models = fetch(&state, &headers).await?;
    Ok(Json(ModelList {
        object: "list",
        data: models.into_iter().map(ModelObject::from).collect(),
    }))
}

/// `GET /v1/models/{*id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, ApiError> {
    fetch(&state, &headers)
        .await?
        .into_iter()
        .find(|m| m.id == id)
        .map(|m| Json(ModelObject::from(m)))
        .ok_or_else(|| ApiError::model_not_found(&id))
}

/// The service's default (its first) model, which a generation asking for
/// model `""` runs on: responses name it, and the request asks for it by id.
pub(crate) async fn default_model(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    fetch(state, headers)
        .await?
        .into_iter()
        .next()
        .map(|m| m.id)
        .ok_or_else(|| ApiError::model_not_found(""))
}

async fn fetch(state: &AppState, headers: &HeaderMap) -> Result<Vec<Model>, ApiError> {
    let mut client = state.client.clone();
    let response = client
        .list_models(grpc_request(state, headers, ListModelsRequest {}))
        .await
        .map_err(|status| ApiError::from_status(&status, Api::Models))?;
    Ok(response.into_inner().models)
}
