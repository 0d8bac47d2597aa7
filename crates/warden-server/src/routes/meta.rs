//! Health, metrics, the OpenAPI document and the answers for unknown routes.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use warden_store::Store;

use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::{HealthResponse, Reply};

/// `GET /healthz`: liveness (no store access).
pub(crate) async fn healthz<S: Store>(State(st): State<AppState<S>>) -> Reply<HealthResponse> {
    Reply(
        StatusCode::OK,
        HealthResponse {
            status: "ok".to_owned(),
            policy_version: st.engine().policy().version.clone(),
        },
    )
}

/// `GET /metrics`: Prometheus text format.
pub(crate) async fn metrics<S: Store>(State(st): State<AppState<S>>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        st.metrics().render(),
    )
        .into_response()
}

/// `GET /openapi.json`.
pub(crate) async fn openapi() -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        crate::openapi::document_bytes(),
    )
        .into_response()
}

/// No such route: the shared 404.
pub(crate) async fn no_route() -> ApiError {
    ApiError::not_found()
}

/// The route exists, the method does not.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}
