//! The one error shape of the API and the mapping from engine errors to it.
//!
//! Every error is answered as
//! `{"error": {"code": "<stable_snake_case>", "message": "...", "details": {...}}}`
//! with one of these statuses:
//!
//! | status | meaning |
//! | --- | --- |
//! | 400 | the request cannot be read: not JSON, not UTF-8, duplicate keys, nested too deep, a malformed path segment or query |
//! | 401 | no token, or a token that is unknown or revoked |
//! | 403 | the caller is known and the request is denied (the decision is in the audit log) |
//! | 404 | no such route, or nothing the caller may see (missing and not-visible answer alike) |
//! | 405 | the route exists, the method does not |
//! | 409 | a revision conflict, a duplicate, a reused run id |
//! | 413 | the body or a value in it is too large |
//! | 415 | a body that says it is not JSON |
//! | 422 | readable JSON that is invalid for the route (unknown field, wrong type, bad SOP, ...) |
//! | 429 | a quota is exhausted (the denial is in the audit log) |
//! | 500 | an internal failure: logged with its cause, answered without it |
//! | 503 | the request took longer than the server's timeout (`timeout`), or storage cannot serve it now (`unavailable`, with `details.reason`) |
//!
//! Messages are one line, lowercase, without a final period; user input in
//! them is cut to a bounded length so an error never echoes a large body.

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use warden::{ConflictKind, EngineError, Problem, RegistrationRefusal};
use warden_core::hierarchy::HierarchyError;
use warden_core::lockdown::LockdownError;
use warden_store::{StoreError, Unavailability};

/// Longest message sent back, in bytes.
const MAX_MESSAGE: usize = 512;

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable snake_case code.
    pub code: Cow<'static, str>,
    /// One-line human message.
    pub message: String,
    /// Structured details (an object, possibly empty).
    pub details: Value,
    /// Extra response headers (e.g. `Retry-After`).
    headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl ApiError {
    /// An error with an empty `details` object.
    pub fn new(
        status: StatusCode,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: truncate(message.into()),
            details: json!({}),
            headers: Vec::new(),
        }
    }

    /// Attach details (merged into the details object).
    pub fn with_details(mut self, details: Value) -> Self {
        match (&mut self.details, details) {
            (Value::Object(existing), Value::Object(more)) => existing.extend(more),
            (slot, more) => *slot = more,
        }
        self
    }

    /// Attach a response header.
    pub fn with_header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 422 with `code`.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 403 with `code`.
    pub fn forbidden(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    /// The one 404 answer: the same for a missing thing and a thing the
    /// caller may not see, so nothing can be learnt by probing.
    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "nothing found here for this caller",
        )
    }

    /// 401 `missing_token`.
    pub fn missing_token() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "this route needs `Authorization: Bearer <token>`",
        )
        .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
    }

    /// 401 with `code` (`invalid_token`, `token_revoked`).
    pub fn unauthorized(code: &'static str, message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message).with_header(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer error=\"invalid_token\""),
        )
    }

    /// A 503 `unavailable`: storage cannot be reached or take writes now,
    /// for `reason`. The message says the reason in words (`storage is
    /// unavailable: disk full; retry later`) and `details.reason` names it
    /// ([`Unavailability::as_str`]: `disk_full`, `read_only`, `busy`,
    /// `connection_lost`, `out_of_resources`, `shutting_down`, `io_error`,
    /// `other`); the backend's own words (which may name paths or driver
    /// internals) are logged and not sent.
    pub fn unavailable(reason: Unavailability, cause: &dyn std::fmt::Display) -> Self {
        tracing::warn!(error = %cause, reason = reason.as_str(), "storage unavailable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("storage is unavailable: {reason}; retry later"),
        )
        .with_details(json!({ "reason": reason.as_str() }))
    }

    /// A 500 whose cause is logged and not sent.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the server log has the cause",
        )
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    // One line.
    if s.contains(['\n', '\r']) {
        s = s.replace(['\n', '\r'], " ");
    }
    s
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {"code": self.code, "message": self.message, "details": self.details}
        });
        let mut response = (self.status, json_bytes(&body)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        EngineError::from(e).into()
    }
}

/// The response for a refused registration (its decision was recorded).
pub fn registration_refused(
    decision: &warden_core::decision::Decision,
    refusal: &RegistrationRefusal,
) -> ApiError {
    match refusal {
        RegistrationRefusal::Hierarchy(h) => hierarchy_error(h),
        RegistrationRefusal::Lockdown(l) => lockdown_error(l),
        RegistrationRefusal::Envelope(env) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            env.reason().kind().to_owned(),
            env.to_string(),
        ),
        RegistrationRefusal::NotOwnChild
        | RegistrationRefusal::CallerRevoked
        | RegistrationRefusal::Context => ApiError::forbidden(
            decision.reason.kind().to_owned(),
            format!("denied: {}", decision.reason),
        )
        .with_details(json!({"reason": decision.reason.as_str()})),
    }
}

/// The response for a hierarchy refusal.
pub fn hierarchy_error(e: &HierarchyError) -> ApiError {
    let msg = e.to_string();
    match e {
        HierarchyError::DuplicateAgent(_) => {
            ApiError::new(StatusCode::CONFLICT, "duplicate_agent", msg)
        }
        HierarchyError::UnknownParent { .. } => ApiError::invalid("unknown_parent", msg),
        HierarchyError::ParentRevoked { .. } => ApiError::invalid("parent_revoked", msg),
        HierarchyError::TooDeep { .. } => ApiError::invalid("depth_exceeded", msg),
        HierarchyError::Cycle(_) => ApiError::invalid("hierarchy_cycle", msg),
        HierarchyError::UnknownAgent(_) => ApiError::not_found(),
        HierarchyError::Full => ApiError::new(StatusCode::CONFLICT, "hierarchy_full", msg),
    }
}

