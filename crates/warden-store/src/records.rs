//! The records a [`Store`](crate::Store) keeps, beyond the core's own types.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_core::audit::Digest;
use warden_core::decision::{Obligation, Reason, Subject};
use warden_core::envelope::{EnvelopeId, Sensitivity};
use warden_core::hierarchy::{AgentSpec, AgentStatus};
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::memory::MemoryRecord;
use warden_core::time::Timestamp;

/// A registered agent as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAgent {
    /// Its id.
    pub id: AgentId,
    /// Its parent.
    pub parent: Option<AgentId>,
    /// Declared capabilities.
    pub capabilities: BTreeSet<ActionName>,
    /// Tool names it was registered with (delegation lockdown checks them).
    #[serde(default)]
    pub tools: Vec<String>,
    /// The (sanitised) config it was registered with.
    #[serde(default)]
    pub config: Option<Value>,
    /// Active or revoked.
    pub status: AgentStatus,
    /// When it was registered.
    pub created_at: Timestamp,
    /// The context envelope it inherited when it was delegated (its runs and
    /// its own children start from it); `None` for an agent without one.
    #[serde(default)]
    pub envelope_id: Option<EnvelopeId>,
}

impl StoredAgent {
    /// The hierarchy-facing part.
    pub fn spec(&self) -> AgentSpec {
        AgentSpec {
            id: self.id.clone(),
            parent: self.parent.clone(),
            capabilities: self.capabilities.clone(),
        }
    }
}

/// Whom a token authenticates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "agent_id", rename_all = "snake_case")]
pub enum TokenSubject {
    /// The operator (the orchestrator).
    Operator,
    /// One agent.
    Agent(AgentId),
}

impl TokenSubject {
    /// The kind's snake_case name (`operator`, `agent`).
    pub fn kind_str(&self) -> &'static str {
        match self {
            TokenSubject::Operator => "operator",
            TokenSubject::Agent(_) => "agent",
        }
    }
}

/// A bearer token; only the SHA-256 of its secret is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public id of the token (for listing and revocation).
    pub token_id: String,
    /// SHA-256 of the secret.
    pub hash: Digest,
    /// Whom it authenticates.
    pub subject: TokenSubject,
    /// When it was issued.
    pub created_at: Timestamp,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// Outcome of a put.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PutOutcome {
    /// Stored; the new record.
    Written {
        /// The record as stored.
        record: MemoryRecord,
        /// Whether it was created (revision 1) rather than updated.
        created: bool,
    },
    /// The expected revision did not match; nothing changed.
    Conflict {
        /// The stored revision, if a record exists.
        current: Option<u64>,
    },
    /// The resulting record would be invalid for its class; nothing changed.
    Rejected {
        /// The reason code.
        reason: String,
    },
    /// The write would exceed the owner's [`StorageQuota`]; nothing changed.
    ///
    /// [`StorageQuota`]: crate::StorageQuota
    OverQuota {
        /// Which limit.
        quota: crate::QuotaKind,
        /// The limit.
        limit: u64,
        /// What the owner held before the write (records or bytes).
        used: u64,
    },
}

/// A delete request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delete {
    /// Owner scope (already checked to be the actor).
    pub owner: AgentId,
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Delete only at this revision.
    pub expected_revision: Option<u64>,
}

/// Outcome of a delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DeleteOutcome {
    /// Deleted; the revision it had.
    Deleted {
        /// Revision of the deleted record.
        revision: u64,
    },
    /// No such record.
    NotFound,
    /// The expected revision did not match; nothing changed.
    Conflict {
        /// The stored revision.
        current: u64,
    },
}

/// What an owner holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Number of records.
    pub records: u64,
    /// Bytes of JSON values.
    pub bytes: u64,
}

/// One step of an admitted run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStep {
    /// Step id.
    pub step_id: StepId,
    /// Its action.
    pub action: ActionName,
    /// Stable operation id: the idempotency key of the step's effect.
    pub operation_id: String,
}

/// An admitted run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run id (client-suppliable idempotency key).
    pub run_id: RunId,
    /// The agent that admitted it.
    pub agent: AgentId,
    /// SHA-256 of the SOP's canonical JSON; a reused run id must match.
    pub sop_hash: Digest,
    /// The SOP as admitted (canonical JSON value).
    pub sop: Value,
    /// Its steps in order.
    pub steps: Vec<RunStep>,
    /// Policy version it was admitted under.
    pub policy_version: String,
    /// When it was admitted.
    pub created_at: Timestamp,
    /// The run's context envelope (see [`Store::put_envelope`]); `None` when
    /// the policy has no `context:` section.
    ///
    /// [`Store::put_envelope`]: crate::Store::put_envelope
    #[serde(default)]
    pub envelope_id: Option<EnvelopeId>,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// The effect happened; the result is recorded.
    Completed,
    /// The handler failed; the run stops here.
    Failed,
    /// The gate refused it mid-run (accumulated context, revocation); the
    /// run stops here.
    Denied,
}

