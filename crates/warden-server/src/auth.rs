//! Identity: bearer tokens bound to the operator or to one agent.
//!
//! A token is `wdn_` followed by 64 hex digits: 256 bits from the operating
//! system's random source. Only its SHA-256 is stored (`TokenRecord.hash`),
//! under a public `token_id` (`tok_` + 16 hex digits) that names it for
//! revocation. A request's token is hashed, looked up by hash **on every
//! request** (so a revocation made by any process sharing the store takes
//! effect on the next request), and the stored hash is compared with the
//! computed one in constant time.
//!
//! A token whose agent the engine's cached hierarchy does not know yet
//! (another server sharing the database registered it moments ago) makes
//! the engine reload its agents from the store once
//! (`Engine::refresh_agent`), so an agent can act on any server as soon as
//! its registration and token are committed.
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
//! - an agent over its `requests_per_second`: 429
//!   `quota_requests_per_second` (recorded).
//!
//! 401s are not recorded: there is no subject to record, and recording them
//! would let anyone grow the log.

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use serde_json::json;
use subtle::ConstantTimeEq;
use warden::Caller;
use warden_core::audit::{AuditDraft, Digest};
use warden_core::decision::Verdict;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::AgentId;
use warden_store::{Store, StoreError, TokenRecord, TokenSubject};

use crate::error::{ApiError, ApiResult};
use crate::quota::QUOTA_REQUESTS_PER_SECOND;
use crate::state::AppState;

/// Every token starts with this.
pub const TOKEN_PREFIX: &str = "wdn_";
/// The `token_id` of the operator token generated on first start.
pub const GENERATED_OPERATOR_TOKEN_ID: &str = "operator";
/// Longest `Authorization` value looked at.
const MAX_TOKEN_LEN: usize = 512;
/// Shortest operator token accepted from the environment.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 32;

/// Operation recorded for authentication denials.
pub const OP_AUTH: &str = "auth.request";
/// Operation recorded for token issuance.
pub const OP_TOKEN_ISSUE: &str = "token.issue";
/// Operation recorded for token revocation.
pub const OP_TOKEN_REVOKE: &str = "token.revoke";

/// A freshly issued token: the secret is shown once, never stored.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// Public id, for revocation.
    pub token_id: String,
    /// The bearer secret.
    pub secret: String,
}

fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| ApiError::internal(&e))?;
    Ok(hex::encode(buf))
}

/// A new random token (256 bits) and token id.
pub fn new_token() -> Result<IssuedToken, ApiError> {
    Ok(IssuedToken {
        token_id: format!("tok_{}", random_hex(8)?),
        secret: format!("{TOKEN_PREFIX}{}", random_hex(32)?),
    })
}

/// The stored form of a token: SHA-256 of its bytes.
pub fn hash_token(secret: &str) -> Digest {
    Digest::of(secret.as_bytes())
}

impl<S: Store> AppState<S> {
    /// Append one decision made by the server itself (authentication,
    /// quotas, visibility of agents) to the audit log.
    pub(crate) async fn record(
        &self,
        subject: &Caller,
        operation: &str,
        resource: String,
        verdict: Verdict,
        reason: &str,
        details: serde_json::Value,
    ) -> ApiResult<()> {
        let engine = self.engine();
        let draft = AuditDraft {
            time: engine.now(),
            subject: subject.to_string(),
            operation: operation.to_owned(),
            resource,
            verdict,
            reason: reason.to_owned(),
            policy_version: engine.policy().version.clone(),
            details,
        };
        engine.store().append_audit(vec![draft]).await?;
        Ok(())
    }

    /// Record a deny decision and build the matching error.
    pub(crate) async fn deny(
        &self,
        subject: &Caller,
        operation: &str,
        resource: String,
        reason: &str,
        error: ApiError,
    ) -> ApiError {
        match self
            .record(
                subject,
                operation,
                resource,
                Verdict::Deny,
                reason,
                serde_json::Value::Null,
            )
            .await
        {
            Ok(()) => error,
            Err(e) => e,
        }
    }

    /// Issue a token for `subject`, recorded as issued by `issuer`.
    pub async fn issue_token(
        &self,
        subject: TokenSubject,
        issuer: &Caller,
    ) -> ApiResult<IssuedToken> {
        let token = new_token()?;
        self.insert_token(&token, subject, issuer).await?;
        Ok(token)
    }

