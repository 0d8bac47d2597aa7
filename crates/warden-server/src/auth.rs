//! Identity: bearer tokens bound to the operator or to one agent, read
//! from the `Authorization` header and handed to the engine, which decides
//! and records ([`warden::Engine::authenticate`],
//! [`warden::Engine::refuse_route`]; tokens are made and revoked by
//! [`warden::Engine::issue_token`] and [`warden::Engine::revoke_token`]).
//! This module only parses the header and maps the engine's outcomes to
//! HTTP.
//!
//! A token is `wdn_` followed by 64 hex digits: 256 bits from the operating
//! system's random source. Only its SHA-256 is stored, looked up by hash
//! **on every request** (so a revocation made by any process sharing the
//! store takes effect on the next request) and compared in constant time.
//! A token whose agent this server's engine has not cached yet (another
//! server registered it moments ago) is looked up in the store once, so an
//! agent can act on any server as soon as its registration and token are
//! committed.
//!
//! The acting agent is always the token's agent. No body field, query
//! parameter, header or SOP argument can name another subject: an `actor`
//! or `owner_agent_id` in a payload is data that the engine checks against
//! the caller, never a source of identity.
//!
//! Answers:
//!
//! - no `Authorization` header: 401 `missing_token`;
//! - not a bearer token, or an unknown one: 401 `invalid_token`;
//! - a revoked token: 401 `token_revoked`;
//! - a valid token of a revoked agent: 403 `agent_revoked` (the credential
//!   is genuine; the agent is no longer allowed anything). This denial is
//!   recorded in the audit log;
//! - the operator's token on an agent route: 403 `agent_token_required`; an
//!   agent's token on an operator route: 403 `operator_only` (recorded);
//! - an agent over its `requests_per_second`, or its subtree (or an
//!   ancestor's) over `tree_requests_per_second`: 429
//!   `quota_requests_per_second` with `Retry-After` and, for a tree limit,
//!   `details.tree` (the first refusal of a window recorded, later ones
//!   counted; see `warden::access`; the token
//!   bucket is per server process).
//!
//! 401s are not recorded: there is no subject to record, and recording them
//! would let anyone grow the log.

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use serde_json::json;
use warden::{Authentication, Caller, EngineError, RouteRefusal, TokenIssue};
use warden_core::ids::AgentId;
use warden_store::{Store, TokenSubject};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use warden::engine_reasons::QUOTA_REQUESTS_PER_SECOND;

pub use warden::{
    GENERATED_OPERATOR_TOKEN_ID, IssuedToken, MIN_OPERATOR_TOKEN_LEN, OperatorTokenError,
    OperatorTokenSource, TOKEN_PREFIX, hash_token,
};

/// Operation recorded for authentication denials.
pub const OP_AUTH: &str = warden::ops::AUTH_REQUEST;
/// Operation recorded for token issuance.
pub const OP_TOKEN_ISSUE: &str = warden::ops::TOKEN_ISSUE;
/// Operation recorded for token revocation.
pub const OP_TOKEN_REVOKE: &str = warden::ops::TOKEN_REVOKE;

/// Make sure an operator token exists (see
/// [`warden::Engine::ensure_operator_token`]): the one from the environment
/// if given (stored hashed on first use), else the one generated on an
/// earlier start, else a new one (returned so the caller can print it
/// once).
pub async fn ensure_operator_token<S: Store>(
    state: &AppState<S>,
    from_env: Option<&str>,
) -> Result<OperatorTokenSource, OperatorTokenError> {
    state.engine().ensure_operator_token(from_env).await
}

impl<S: Store> AppState<S> {
    /// Issue a token for `subject`, recorded as issued by `issuer` (see
    /// [`warden::Engine::issue_token`]): an unknown agent is 404
    /// `not_found`, a revoked one 409 `agent_revoked`.
    pub async fn issue_token(
        &self,
        subject: TokenSubject,
        issuer: &Caller,
    ) -> ApiResult<IssuedToken> {
        match self.engine().issue_token(issuer, subject).await {
            Ok(TokenIssue::Issued { token, .. }) => Ok(token),
            Ok(TokenIssue::AgentRevoked { agent }) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "agent_revoked",
                format!("agent `{agent}` is revoked; a token for it would be refused"),
            )),
            Err(EngineError::NotFound { .. }) => Err(ApiError::not_found()),
            Err(other) => Err(other.into()),
        }
    }
}