impl StepStatus {
    /// The status's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Completed => "completed",
            StepStatus::Failed => "failed",
            StepStatus::Denied => "denied",
        }
    }
}

impl std::str::FromStr for StepStatus {
    type Err = String;

    /// Parse the snake_case name ([`StepStatus::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "completed" => Ok(StepStatus::Completed),
            "failed" => Ok(StepStatus::Failed),
            "denied" => Ok(StepStatus::Denied),
            other => Err(format!("unknown step status `{other}`")),
        }
    }
}

/// The recorded outcome of one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// How it ended.
    pub status: StepStatus,
    /// The handler's result.
    #[serde(default)]
    pub result: Option<Value>,
    /// The error message, for a failed step.
    #[serde(default)]
    pub error: Option<String>,
    /// Labels the result carried.
    #[serde(default)]
    pub labels: Vec<Label>,
    /// When it was recorded.
    pub recorded_at: Timestamp,
}

/// A run with its recorded outcomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run.
    pub run: RunRecord,
    /// Outcomes by step id.
    pub outcomes: BTreeMap<StepId, StepOutcome>,
    /// The leases of steps begun and not recorded (see
    /// [`Store::lease_step`](crate::Store::lease_step)), by step id, expired
    /// ones included.
    #[serde(default)]
    pub leases: BTreeMap<StepId, StepLease>,
}

/// A client-executed step taken by one holder: while the lease is live, no
/// one else may begin the step nor record its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLease {
    /// Who holds it (the lease id the holder presents).
    pub holder: String,
    /// When it was taken (or renewed).
    pub acquired_at: Timestamp,
    /// When it lapses: from then on anyone may take the step over.
    pub expires_at: Timestamp,
}

impl StepLease {
    /// Whether the lease still holds at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now.0 < self.expires_at.0
    }

    /// Whether `other` may take the step at `now` over this lease: it is
    /// this lease's holder, or this lease has lapsed.
    pub fn yields_to(&self, holder: &str, now: Timestamp) -> bool {
        self.holder == holder || !self.is_live(now)
    }
}

/// Outcome of [`Store::lease_step`](crate::Store::lease_step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// The step is now leased to the caller (new, renewed, or taken over
    /// from a lapsed lease).
    Granted,
    /// Another holder's live lease holds the step; nothing changed.
    Held(StepLease),
    /// The step's outcome is recorded; nothing changed.
    Recorded(StepOutcome),
}

/// Outcome of [`Store::create_run`](crate::Store::create_run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateRun {
    /// A new run.
    Created,
    /// A run with this id already exists (whatever the quota).
    Existing(Box<RunState>),
    /// The agent already has `limit` runs in flight (see
    /// [`RunsInFlight`](crate::RunsInFlight)); nothing was stored.
    OverQuota {
        /// The limit.
        limit: u32,
        /// Runs in flight when the create was refused.
        in_flight: u32,
    },
}

/// Outcome of [`Store::record_step`](crate::Store::record_step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordStep {
    /// This outcome is now recorded.
    Recorded,
    /// An outcome was recorded before; here it is, unchanged.
    AlreadyRecorded(StepOutcome),
    /// Another holder's live lease holds the step; nothing was recorded.
    LeaseHeld(StepLease),
}

// ---------------------------------------------------------------------------
// Context envelopes
// ---------------------------------------------------------------------------

/// Outcome of [`Store::put_envelope`](crate::Store::put_envelope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PutEnvelope {
    /// The version is stored and is now the envelope's latest.
    Written,
    /// The latest stored version is not the expected one (or the new version
    /// is not above it); nothing changed.
    Conflict {
        /// The latest stored version, if the envelope exists.
        current: Option<u64>,
    },
}

// ---------------------------------------------------------------------------
// Escalations
// ---------------------------------------------------------------------------

