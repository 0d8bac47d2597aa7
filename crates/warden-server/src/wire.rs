//! Wire types: the JSON the API reads and writes, separate from the domain
//! types, with explicit conversions.
//!
//! Request structs refuse unknown fields. None of them has a field that
//! names the acting agent: identity comes from the bearer token only. The
//! fields that name an agent (`parent_id`, `owner_agent_id`) name a
//! *target*, and the engine checks it against the caller.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use warden::{AgentView, ResolvedValue};
use warden_core::audit::AuditEntry;
use warden_core::bundle::ClassName;
use warden_core::decision::{Decision, Subject, Verdict};
use warden_core::envelope::sign::Receipt;
use warden_core::envelope::{EnvelopeRecord, Sensitivity, TrustZone};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::memory::{Combinator, MemoryRecord, Visibility};
use warden_core::preflight::{Preflight, StepCheck};
use warden_store::{EscalationRecord, EscalationStatus, EscalationTarget, StepOutcome, StepStatus};

/// A JSON response with a status.
#[derive(Debug)]
pub struct Reply<T>(pub StatusCode, pub T);

impl<T: Serialize> IntoResponse for Reply<T> {
    fn into_response(self) -> Response {
        let bytes = crate::body::json_bytes(&self.1);
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

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// `POST /v1/agents`: register an agent (operator).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterAgentRequest {
    /// The new agent's id (`self` is reserved).
    pub agent_id: AgentId,
    /// Its parent; absent for a root agent.
    #[serde(default)]
    pub parent_id: Option<AgentId>,
    /// Declared capabilities (action names from the catalogue).
    #[serde(default)]
    pub capabilities: Vec<ActionName>,
    /// The framework config of the agent (a JSON object). For a child built
    /// from this spec, a self-edit flag is cleared (delegation lockdown).
    #[serde(default)]
    pub config: Option<Value>,
    /// Tools a pre-built child carries; a prompt-block write tool is refused.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
}

/// `POST /v1/agents/self/children`: register a child of the calling agent.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegateRequest {
    /// The child's id.
    pub agent_id: AgentId,
    /// Optional; if given it must be the caller (anything else is denied
    /// `not_own_child` and recorded).
    #[serde(default)]
    pub parent_id: Option<AgentId>,
    /// Requested capabilities; the child's effective set is within the
    /// caller's whatever is asked.
    #[serde(default)]
    pub capabilities: Vec<ActionName>,
    /// The child's framework config.
    #[serde(default)]
    pub config: Option<Value>,
    /// Tools of a pre-built child.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Inherit the context envelope of this run (one of the caller's own
    /// runs; another agent's run answers 404). Without it, the child
    /// inherits the caller's own inherited envelope, if it holds one.
    #[serde(default)]
    pub from_run: Option<RunId>,
    /// Restrictions the child gets on top of the inherited ones (names from
    /// the bundle's `context.restrictions`, or built-in ones).
    #[serde(default)]
    pub restrictions: Vec<Label>,
    /// Where the child runs: `internal` (default, inside this deployment) or
    /// `external` (across a trust boundary).
    #[serde(default)]
    pub zone: Option<TrustZoneBody>,
    /// Pass the sensitivity and restrictions but not the labels.
    #[serde(default)]
    pub redact_labels: bool,
}

/// The trust zone of a delegated child.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TrustZoneBody {
    /// Inside this Warden deployment: its envelope is enforced here.
    Internal,
    /// Across a trust boundary: its envelope travels as a signed token.
    External,
}

impl From<TrustZoneBody> for TrustZone {
    fn from(z: TrustZoneBody) -> Self {
        match z {
            TrustZoneBody::Internal => TrustZone::Internal,
            TrustZoneBody::External => TrustZone::External,
        }
    }
}

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

/// `PUT /v1/memory/{namespace}/{key}`: write a record in the caller's scope.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutMemoryRequest {
    /// The value (any JSON).
    pub value: Value,
    /// Compare-and-set: `0` = create only, `n` = only at revision `n`.
    #[serde(default)]
    pub expected_revision: Option<u64>,
    /// Visibility (kept on update when absent; private on create).
    #[serde(default)]
    pub visibility: Option<Visibility>,
    /// Record class (kept on update when absent; preference on create).
    #[serde(default)]
    pub class: Option<ClassName>,
    /// Combinator, for class `policy` (required there).
    #[serde(default)]
    pub combine: Option<Combinator>,
    /// Grantees, for class `secret`.
    #[serde(default)]
    pub grants: Option<Vec<AgentId>>,
    /// Expiry (ms since the epoch), for class `task`.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// The owner scope; defaults to the caller. Any other owner is denied
    /// `actor_is_not_owner` and recorded.
    #[serde(default)]
    pub owner_agent_id: Option<AgentId>,
}

/// Query of `DELETE /v1/memory/{namespace}/{key}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteMemoryQuery {
    /// Delete only at this revision.
    #[serde(default)]
    pub expected_revision: Option<u64>,
}

