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
use warden_core::decision::{Decision, Verdict};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::memory::{Combinator, MemoryRecord, Visibility};
use warden_core::preflight::{Preflight, StepCheck};
use warden_store::{StepOutcome, StepStatus};

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