/// What an escalation holds up: one request, bound by its digest.
///
/// `request_digest` is the SHA-256 of the canonical JSON of the request the
/// reviewer is shown ([`EscalationRecord::request`]): everything that shapes
/// what is created or run. It is part of the target, so a different request
/// for the same slot (the same child id, run step or call) is a different
/// escalation, and consuming an approval matches the digest. A record stored
/// before requests were bound has none (`None`): it matches no request and
/// cannot be approved.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EscalationTarget {
    /// One step of one run.
    Step {
        /// The run.
        run_id: RunId,
        /// The step.
        step_id: StepId,
        /// The digest of the step's request (run, step, action, arguments).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_digest: Option<Digest>,
    },
    /// One call of one tool-call session.
    Call {
        /// The session.
        session_id: warden_core::ids::SessionId,
        /// The call.
        call_id: warden_core::ids::CallId,
        /// The digest of the call's action and arguments.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_digest: Option<Digest>,
    },
    /// The registration of `child` under `parent` (optionally from a run).
    Delegation {
        /// The delegating agent.
        parent: AgentId,
        /// The child's id.
        child: AgentId,
        /// The run the delegation inherits from.
        #[serde(default)]
        from_run: Option<RunId>,
        /// The digest of the whole delegation request (capabilities, tools,
        /// config, zone, restrictions, redaction, source).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_digest: Option<Digest>,
    },
}

impl EscalationTarget {
    /// The digest of the request this target binds (`None`: a record stored
    /// before requests were bound).
    pub fn request_digest(&self) -> Option<Digest> {
        match self {
            EscalationTarget::Step { request_digest, .. }
            | EscalationTarget::Call { request_digest, .. }
            | EscalationTarget::Delegation { request_digest, .. } => *request_digest,
        }
    }

    /// Whether `self` and `other` hold up the same slot, whatever their
    /// requests: the same run step, the same call, or the same child id
    /// (one child id is registered at most once, whoever asks).
    pub fn same_slot(&self, other: &EscalationTarget) -> bool {
        match (self, other) {
            (
                EscalationTarget::Step {
                    run_id: r1,
                    step_id: s1,
                    ..
                },
                EscalationTarget::Step {
                    run_id: r2,
                    step_id: s2,
                    ..
                },
            ) => r1 == r2 && s1 == s2,
            (
                EscalationTarget::Call {
                    session_id: s1,
                    call_id: c1,
                    ..
                },
                EscalationTarget::Call {
                    session_id: s2,
                    call_id: c2,
                    ..
                },
            ) => s1 == s2 && c1 == c2,
            (
                EscalationTarget::Delegation { child: c1, .. },
                EscalationTarget::Delegation { child: c2, .. },
            ) => c1 == c2,
            _ => false,
        }
    }
}

/// The `rejection_reason` of an escalation withdrawn because another request
/// for its slot consumed an approval (see [`Store::consume_escalation`]).
///
/// [`Store::consume_escalation`]: crate::Store::consume_escalation
pub const ESCALATION_WITHDRAWN: &str = "escalation_withdrawn";

/// Where an escalation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscalationStatus {
    /// Waiting for a reviewer.
    Pending,
    /// Approved; the next identical request proceeds once and consumes it.
    Approved,
    /// Rejected; final.
    Rejected,
    /// Approved and used; final.
    Consumed,
}

impl EscalationStatus {
    /// The status's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            EscalationStatus::Pending => "pending",
            EscalationStatus::Approved => "approved",
            EscalationStatus::Rejected => "rejected",
            EscalationStatus::Consumed => "consumed",
        }
    }

    /// Whether the escalation still holds its target (pending or approved):
    /// at most one open escalation exists per target.
    pub fn is_open(self) -> bool {
        matches!(self, EscalationStatus::Pending | EscalationStatus::Approved)
    }
}

impl std::str::FromStr for EscalationStatus {
    type Err = String;

    /// Parse the snake_case name ([`EscalationStatus::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(EscalationStatus::Pending),
            "approved" => Ok(EscalationStatus::Approved),
            "rejected" => Ok(EscalationStatus::Rejected),
            "consumed" => Ok(EscalationStatus::Consumed),
            other => Err(format!("unknown escalation status `{other}`")),
        }
    }
}

/// A request held for human review: labels, levels and ids only, never data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationRecord {
    /// Its id (`esc-<hex>`).
    pub escalation_id: String,
    /// What it holds up.
    pub target: EscalationTarget,
    /// Who made the request (the runtime identity).
    pub requested_by: Subject,
    /// The operation (`step.begin`, `agent.register`).
    pub operation: String,
    /// The resource (`<run>:<step>`, the child's id).
    pub resource: String,
    /// Why it escalated (`sensitivity_floor`, `aggregation_backstop`).
    pub reason: Reason,
    /// The envelope the decision was made against.
    #[serde(default)]
    pub envelope_id: Option<EnvelopeId>,
    /// That envelope's version.
    #[serde(default)]
    pub envelope_version: Option<u64>,
    /// The envelope's (projected) sensitivity: the record's own
    /// classification.
    pub classification: Sensitivity,
    /// Obligations that bind the request if it is approved.
    #[serde(default)]
    pub obligations: Vec<Obligation>,
    /// The request itself, as the reviewer is shown it: every field that
    /// shapes what is created or run (canonical JSON; its SHA-256 is the
    /// target's `request_digest`). `None` on records stored before
    /// requests were bound.
    #[serde(default)]
    pub request: Option<Value>,
    /// Its status.
    pub status: EscalationStatus,
    /// When it was created.
    pub created_at: Timestamp,
    /// Who approved or rejected it.
    #[serde(default)]
    pub resolved_by: Option<Subject>,
    /// When.
    #[serde(default)]
    pub resolved_at: Option<Timestamp>,
    /// Why it was rejected.
    #[serde(default)]
    pub rejection_reason: Option<String>,
    /// When the approval was used.
    #[serde(default)]
    pub consumed_at: Option<Timestamp>,
}

