//! The audit log.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_core::audit::AuditEntry;

use super::VerdictBody;

/// Query of `GET /v1/audit`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Entries after this sequence number (default 0).
    #[serde(default)]
    pub after: Option<u64>,
    /// Page size (default 100, at most the server's limit).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One audit entry.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AuditEntryBody {
    /// Sequence number, from 1.
    pub seq: u64,
    /// When (ms since the epoch).
    pub time: i64,
    /// The caller.
    pub subject: String,
    /// The operation.
    pub operation: String,
    /// The resource.
    pub resource: String,
    /// The verdict.
    pub verdict: VerdictBody,
    /// Reason code.
    pub reason: String,
    /// Policy version.
    pub policy_version: String,
    /// Extra evidence (never secret values).
    pub details: Value,
    /// The previous entry's hash.
    pub prev_hash: String,
    /// This entry's hash.
    pub hash: String,
}

impl From<&AuditEntry> for AuditEntryBody {
    fn from(e: &AuditEntry) -> Self {
        Self {
            seq: e.seq,
            time: e.draft.time.0,
            subject: e.draft.subject.clone(),
            operation: e.draft.operation.clone(),
            resource: e.draft.resource.clone(),
            verdict: e.draft.verdict.into(),
            reason: e.draft.reason.clone(),
            policy_version: e.draft.policy_version.clone(),
            details: e.draft.details.clone(),
            prev_hash: e.prev_hash.to_hex(),
            hash: e.hash.to_hex(),
        }
    }
}

/// A page of the audit log.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AuditPageResponse {
    /// Entries, ascending.
    pub entries: Vec<AuditEntryBody>,
    /// Pass as `after` for the next page; absent at the end.
    pub next_after: Option<u64>,
}

/// The answer of `GET /v1/audit/verify`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct VerifyResponse {
    /// Whether the whole chain verified and reaches the store's head.
    pub valid: bool,
    /// Entries verified.
    pub count: u64,
    /// Last verified sequence number.
    pub head_seq: u64,
    /// Last verified hash.
    pub head_hash: String,
    /// The first bad entry, when invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad_seq: Option<u64>,
    /// What is wrong, when invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}
