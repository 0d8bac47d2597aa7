//! Shared by every area: the reply wrapper, the error shape, decisions and health.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_core::decision::{Decision, SmolStr, Verdict};

/// A JSON response with a status.
#[derive(Debug)]
pub struct Reply<T>(pub StatusCode, pub T);

impl<T: Serialize> IntoResponse for Reply<T> {
    fn into_response(self) -> Response {
        let bytes = crate::error::json_bytes(&self.1);
        (
            self.0,
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response()
    }
}

/// The error shape of every non-2xx answer.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

/// The error itself.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorBody {
    /// Stable snake_case code.
    pub code: String,
    /// One-line message.
    pub message: String,
    /// Structured details.
    pub details: Value,
}

/// A verdict.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VerdictBody {
    /// May proceed.
    Allow,
    /// May proceed; obligations bind later steps.
    Constrain,
    /// Must not proceed.
    Deny,
    /// A human must review it.
    Escalate,
}

impl From<Verdict> for VerdictBody {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Allow => Self::Allow,
            Verdict::Constrain => Self::Constrain,
            Verdict::Deny => Self::Deny,
            Verdict::Escalate => Self::Escalate,
        }
    }
}

/// A decision as recorded.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DecisionBody {
    /// The verdict.
    pub verdict: VerdictBody,
    /// Stable reason code.
    pub reason: String,
    /// The caller (from the token).
    pub subject: String,
    /// The operation.
    pub operation: SmolStr,
    /// The resource.
    pub resource: SmolStr,
    /// Policy version.
    pub policy_version: SmolStr,
    /// Obligations of a `constrain` verdict.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub obligations: Vec<Value>,
    /// When (ms since the epoch).
    pub time: i64,
}

impl From<&Decision> for DecisionBody {
    fn from(d: &Decision) -> Self {
        Self {
            verdict: d.verdict.into(),
            reason: d.reason.to_string(),
            subject: d.subject.to_string(),
            operation: d.operation.clone(),
            resource: d.resource.clone(),
            policy_version: d.policy_version.clone(),
            obligations: d
                .obligations
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
            time: d.time.0,
        }
    }
}

/// The answer of `GET /healthz`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HealthResponse {
    /// Always `ok`.
    pub status: String,
    /// The policy in force.
    pub policy_version: String,
}