/// Outcome of [`Store::put_escalation`](crate::Store::put_escalation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutEscalation {
    /// The escalation is stored, pending.
    Created,
    /// An open (pending or approved) escalation for the same target exists;
    /// here it is, and nothing was stored.
    Existing(Box<EscalationRecord>),
}

/// Outcome of [`Store::consume_escalation`](crate::Store::consume_escalation)
/// when an approval was used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedEscalation {
    /// The approval, now `consumed`.
    pub escalation: EscalationRecord,
    /// The pending escalations of the same slot (other requests that can no
    /// longer proceed once this one has), withdrawn in the same transaction:
    /// now `rejected` with reason [`ESCALATION_WITHDRAWN`], resolved by the
    /// consumed request's requester.
    pub withdrawn: Vec<EscalationRecord>,
}

impl ConsumedEscalation {
    /// Withdraw `pending` for `consumed`: the record as it is stored after.
    pub fn withdraw(
        consumed: &EscalationRecord,
        mut pending: EscalationRecord,
        at: Timestamp,
    ) -> EscalationRecord {
        pending.status = EscalationStatus::Rejected;
        pending.rejection_reason = Some(ESCALATION_WITHDRAWN.to_owned());
        pending.resolved_by = Some(consumed.requested_by.clone());
        pending.resolved_at = Some(at);
        pending
    }
}

/// A reviewer's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "resolution", rename_all = "snake_case")]
pub enum EscalationResolution {
    /// Let the request proceed once.
    Approve,
    /// Refuse it.
    Reject {
        /// Why.
        reason: String,
    },
}

/// Outcome of [`Store::resolve_escalation`](crate::Store::resolve_escalation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveEscalation {
    /// This call resolved it; the record as stored now.
    Resolved(Box<EscalationRecord>),
    /// It was not pending (resolved or consumed before); unchanged.
    NotPending(Box<EscalationRecord>),
    /// No such escalation.
    NotFound,
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_core::decision::Verdict;
    use warden_core::memory::{Combinator, Visibility};

    /// Every stored name parses back to its value, and an unknown name is
    /// refused with a message naming it.
    #[test]
    fn text_names_round_trip() {
        for s in [
            StepStatus::Completed,
            StepStatus::Failed,
            StepStatus::Denied,
        ] {
            assert_eq!(s.as_str().parse::<StepStatus>(), Ok(s));
        }
        for s in [
            EscalationStatus::Pending,
            EscalationStatus::Approved,
            EscalationStatus::Rejected,
            EscalationStatus::Consumed,
        ] {
            assert_eq!(s.as_str().parse::<EscalationStatus>(), Ok(s));
        }
        for s in [AgentStatus::Active, AgentStatus::Revoked] {
            assert_eq!(s.as_str().parse::<AgentStatus>(), Ok(s));
        }
        for v in [
            Verdict::Allow,
            Verdict::Constrain,
            Verdict::Deny,
            Verdict::Escalate,
        ] {
            assert_eq!(v.as_str().parse::<Verdict>(), Ok(v));
        }
        for v in [
            Visibility::Private,
            Visibility::Children,
            Visibility::Descendants,
        ] {
            assert_eq!(v.as_str().parse::<Visibility>(), Ok(v));
        }
        for c in [
            Combinator::All,
            Combinator::Any,
            Combinator::Min,
            Combinator::Max,
            Combinator::Intersection,
        ] {
            assert_eq!(c.as_str().parse::<Combinator>(), Ok(c));
        }
        assert_eq!(
            "Completed".parse::<StepStatus>(),
            Err("unknown step status `Completed`".to_string())
        );
        assert_eq!(
            "gone".parse::<AgentStatus>(),
            Err("unknown agent status `gone`".to_string())
        );
        assert_eq!(TokenSubject::Operator.kind_str(), "operator");
    }
}