    async fn insert_token(
        &self,
        token: &IssuedToken,
        subject: TokenSubject,
        issuer: &Caller,
    ) -> Result<(), StoreError> {
        let engine = self.engine();
        let now = engine.now();
        let resource = match &subject {
            TokenSubject::Operator => Caller::OPERATOR.to_owned(),
            TokenSubject::Agent(a) => a.to_string(),
        };
        let draft = AuditDraft {
            time: now,
            subject: issuer.to_string(),
            operation: OP_TOKEN_ISSUE.to_owned(),
            resource,
            verdict: Verdict::Allow,
            reason: "token_issued".to_owned(),
            policy_version: engine.policy().version.clone(),
            details: json!({"token_id": token.token_id}),
        };
        let record = TokenRecord {
            token_id: token.token_id.clone(),
            hash: hash_token(&token.secret),
            subject,
            created_at: now,
            revoked: false,
        };
        engine.store().insert_token(record, vec![draft]).await
    }

    /// Revoke a token by id; `false` if there is no active token with it.
    pub async fn revoke_token(&self, token_id: &str, by: &Caller) -> ApiResult<bool> {
        let engine = self.engine();
        let draft = AuditDraft {
            time: engine.now(),
            subject: by.to_string(),
            operation: OP_TOKEN_REVOKE.to_owned(),
            resource: token_id.to_owned(),
            verdict: Verdict::Allow,
            reason: "token_revoked".to_owned(),
            policy_version: engine.policy().version.clone(),
            details: serde_json::Value::Null,
        };
        Ok(engine
            .store()
            .revoke_token(token_id.to_owned(), vec![draft])
            .await?)
    }
}

/// Where the operator token came from at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorTokenSource {
    /// `WARDEN_OPERATOR_TOKEN` (stored hashed if it was not yet).
    Environment,
    /// Generated now, on the first start with this database: shown once.
    Generated(String),
    /// Generated on an earlier start; only its hash is stored.
    Existing,
}

/// Why the operator token could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OperatorTokenError {
    /// The environment's token is too short.
    #[error(
        "`WARDEN_OPERATOR_TOKEN` is {0} characters long; use at least {MIN_OPERATOR_TOKEN_LEN} random characters"
    )]
    TooShort(usize),
    /// The environment's token has characters that cannot go in a header.
    #[error("`WARDEN_OPERATOR_TOKEN` must be printable ASCII without spaces")]
    BadCharacters,
    /// The environment's token was revoked in this database.
    #[error("`WARDEN_OPERATOR_TOKEN` was revoked in this database; choose a new one")]
    Revoked,
    /// The environment's token belongs to an agent.
    #[error("`WARDEN_OPERATOR_TOKEN` is an agent's token in this database")]
    NotOperator,
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Randomness failed.
    #[error("could not generate a token: {0}")]
    Random(String),
}