/// The response for a lockdown refusal: 403 when the policy refuses what
/// was asked for, 422 when the config itself is malformed.
pub fn lockdown_error(e: &LockdownError) -> ApiError {
    let code = e.reason().to_string();
    let status = match e {
        LockdownError::WriteSurfaceTool { .. } | LockdownError::SelfEditRequested { .. } => {
            StatusCode::FORBIDDEN
        }
        LockdownError::SelfEditFlagNotBoolean { .. } | LockdownError::ConfigNotObject { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
    };
    ApiError::new(status, code, e.to_string())
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Input {
                field,
                problem: Problem::TooLong { max },
            } => ApiError::invalid(
                "limit_exceeded",
                format!("`{field}` is longer than {max} bytes"),
            )
            .with_details(json!({"field": field, "max": max})),
            EngineError::Input { field, problem } => {
                ApiError::invalid("invalid_value", format!("`{field}` {problem}"))
                    .with_details(json!({"field": field}))
            }
            EngineError::Sop(s) => sop_error(&s),
            EngineError::Plan(warden_core::plan::PlanError::Sop(s)) => sop_error(&s),
            EngineError::Plan(p) => ApiError::invalid("invalid_plan", p.to_string())
                .with_details(json!({"field": p.field(), "reason": p.code()})),
            EngineError::Envelope(env) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                env.reason().kind().to_owned(),
                env.to_string(),
            ),
            EngineError::NotFound { .. } => ApiError::not_found(),
            EngineError::Conflict {
                kind: ConflictKind::RunId,
                id,
            } => ApiError::new(
                StatusCode::CONFLICT,
                "run_id_conflict",
                format!("run `{id}` already exists with a different sop"),
            ),
            EngineError::Conflict {
                kind: ConflictKind::EnvelopeContention,
                id,
            } => ApiError::new(
                StatusCode::CONFLICT,
                "envelope_contention",
                format!("envelope `{id}` kept changing concurrently; retry"),
            ),
            EngineError::Conflict {
                kind: ConflictKind::Duplicate,
                ..
            } => ApiError::new(StatusCode::CONFLICT, "duplicate", "that already exists"),
            EngineError::Conflict { kind, id } => {
                let code = match kind {
                    ConflictKind::SessionId => "session_conflict",
                    ConflictKind::CallId => "call_conflict",
                    ConflictKind::CallNotAllowed => "call_not_allowed",
                    ConflictKind::CallResult => "call_result_conflict",
                    ConflictKind::StepInProgress => "step_lease_held",
                    _ => "session_contention",
                };
                let message = EngineError::Conflict { kind, id }.to_string();
                ApiError::new(StatusCode::CONFLICT, code, message)
            }
            EngineError::Unavailable(cause) => ApiError::unavailable(
                cause.unavailability().unwrap_or(Unavailability::Other),
                &cause,
            ),
            other @ (EngineError::MissingHandlers(_) | EngineError::Internal(_)) => {
                ApiError::internal(&other)
            }
        }
    }
}

/// Serialise a response value (never fails for `Value`).
pub(crate) fn json_bytes(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec())
}

/// The response for an SOP that could not be parsed: 422 `invalid_sop`, with
/// the parser's own code and the field path.
pub fn sop_error(e: &warden_core::sop::SopError) -> ApiError {
    ApiError::invalid("invalid_sop", format!("invalid sop: {e}")).with_details(json!({
        "field": e.field(),
        "reason": e.code(),
    }))
}

/// Shorthand for handler results.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_storage_is_503_with_its_reason_and_no_internals() {
        let cases = [
            (
                StoreError::unavailable_because(
                    Unavailability::DiskFull,
                    "cannot write `/var/lib/warden/warden.db`: disk full",
                ),
                "disk_full",
                "storage is unavailable: disk full; retry later",
            ),
            (
                StoreError::read_only("cannot write `/srv/w.db`: read-only file system"),
                "read_only",
                "storage is unavailable: the database is read-only; retry later",
            ),
            (
                StoreError::unavailable_because(Unavailability::Busy, "database is locked"),
                "busy",
                "storage is unavailable: the database is busy (locked by another writer); retry later",
            ),
            (
                StoreError::unavailable("pool timed out"),
                "other",
                "storage is unavailable: the database cannot be used right now; retry later",
            ),
        ];
        for (store, reason, message) in cases {
            let e = ApiError::from(store);
            assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(e.code, "unavailable");
            assert_eq!(e.message, message);
            assert_eq!(e.details, json!({ "reason": reason }));
            for leak in ["/", "database is locked", "timed out", "file system"] {
                assert!(!e.message.contains(leak), "{leak} in {}", e.message);
            }
        }
        // Every reason has its own stable name in the body.
        for reason in Unavailability::ALL {
            let e = ApiError::unavailable(reason, &"x");
            assert_eq!(e.details["reason"], reason.as_str());
            assert!(e.message.starts_with("storage is unavailable: "));
        }
    }

    #[test]
    fn other_store_errors_are_not_503() {
        let e = ApiError::from(StoreError::backend("boom at /x"));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.message.contains("/x"));
    }
}
