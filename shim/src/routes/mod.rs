//! HTTP handlers, one module per resource, plus the OpenAI-shaped 404 / 405
//! fallbacks.

pub mod chat;
pub mod completions;
pub mod conversations;
pub mod embeddings;
pub mod models;
pub mod responses;
pub mod tokens;

use axum::http::{Method, Uri};

use crate::error::ApiError;

/// Fallback for paths no route serves.
pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::route_not_found(method.as_str(), uri.path())
}

/// Fallback for known paths used with another method.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
