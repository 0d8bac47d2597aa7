//! Context envelopes, declassification, receipts and escalations.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_core::decision::Subject;
use warden_core::envelope::sign::Receipt;
use warden_core::envelope::{EnvelopeRecord, Sensitivity};
use warden_core::ids::{AgentId, CallId, Label, RunId, SessionId, StepId};
use warden_store::{EscalationRecord, EscalationStatus, EscalationTarget};

use super::DecisionBody;

/// A sensitivity level, lowest first.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum SensitivityBody {
    /// Anyone may see it.
    Public,
    /// Inside the organisation.
    Internal,
    /// Need to know.
    Confidential,
    /// Tightly controlled.
    Restricted,
    /// The top of the ladder.
    TopSecret,
}

impl From<Sensitivity> for SensitivityBody {
    fn from(s: Sensitivity) -> Self {
        match s {
            Sensitivity::Public => Self::Public,
            Sensitivity::Internal => Self::Internal,
            Sensitivity::Confidential => Self::Confidential,
            Sensitivity::Restricted => Self::Restricted,
            Sensitivity::TopSecret => Self::TopSecret,
        }
    }
}

impl From<SensitivityBody> for Sensitivity {
    fn from(s: SensitivityBody) -> Self {
        match s {
            SensitivityBody::Public => Self::Public,
            SensitivityBody::Internal => Self::Internal,
            SensitivityBody::Confidential => Self::Confidential,
            SensitivityBody::Restricted => Self::Restricted,
            SensitivityBody::TopSecret => Self::TopSecret,
        }
    }
}

/// `POST /v1/runs/{run}/declassify`: lower a run's envelope.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeclassifyRequest {
    /// The level to lower to (not above the current one, and not below what
    /// the labels left imply).
    pub to: SensitivityBody,
    /// Labels (observed or derived) to remove.
    #[serde(default)]
    pub remove_labels: Vec<Label>,
    /// Why: non-empty, at most 1024 bytes, no control characters. Recorded
    /// in the audit log.
    pub justification: String,
}

/// Query of `GET /v1/escalations`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EscalationQuery {
    /// Only escalations with this status (every one when absent).
    #[serde(default)]
    pub status: Option<EscalationStatusBody>,
}

/// `POST /v1/escalations/{id}/reject`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectEscalationRequest {
    /// Why: non-empty, at most 1024 bytes, no control characters.
    pub reason: String,
}

/// A run's context envelope: names, levels and ids, never data.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnvelopeResponse {
    /// The run.
    pub run_id: RunId,
    /// The envelope's id.
    pub envelope_id: String,
    /// The envelope it was delegated from (`null` for a root).
    pub parent_envelope_id: Option<String>,
    /// The agent it belongs to.
    pub agent_id: AgentId,
    /// Labels folded in from the run's results (empty when redacted on
    /// delegation).
    pub labels: Vec<Label>,
    /// Labels derived by aggregation rules (`customer-risk-profile`).
    pub derived: Vec<Label>,
    /// The aggregate sensitivity.
    pub sensitivity: SensitivityBody,
    /// Restrictions; they never shrink.
    pub restrictions: Vec<Label>,
    /// The version: up by one with every transition.
    pub version: u64,
    /// Delegation hops from the root envelope (0 for a root).
    pub delegation_depth: u32,
}

impl EnvelopeResponse {
    /// The wire form of `record`, the envelope of `run_id`.
    pub fn new(run_id: RunId, r: EnvelopeRecord) -> Self {
        Self {
            run_id,
            envelope_id: r.envelope_id.to_string(),
            parent_envelope_id: r.parent_envelope_id.map(|p| p.to_string()),
            agent_id: r.agent_id,
            labels: r.labels.into_iter().collect(),
            derived: r.derived.into_iter().collect(),
            sensitivity: r.aggregate_sensitivity.into(),
            restrictions: r.restrictions.into_iter().collect(),
            version: r.version,
            delegation_depth: r.delegation_depth,
        }
    }
}

