//! The route table and the pieces every handler shares.

pub(crate) mod agents;
pub(crate) mod audit;
pub(crate) mod context;
pub(crate) mod memory;
pub(crate) mod meta;
pub(crate) mod runs;

use axum::Router;
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post};
use serde_json::json;
use warden_core::ids::IdentifierError;
use warden_store::Store;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Every route of the API as `(method, path template)`; the OpenAPI
/// document and the tests are checked against it.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/agents"),
    ("GET", "/v1/agents/self"),
    ("POST", "/v1/agents/self/children"),
    ("GET", "/v1/agents/{id}"),
    ("DELETE", "/v1/agents/{id}"),
    ("POST", "/v1/agents/{id}/tokens"),
    ("DELETE", "/v1/tokens/{token_id}"),
    ("GET", "/v1/memory/{namespace}/{key}"),
    ("PUT", "/v1/memory/{namespace}/{key}"),
    ("DELETE", "/v1/memory/{namespace}/{key}"),
    ("POST", "/v1/sops/validate"),
    ("POST", "/v1/runs"),
    ("POST", "/v1/runs/{run}/steps/{step}/begin"),
    ("POST", "/v1/runs/{run}/steps/{step}/complete"),
    ("GET", "/v1/runs/{run}/envelope"),
    ("GET", "/v1/runs/{run}/envelope/signed"),
    ("GET", "/v1/runs/{run}/receipt"),
    ("POST", "/v1/runs/{run}/declassify"),
    ("GET", "/v1/envelope-key"),
    ("GET", "/v1/escalations"),
    ("GET", "/v1/escalations/{id}"),
    ("POST", "/v1/escalations/{id}/approve"),
    ("POST", "/v1/escalations/{id}/reject"),
    ("GET", "/v1/audit"),
    ("GET", "/v1/audit/verify"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

/// The API's router over `state`.
pub fn router<S: Store>(state: AppState<S>) -> Router {
    Router::new()
        .route("/v1/agents", post(agents::register::<S>))
        .route("/v1/agents/self", get(agents::get_self::<S>))
        .route("/v1/agents/self/children", post(agents::delegate::<S>))
        .route(
            "/v1/agents/{id}",
            get(agents::get::<S>).delete(agents::revoke::<S>),
        )
        .route("/v1/agents/{id}/tokens", post(agents::issue_token::<S>))
        .route("/v1/tokens/{token_id}", delete(agents::revoke_token::<S>))
        .route(
            "/v1/memory/{namespace}/{key}",
            get(memory::read::<S>)
                .put(memory::write::<S>)
                .delete(memory::delete::<S>),
        )
        .route("/v1/sops/validate", post(runs::validate::<S>))
        .route("/v1/runs", post(runs::admit::<S>))
        .route("/v1/runs/{run}/steps/{step}/begin", post(runs::begin::<S>))
        .route(
            "/v1/runs/{run}/steps/{step}/complete",
            post(runs::complete::<S>),
        )
        .route("/v1/runs/{run}/envelope", get(context::envelope::<S>))
        .route("/v1/runs/{run}/envelope/signed", get(context::signed::<S>))
        .route("/v1/runs/{run}/receipt", get(context::receipt::<S>))
        .route("/v1/runs/{run}/declassify", post(context::declassify::<S>))
        .route("/v1/envelope-key", get(context::envelope_key::<S>))
        .route("/v1/escalations", get(context::list_escalations::<S>))
        .route("/v1/escalations/{id}", get(context::get_escalation::<S>))
        .route("/v1/escalations/{id}/approve", post(context::approve::<S>))
        .route("/v1/escalations/{id}/reject", post(context::reject::<S>))
        .route("/v1/audit", get(audit::page::<S>))
        .route("/v1/audit/verify", get(audit::verify::<S>))
        .route("/healthz", get(meta::healthz::<S>))
        .route("/metrics", get(meta::metrics::<S>))
        .route("/openapi.json", get(meta::openapi))
        .fallback(meta::no_route)
        .method_not_allowed_fallback(meta::method_not_allowed)
        .layer(from_fn_with_state(
            state.clone(),
            crate::middleware::observe::<S>,
        ))
        .with_state(state)
}

/// Path parameters, percent-decoded, as strings.
#[derive(Debug)]
pub(crate) struct PathParams(Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for PathParams {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| {
                ApiError::bad_request("invalid_path", "a path segment is not valid UTF-8")
            })?;
        Ok(Self(
            raw.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ))
    }
}

impl PathParams {
    /// The parameter `name` parsed as an identifier (400
    /// `invalid_identifier` otherwise).
    pub(crate) fn ident<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, IdentifierError>,
    ) -> ApiResult<T> {
        let raw = self
            .0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        parse(raw).map_err(|e| {
            ApiError::bad_request("invalid_identifier", format!("path segment `{name}`: {e}"))
                .with_details(json!({"field": name}))
        })
    }
}