/// Make sure an operator token exists: the one from the environment if
/// given (stored hashed on first use), else the one generated on an earlier
/// start, else a new one (returned so the caller can print it once).
pub async fn ensure_operator_token<S: Store>(
    state: &AppState<S>,
    from_env: Option<&str>,
) -> Result<OperatorTokenSource, OperatorTokenError> {
    if let Some(secret) = from_env {
        if secret.len() < MIN_OPERATOR_TOKEN_LEN {
            return Err(OperatorTokenError::TooShort(secret.len()));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) || secret.len() > MAX_TOKEN_LEN {
            return Err(OperatorTokenError::BadCharacters);
        }
        let hash = hash_token(secret);
        match state.engine().store().find_token(hash).await? {
            Some(t) if t.subject != TokenSubject::Operator => {
                return Err(OperatorTokenError::NotOperator);
            }
            Some(t) if t.revoked => return Err(OperatorTokenError::Revoked),
            Some(_) => {}
            None => {
                let token = IssuedToken {
                    token_id: format!("operator-env-{}", hash.to_hex().get(..12).unwrap_or("")),
                    secret: secret.to_owned(),
                };
                match state
                    .insert_token(&token, TokenSubject::Operator, &Caller::Operator)
                    .await
                {
                    Ok(()) => {}
                    // Another server sharing the database, starting at the
                    // same time with the same token, stored it first.
                    Err(StoreError::Duplicate { .. }) => {
                        match state.engine().store().find_token(hash).await? {
                            Some(t) if t.subject != TokenSubject::Operator => {
                                return Err(OperatorTokenError::NotOperator);
                            }
                            Some(t) if t.revoked => return Err(OperatorTokenError::Revoked),
                            Some(_) => {}
                            None => {
                                return Err(StoreError::duplicate(
                                    warden_store::Entity::Token,
                                    token.token_id,
                                )
                                .into());
                            }
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        return Ok(OperatorTokenSource::Environment);
    }
    let mut token = new_token().map_err(|e| OperatorTokenError::Random(e.message))?;
    token.token_id = GENERATED_OPERATOR_TOKEN_ID.to_owned();
    match state
        .insert_token(&token, TokenSubject::Operator, &Caller::Operator)
        .await
    {
        Ok(()) => Ok(OperatorTokenSource::Generated(token.secret)),
        // The fixed id is taken: an operator token was generated before.
        Err(StoreError::Duplicate { .. }) => Ok(OperatorTokenSource::Existing),
        Err(e) => Err(e.into()),
    }
}

fn route_of(parts: &Parts) -> String {
    let path = parts
        .extensions
        .get::<MatchedPath>()
        .map_or_else(|| parts.uri.path(), MatchedPath::as_str);
    let mut s = format!("{} {path}", parts.method);
    if s.len() > 256 {
        let mut end = 256;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Authenticate a request: the caller its token names, checked active and
/// within its request rate.
async fn authenticate<S: Store>(parts: &Parts, state: &AppState<S>) -> ApiResult<Caller> {
    let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::missing_token());
    };
    let invalid = || ApiError::unauthorized("invalid_token", "the token is not valid");
    let value = value.to_str().map_err(|_| invalid())?;
    if value.len() > MAX_TOKEN_LEN {
        return Err(invalid());
    }
    let (scheme, secret) = value.split_once(' ').ok_or_else(invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(invalid());
    }
    let secret = secret.trim();
    if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid());
    }
    let hash = hash_token(secret);
    let record = state
        .engine()
        .store()
        .find_token(hash)
        .await?
        .ok_or_else(invalid)?;
    if !bool::from(record.hash.0.ct_eq(&hash.0)) {
        return Err(invalid());
    }
    if record.revoked {
        return Err(ApiError::unauthorized(
            "token_revoked",
            "the token was revoked",
        ));
    }
    let agent = match record.subject {
        TokenSubject::Operator => return Ok(Caller::Operator),
        TokenSubject::Agent(a) => a,
    };
    let caller = Caller::Agent(agent.clone());
    // A valid token of an agent this node's cache does not know yet was
    // issued for an agent another node registered moments ago: look it up
    // in the store (agents are never deleted, so this happens once per
    // agent and node) rather than refuse it.
    let engine = state.engine();
    if engine.agent(&agent).is_err() && !engine.refresh_agent(&agent).await? {
        return Err(invalid());
    }
    let status = engine.agent(&agent).map_err(|_| invalid())?.status;
    if status == AgentStatus::Revoked {
        return Err(state
            .deny(
                &caller,
                OP_AUTH,
                route_of(parts),
                "agent_revoked",
                ApiError::forbidden("agent_revoked", "the agent was revoked"),
            )
            .await);
    }
    if let Some(rps) = state
        .engine()
        .policy()
        .quota_for(&agent)
        .and_then(|q| q.requests_per_second)
        && let Err(retry_ms) = state
            .shared
            .quotas
            .take_request(&agent, rps, state.now_ms())
    {
        let secs = retry_ms.div_ceil(1000).max(1);
        let err = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            QUOTA_REQUESTS_PER_SECOND,
            format!("over the quota of {rps} requests per second"),
        )
        .with_details(json!({"requests_per_second": rps, "retry_after_ms": retry_ms}))
        .with_header(
            header::RETRY_AFTER,
            HeaderValue::from_str(&secs.to_string()).unwrap_or(HeaderValue::from_static("1")),
        );
        return Err(state
            .deny(
                &caller,
                OP_AUTH,
                route_of(parts),
                QUOTA_REQUESTS_PER_SECOND,
                err,
            )
            .await);
    }
    Ok(caller)
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
            agent => Err(state
                .deny(
                    &agent,
                    OP_AUTH,
                    route_of(parts),
                    "operator_only",
                    ApiError::forbidden("operator_only", "this route needs the operator token"),
                )
                .await),
        }
    }
}

impl<S: Store> FromRequestParts<AppState<S>> for AgentCaller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> ApiResult<Self> {
        match authenticate(parts, state).await? {
            Caller::Agent(a) => Ok(AgentCaller(a)),
            Caller::Operator => Err(state
                .deny(
                    &Caller::Operator,
                    OP_AUTH,
                    route_of(parts),
                    "agent_token_required",
                    ApiError::forbidden(
                        "agent_token_required",
                        "this route acts as an agent: use the agent's own token",
                    ),
                )
                .await),
        }
    }
}