/// The answer of `POST /v1/runs/{run}/declassify`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DeclassifyResponse {
    /// The decision (recorded).
    pub decision: DecisionBody,
    /// The envelope after the declassification.
    pub envelope: EnvelopeResponse,
}

/// The key that verifies exported envelopes.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnvelopeKeyResponse {
    /// The issuer id signed tokens and receipts name.
    pub issuer: String,
    /// The Ed25519 public key, 64 lowercase hex digits.
    pub public_key: String,
    /// Always `ed25519`.
    pub algorithm: String,
    /// `environment` (`WARDEN_ENVELOPE_SIGNING_KEY`), `stored` (in the
    /// database, shared by every server on it), `configured`, or `random`
    /// (this process only: a restart changes key and issuer).
    pub key_source: String,
    /// The stored key's generation (`stored` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Every key that verifies what this deployment signed, oldest first,
    /// the current one included (after a rotation the earlier keys stay
    /// here, so what they signed still verifies).
    pub verifying_keys: Vec<VerifyingKeyBody>,
}

/// One key that verifies exported envelopes.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct VerifyingKeyBody {
    /// Its issuer id.
    pub issuer: String,
    /// The Ed25519 public key, 64 lowercase hex digits.
    pub public_key: String,
    /// Its generation, for a stored key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

/// An opaque receipt for a run's envelope: no labels, no restrictions.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReceiptResponse {
    /// The opaque reference (64 hex digits).
    pub envelope_ref: String,
    /// The coarse sensitivity tier (a routing hint).
    pub sensitivity_tier: SensitivityBody,
    /// Who resolves the reference.
    pub issuer: String,
    /// Last instant (inclusive, ms since the epoch) the issuer keeps the
    /// reference resolvable.
    pub resolvable_until: i64,
}

impl From<Receipt> for ReceiptResponse {
    fn from(r: Receipt) -> Self {
        Self {
            envelope_ref: r.envelope_ref.as_str().to_owned(),
            sensitivity_tier: r.sensitivity_tier.into(),
            issuer: r.issuer.to_string(),
            resolvable_until: r.resolvable_until.0,
        }
    }
}

/// Where an escalation is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EscalationStatusBody {
    /// Waiting for a reviewer.
    Pending,
    /// Approved: the next identical request proceeds once.
    Approved,
    /// Rejected; final.
    Rejected,
    /// Approved and used; final.
    Consumed,
}

impl From<EscalationStatusBody> for EscalationStatus {
    fn from(s: EscalationStatusBody) -> Self {
        match s {
            EscalationStatusBody::Pending => Self::Pending,
            EscalationStatusBody::Approved => Self::Approved,
            EscalationStatusBody::Rejected => Self::Rejected,
            EscalationStatusBody::Consumed => Self::Consumed,
        }
    }
}

impl From<EscalationStatus> for EscalationStatusBody {
    fn from(s: EscalationStatus) -> Self {
        match s {
            EscalationStatus::Pending => Self::Pending,
            EscalationStatus::Approved => Self::Approved,
            EscalationStatus::Rejected => Self::Rejected,
            EscalationStatus::Consumed => Self::Consumed,
        }
    }
}

/// What an escalation holds up. `request_digest` (SHA-256 of the canonical
/// JSON of the escalation's `request`, hex) binds the approval to that
/// request; it is absent on escalations stored before requests were bound,
/// which cannot be approved.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EscalationTargetBody {
    /// One step of one run.
    Step {
        /// The run.
        run_id: RunId,
        /// The step.
        step_id: StepId,
        /// The digest of the request this escalation binds.
        #[serde(skip_serializing_if = "Option::is_none")]
        request_digest: Option<String>,
    },
    /// One call of one tool-call session.
    Call {
        /// The session.
        session_id: SessionId,
        /// The call.
        call_id: CallId,
        /// The digest of the request this escalation binds.
        #[serde(skip_serializing_if = "Option::is_none")]
        request_digest: Option<String>,
    },
    /// The registration of `child_id` under `parent_id`.
    Delegation {
        /// The delegating agent.
        parent_id: AgentId,
        /// The child's id.
        child_id: AgentId,
        /// The run the delegation inherits from.
        from_run: Option<RunId>,
        /// The digest of the request this escalation binds.
        #[serde(skip_serializing_if = "Option::is_none")]
        request_digest: Option<String>,
    },
}