/// `POST /v1/sops/validate`: preflight an SOP.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateSopRequest {
    /// The SOP: `{sop_id, version, steps: [{step_id, action, arguments}]}`,
    /// parsed strictly.
    pub sop: Value,
}

/// `POST /v1/runs`: admit an SOP as a run.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmitRunRequest {
    /// The SOP.
    pub sop: Value,
    /// Idempotency key: the same id with the same SOP returns the same run.
    #[serde(default)]
    pub run_id: Option<RunId>,
}

/// `POST /v1/runs/{run}/steps/{step}/complete`: a step's outcome.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteStepRequest {
    /// The result value.
    #[serde(default)]
    pub result: Option<Value>,
    /// Labels the result carries.
    #[serde(default)]
    pub result_labels: Vec<Label>,
    /// An error message: the step failed and the run stops.
    #[serde(default)]
    pub error: Option<String>,
}

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

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

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

/// A registered agent and its one-time token.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentCreatedResponse {
    /// The agent.
    pub agent_id: AgentId,
    /// Its parent.
    pub parent_id: Option<AgentId>,
    /// The bearer token: shown once, only its hash is stored.
    pub token: String,
    /// The token's public id (for revocation).
    pub token_id: String,
    /// Effective capabilities.
    pub effective_capabilities: Vec<ActionName>,
}

/// A token issued for an existing agent.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TokenIssuedResponse {
    /// The agent.
    pub agent_id: AgentId,
    /// The token's public id.
    pub token_id: String,
    /// The bearer token: shown once.
    pub token: String,
}

/// Active or revoked.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatusBody {
    /// May act.
    Active,
    /// Revoked with its descendants.
    Revoked,
}

/// An agent, its lineage and capabilities.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentResponse {
    /// Its id.
    pub agent_id: AgentId,
    /// Its parent.
    pub parent_id: Option<AgentId>,
    /// Itself and its ancestors, nearest first.
    pub lineage: Vec<AgentId>,
    /// Declared capabilities.
    pub declared_capabilities: Vec<ActionName>,
    /// Effective capabilities.
    pub effective_capabilities: Vec<ActionName>,
    /// Status.
    pub status: AgentStatusBody,
    /// The stored (sanitised) config.
    pub config: Option<Value>,
}

impl From<AgentView> for AgentResponse {
    fn from(v: AgentView) -> Self {
        Self {
            agent_id: v.agent_id,
            parent_id: v.parent_id,
            lineage: v.lineage,
            declared_capabilities: v.declared_capabilities,
            effective_capabilities: v.effective_capabilities,
            status: match v.status {
                AgentStatus::Active => AgentStatusBody::Active,
                AgentStatus::Revoked => AgentStatusBody::Revoked,
            },
            config: v.config,
        }
    }
}

/// Agents revoked by a `DELETE /v1/agents/{id}`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RevokedResponse {
    /// Newly revoked agents, the target first.
    pub revoked: Vec<AgentId>,
}

/// A token revoked.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TokenRevokedResponse {
    /// Its id.
    pub token_id: String,
    /// Always true.
    pub revoked: bool,
}

/// One contributor to a combined `policy` value.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ContributorBody {
    /// Its owner.
    pub owner_agent_id: AgentId,
    /// Its revision.
    pub revision: u64,
    /// Its own value.
    pub value: Value,
}

/// A resolved memory value with its provenance.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MemoryValueResponse {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// The value.
    pub value: Value,
    /// Its owner (for a combined policy value, the root-most contributor).
    pub owner_agent_id: AgentId,
    /// Visibility.
    pub visibility: Visibility,
    /// Class name.
    pub class: String,
    /// Revision.
    pub revision: u64,
    /// The decision's reason (`visible_from:<owner>`, `combined_from:...`).
    pub reason: String,
    /// For a policy value: the combinator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub combinator: Option<Combinator>,
    /// For a policy value: every contributing record, nearest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contributors: Vec<ContributorBody>,
}

impl MemoryValueResponse {
    /// From a resolved value.
    pub fn new(namespace: Namespace, key: Key, v: ResolvedValue, reason: String) -> Self {
        Self {
            namespace,
            key,
            value: v.value,
            owner_agent_id: v.owner_agent_id,
            visibility: v.visibility,
            class: v.class,
            revision: v.revision,
            reason,
            combinator: v.combinator,
            contributors: v
                .contributors
                .into_iter()
                .map(|c| ContributorBody {
                    owner_agent_id: c.owner_agent_id,
                    revision: c.revision,
                    value: c.value,
                })
                .collect(),
        }
    }
}

/// A stored record after a write.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MemoryWrittenResponse {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Owner (the caller).
    pub owner_agent_id: AgentId,
    /// New revision.
    pub revision: u64,
    /// Visibility.
    pub visibility: Visibility,
    /// Class name.
    pub class: String,
    /// Whether the write created the record.
    pub created: bool,
}

impl From<&MemoryRecord> for MemoryWrittenResponse {
    fn from(r: &MemoryRecord) -> Self {
        Self {
            namespace: r.namespace.clone(),
            key: r.key.clone(),
            owner_agent_id: r.owner.clone(),
            revision: r.revision,
            visibility: r.visibility,
            class: r.class.name().to_owned(),
            created: r.revision == 1,
        }
    }
}