/// `METHOD /route/{pattern}`, as recorded for a refused request.
fn route_of(parts: &Parts) -> String {
    let path = parts
        .extensions
        .get::<MatchedPath>()
        .map_or_else(|| parts.uri.path(), MatchedPath::as_str);
    format!("{} {path}", parts.method)
}

fn invalid() -> ApiError {
    ApiError::unauthorized("invalid_token", "the token is not valid")
}

/// The bearer secret of the `Authorization` header.
fn bearer(parts: &Parts) -> ApiResult<&str> {
    let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::missing_token());
    };
    let value = value.to_str().map_err(|_| invalid())?;
    if value.len() > warden::MAX_TOKEN_LEN {
        return Err(invalid());
    }
    let (scheme, secret) = value.split_once(' ').ok_or_else(invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(invalid());
    }
    Ok(secret.trim())
}

/// Authenticate a request: the caller its token names, checked active and
/// within its request rate by the engine.
async fn authenticate<S: Store>(parts: &Parts, state: &AppState<S>) -> ApiResult<Caller> {
    let secret = bearer(parts)?;
    match state
        .engine()
        .authenticate(secret, &route_of(parts))
        .await?
    {
        Authentication::Operator => Ok(Caller::Operator),
        Authentication::Agent(a) => Ok(Caller::Agent(a)),
        Authentication::Invalid => Err(invalid()),
        Authentication::TokenRevoked => Err(ApiError::unauthorized(
            "token_revoked",
            "the token was revoked",
        )),
        Authentication::AgentRevoked { .. } => Err(ApiError::forbidden(
            "agent_revoked",
            "the agent was revoked",
        )),
        Authentication::Throttled {
            requests_per_second: rps,
            retry_after_ms,
            tree,
            ..
        } => {
            let secs = retry_after_ms.div_ceil(1000).max(1);
            let message = match &tree {
                None => format!("over the quota of {rps} requests per second"),
                Some(t) => format!("over the quota of {rps} requests per second of `{t}`'s tree"),
            };
            let details = match tree {
                None => json!({"requests_per_second": rps, "retry_after_ms": retry_after_ms}),
                Some(t) => json!({
                    "requests_per_second": rps,
                    "retry_after_ms": retry_after_ms,
                    "tree": t,
                }),
            };
            Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                QUOTA_REQUESTS_PER_SECOND.as_str().to_owned(),
                message,
            )
            .with_details(details)
            .with_header(
                header::RETRY_AFTER,
                HeaderValue::from_str(&secs.to_string()).unwrap_or(HeaderValue::from_static("1")),
            ))
        }
    }
}

/// Record the route refusal and answer it 403 with its reason as the code.
async fn refuse<S: Store>(
    state: &AppState<S>,
    parts: &Parts,
    caller: &Caller,
    refusal: RouteRefusal,
) -> ApiError {
    if let Err(e) = state
        .engine()
        .refuse_route(caller, &route_of(parts), refusal)
        .await
    {
        return e.into();
    }
    match refusal {
        RouteRefusal::OperatorOnly => {
            ApiError::forbidden("operator_only", "this route needs the operator token")
        }
        RouteRefusal::AgentTokenRequired => ApiError::forbidden(
            "agent_token_required",
            "this route acts as an agent: use the agent's own token",
        ),
    }
}

/// The operator (an agent's token is refused 403 `operator_only`).
#[derive(Debug, Clone, Copy)]
pub struct OperatorCaller;

/// An agent, from its token (the operator's token is refused 403
/// `agent_token_required`).
#[derive(Debug, Clone)]
pub struct AgentCaller(pub AgentId);

/// The operator or an agent.
#[derive(Debug, Clone)]
pub struct AnyCaller(pub Caller);

impl<S: Store> FromRequestParts<AppState<S>> for AnyCaller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> ApiResult<Self> {
        authenticate(parts, state).await.map(AnyCaller)
    }
}

impl<S: Store> FromRequestParts<AppState<S>> for OperatorCaller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> ApiResult<Self> {
        match authenticate(parts, state).await? {
            Caller::Operator => Ok(OperatorCaller),
            agent => Err(refuse(state, parts, &agent, RouteRefusal::OperatorOnly).await),
        }
    }
}

impl<S: Store> FromRequestParts<AppState<S>> for AgentCaller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> ApiResult<Self> {
        match authenticate(parts, state).await? {
            Caller::Agent(a) => Ok(AgentCaller(a)),
            Caller::Operator => Err(refuse(
                state,
                parts,
                &Caller::Operator,
                RouteRefusal::AgentTokenRequired,
            )
            .await),
        }
    }
}
