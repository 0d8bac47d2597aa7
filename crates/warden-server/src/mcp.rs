//! `/mcp`: the MCP gateway (see the `warden-mcp` crate) on the streamable
//! HTTP transport, behind the agent's bearer token.
//!
//! Every request is authenticated like any agent route (the operator's
//! token is refused 403 `agent_token_required`); the token's agent is the
//! caller of every `tools/list` and `tools/call` on it, whatever a payload
//! says. A `Warden-Session: ID` header binds the request's calls to that
//! session (opened through `POST /v1/sessions`, so it can carry the user's
//! request as a trusted input); without it the MCP connection gets its own
//! session with no trusted inputs. A malformed header is 400
//! `invalid_session_header`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use warden_core::ids::SessionId;
use warden_mcp::{Gateway, McpIdentity, SESSION_HEADER, streamable_http_service};
use warden_store::Store;

use crate::auth::AgentCaller;
use crate::error::ApiError;
use crate::state::AppState;

/// The `/mcp` route, its gateway made from the state's engine. With
/// upstreams declared, they are launched and checked now (when a runtime
/// runs) and the gateway's counters join `/metrics`.
pub(crate) fn routes<S: Store>(state: &AppState<S>) -> Router<AppState<S>> {
    let gateway = Arc::new(Gateway::new(state.engine().clone()));
    if !gateway.upstreams().is_empty() {
        let g = Arc::clone(&gateway);
        state
            .metrics()
            .add_source(Arc::new(move || g.render_metrics()));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let g = Arc::clone(&gateway);
            gateway.watch();
            rt.spawn(async move {
                g.start().await;
            });
        }
    }
    let service = streamable_http_service(gateway, state.config().limits.max_body_bytes);
    Router::new()
        .route_service("/mcp", service)
        .layer(from_fn_with_state(state.clone(), identify::<S>))
}

/// Authenticate the request and attach who it is to it.
async fn identify<S: Store>(State(st): State<AppState<S>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let agent = match AgentCaller::from_request_parts(&mut parts, &st).await {
        Ok(AgentCaller(a)) => a,
        Err(e) => return e.into_response(),
    };
    let session = match parts.headers.get(SESSION_HEADER) {
        None => None,
        Some(v) => match v.to_str().ok().map(SessionId::parse) {
            Some(Ok(id)) => Some(id),
            _ => {
                return ApiError::bad_request(
                    "invalid_session_header",
                    "Warden-Session must be a session id",
                )
                .into_response();
            }
        },
    };
    parts.extensions.insert(McpIdentity { agent, session });
    next.run(Request::from_parts(parts, body)).await
}