/// A deleted record.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MemoryDeletedResponse {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Owner (the caller).
    pub owner_agent_id: AgentId,
    /// The revision it had.
    pub revision: u64,
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
    pub operation: String,
    /// The resource.
    pub resource: String,
    /// Policy version.
    pub policy_version: String,
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

/// One step's preflight decision.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StepDecisionBody {
    /// Step id as written.
    pub step_id: String,
    /// Action as written.
    pub action: String,
    /// The decision (its reason is the first violation).
    pub decision: DecisionBody,
    /// Every violation, in check order.
    pub violations: Vec<String>,
}

impl From<&StepCheck> for StepDecisionBody {
    fn from(s: &StepCheck) -> Self {
        Self {
            step_id: s.step_id.clone(),
            action: s.action.clone(),
            decision: (&s.decision).into(),
            violations: s.violations.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Every step's decision.
pub fn step_decisions(p: &Preflight) -> Vec<StepDecisionBody> {
    p.steps.iter().map(Into::into).collect()
}

/// The answer of `POST /v1/sops/validate`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ValidateResponse {
    /// Whether every step is allowed.
    pub admitted: bool,
    /// One decision per step, in order.
    pub decisions: Vec<StepDecisionBody>,
}

/// One step of an admitted run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunStepBody {
    /// Step id.
    pub step_id: StepId,
    /// Its action.
    pub action: ActionName,
    /// Stable operation id (idempotency key of the effect).
    pub operation_id: String,
}

/// An admitted run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunAdmittedResponse {
    /// Run id.
    pub run_id: RunId,
    /// Whether the run existed already (same id, same SOP).
    pub existing: bool,
    /// Steps in order.
    pub steps: Vec<RunStepBody>,
    /// Every step's preflight decision.
    pub decisions: Vec<StepDecisionBody>,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StepStatusBody {
    /// Completed.
    Completed,
    /// Failed; the run stops.
    Failed,
    /// Denied mid-run; the run stops.
    Denied,
}

/// A recorded step outcome.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OutcomeBody {
    /// How it ended.
    pub status: StepStatusBody,
    /// The result.
    pub result: Option<Value>,
    /// The error.
    pub error: Option<String>,
    /// Labels of the result.
    pub labels: Vec<Label>,
    /// When it was recorded (ms since the epoch).
    pub recorded_at: i64,
}

impl From<&StepOutcome> for OutcomeBody {
    fn from(o: &StepOutcome) -> Self {
        Self {
            status: match o.status {
                StepStatus::Completed => StepStatusBody::Completed,
                StepStatus::Failed => StepStatusBody::Failed,
                StepStatus::Denied => StepStatusBody::Denied,
            },
            result: o.result.clone(),
            error: o.error.clone(),
            labels: o.labels.clone(),
            recorded_at: o.recorded_at.0,
        }
    }
}

/// What the gate said.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GateBody {
    /// Run the tool now, then report with `complete`.
    Proceed,
    /// Already done: here is the recorded outcome; do not run it again.
    Replay,
    /// A memory step: the server ran it; here is the outcome.
    Executed,
}

/// The answer of `POST /v1/runs/{run}/steps/{step}/begin` when the step may
/// (or did) run. A refused step is a 403 `step_denied` instead.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct GateResponse {
    /// What to do.
    pub gate: GateBody,
    /// The decision.
    pub decision: DecisionBody,
    /// The operation id (idempotency key for the effect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// The action to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionName>,
    /// Its arguments, as admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Map<String, Value>>,
    /// The outcome, for `replay` and `executed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeBody>,
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

/// The answer of `GET /healthz`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HealthResponse {
    /// Always `ok`.
    pub status: String,
    /// The policy in force.
    pub policy_version: String,
}

// ---------------------------------------------------------------------------
// Context envelopes
// ---------------------------------------------------------------------------

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
    /// `environment` (`WARDEN_ENVELOPE_SIGNING_KEY`), `configured`, or
    /// `random` (this process only: a restart changes key and issuer).
    pub key_source: String,
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

/// What an escalation holds up.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EscalationTargetBody {
    /// One step of one run.
    Step {
        /// The run.
        run_id: RunId,
        /// The step.
        step_id: StepId,
    },
    /// The registration of `child_id` under `parent_id`.
    Delegation {
        /// The delegating agent.
        parent_id: AgentId,
        /// The child's id.
        child_id: AgentId,
        /// The run the delegation inherits from.
        from_run: Option<RunId>,
    },
}

/// A request held for review: ids, labels and levels, never data.
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
                EscalationTarget::Step { run_id, step_id } => {
                    EscalationTargetBody::Step { run_id, step_id }
                }
                EscalationTarget::Delegation {
                    parent,
                    child,
                    from_run,
                } => EscalationTargetBody::Delegation {
                    parent_id: parent,
                    child_id: child,
                    from_run,
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