/// A request held for review, with the request itself: what an approval
/// lets through, exactly (nothing else matches it).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EscalationBody {
    /// Its id.
    pub escalation_id: String,
    /// Its status.
    pub status: EscalationStatusBody,
    /// What it holds up.
    pub target: EscalationTargetBody,
    /// Who made the request (`operator` or an agent id).
    pub requested_by: String,
    /// The operation (`step.begin`, `agent.register`).
    pub operation: String,
    /// The resource.
    pub resource: String,
    /// Why it escalated (`aggregation_backstop`, `sensitivity_floor`).
    pub reason: String,
    /// The envelope the decision was made against.
    pub envelope_id: Option<String>,
    /// That envelope's version.
    pub envelope_version: Option<u64>,
    /// The envelope's sensitivity.
    pub classification: SensitivityBody,
    /// Obligations that bind the request if it is approved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub obligations: Vec<Value>,
    /// The request an approval lets through once, every field of it: a
    /// delegation's child, parent, capabilities, tools, config, source,
    /// zone, restrictions and redaction; a step's run, step, action and
    /// arguments; a call's action and arguments. `null` on escalations
    /// stored before requests were bound.
    pub request: Option<Value>,
    /// When it was created (ms since the epoch).
    pub created_at: i64,
    /// Who approved or rejected it.
    pub resolved_by: Option<String>,
    /// When (ms since the epoch).
    pub resolved_at: Option<i64>,
    /// Why it was rejected.
    pub rejection_reason: Option<String>,
    /// When the approval was used (ms since the epoch).
    pub consumed_at: Option<i64>,
}

impl From<EscalationRecord> for EscalationBody {
    fn from(e: EscalationRecord) -> Self {
        Self {
            escalation_id: e.escalation_id,
            status: e.status.into(),
            target: match e.target {
                EscalationTarget::Step {
                    run_id,
                    step_id,
                    request_digest,
                } => EscalationTargetBody::Step {
                    run_id,
                    step_id,
                    request_digest: request_digest.map(|d| d.to_hex()),
                },
                EscalationTarget::Call {
                    session_id,
                    call_id,
                    request_digest,
                } => EscalationTargetBody::Call {
                    session_id,
                    call_id,
                    request_digest: request_digest.map(|d| d.to_hex()),
                },
                EscalationTarget::Delegation {
                    parent,
                    child,
                    from_run,
                    request_digest,
                } => EscalationTargetBody::Delegation {
                    parent_id: parent,
                    child_id: child,
                    from_run,
                    request_digest: request_digest.map(|d| d.to_hex()),
                },
            },
            requested_by: e.requested_by.to_string(),
            operation: e.operation,
            resource: e.resource,
            reason: e.reason.to_string(),
            envelope_id: e.envelope_id.map(|i| i.to_string()),
            envelope_version: e.envelope_version,
            classification: e.classification.into(),
            obligations: e
                .obligations
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
            request: e.request,
            created_at: e.created_at.0,
            resolved_by: e.resolved_by.as_ref().map(Subject::to_string),
            resolved_at: e.resolved_at.map(|t| t.0),
            rejection_reason: e.rejection_reason,
            consumed_at: e.consumed_at.map(|t| t.0),
        }
    }
}

/// Escalations, oldest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EscalationListResponse {
    /// The escalations.
    pub escalations: Vec<EscalationBody>,
}

/// The answer of an approval or rejection.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReviewResponse {
    /// The decision (recorded): `escalation_approved` or
    /// `escalation_rejected`.
    pub decision: DecisionBody,
    /// The escalation after the review.
    pub escalation: EscalationBody,
}
