//! Conformance checks for the context-envelope and escalation methods of
//! [`Store`]: every backend runs them against a fresh, empty store.
//!
//! They return `Err(<what failed>)` rather than panicking, so a backend's
//! test can call them with `?` or `.unwrap()` as it likes:
//!
//! ```text
//! #[tokio::test]
//! async fn context_conformance() {
//!     warden_store::conformance_context::run_all(&fresh_store().await).await.unwrap();
//! }
//! ```
//!
//! Each check uses its own ids, so they can share one store.

use std::collections::BTreeSet;

use serde_json::json;
use warden_core::audit::AuditDraft;
use warden_core::decision::{Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::ids::{AgentId, RunId, StepId};
use warden_core::time::Timestamp;

use crate::{
    EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget, PutEnvelope,
    PutEscalation, ResolveEscalation, Store,
};

/// What a failed check reports.
pub type Failure = String;

fn check(ok: bool, what: &str) -> Result<(), Failure> {
    if ok { Ok(()) } else { Err(what.to_owned()) }
}

fn ident<T>(r: Result<T, warden_core::ids::IdentifierError>) -> Result<T, Failure> {
    r.map_err(|e| e.to_string())
}

fn draft(reason: &'static str) -> AuditDraft {
    AuditDraft {
        time: Timestamp(1),
        subject: Subject::OPERATOR.to_owned(),
        operation: "conformance".into(),
        resource: reason.into(),
        verdict: Verdict::Allow,
        reason: reason.into(),
        policy_version: "conformance".into(),
        details: json!(null),
    }
}

fn envelope(id: &str, version: u64) -> Result<EnvelopeRecord, Failure> {
    Ok(EnvelopeRecord {
        envelope_id: ident(EnvelopeId::parse(id))?,
        parent_envelope_id: None,
        workflow_id: ident(WorkflowId::parse("wf-conformance"))?,
        agent_id: ident(AgentId::parse("agent-conformance"))?,
        labels: BTreeSet::new(),
        aggregate_sensitivity: Sensitivity::Public,
        derived: BTreeSet::new(),
        delegation_depth: 0,
        restrictions: BTreeSet::new(),
        version,
    })
}

async fn audit_count<S: Store>(store: &S) -> Result<u64, Failure> {
    Ok(store.audit_head().await.map_err(|e| e.to_string())?.count)
}

/// Every check, in order.
pub async fn run_all<S: Store>(store: &S) -> Result<(), Failure> {
    envelope_versions(store).await?;
    escalation_lifecycle(store).await?;
    Ok(())
}

/// `put_envelope` is a compare-and-set on the latest version, keeps every
/// version, and appends audit entries only for what its `AuditFn` returns.
pub async fn envelope_versions<S: Store>(store: &S) -> Result<(), Failure> {
    let err = |e: crate::StoreError| e.to_string();
    let id = ident(EnvelopeId::parse("env-conformance-1"))?;
    let before = audit_count(store).await?;
    let written = |o: &PutEnvelope| match o {
        PutEnvelope::Written => vec![draft("envelope_written")],
        PutEnvelope::Conflict { .. } => Vec::new(),
    };

    check(
        store
            .get_envelope(id.clone(), None)
            .await
            .map_err(err)?
            .is_none(),
        "an unknown envelope reads as None",
    )?;
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 0)?,
            Some(0),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: None },
        "expecting a version of a missing envelope conflicts",
    )?;
    let o = store
        .put_envelope(envelope("env-conformance-1", 0)?, None, Box::new(written))
        .await
        .map_err(err)?;
    check(o == PutEnvelope::Written, "creating an envelope writes it")?;
    let o = store
        .put_envelope(envelope("env-conformance-1", 5)?, None, Box::new(written))
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: Some(0) },
        "creating an existing envelope conflicts",
    )?;
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 1)?,
            Some(0),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(o == PutEnvelope::Written, "the expected version writes")?;
    // The loser of a race: it expected 0, the latest is 1.
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 1)?,
            Some(0),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: Some(1) },
        "a stale expected version conflicts",
    )?;
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 1)?,
            Some(1),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: Some(1) },
        "a version that does not go up conflicts",
    )?;
    let latest = store.get_envelope(id.clone(), None).await.map_err(err)?;
    check(
        latest.map(|r| r.version) == Some(1),
        "the latest version is read back",
    )?;
    let first = store.get_envelope(id.clone(), Some(0)).await.map_err(err)?;
    check(
        first.map(|r| r.version) == Some(0),
        "earlier versions are kept",
    )?;
    check(
        store
            .get_envelope(id, Some(7))
            .await
            .map_err(err)?
            .is_none(),
        "a version never stored reads as None",
    )?;
    check(
        audit_count(store).await? == before + 2,
        "only the two writes appended audit entries",
    )
}

fn escalation(id: &str, target: EscalationTarget) -> EscalationRecord {
    EscalationRecord {
        escalation_id: id.to_owned(),
        target,
        requested_by: Subject::Operator,
        operation: "step.begin".into(),
        resource: "r".into(),
        reason: Reason::code("sensitivity_floor"),
        envelope_id: None,
        envelope_version: None,
        classification: Sensitivity::Restricted,
        obligations: Vec::new(),
        status: EscalationStatus::Pending,
        created_at: Timestamp(1),
        resolved_by: None,
        resolved_at: None,
        rejection_reason: None,
        consumed_at: None,
    }
}

/// One open escalation per target; resolution and consumption happen
/// exactly once.
pub async fn escalation_lifecycle<S: Store>(store: &S) -> Result<(), Failure> {
    let err = |e: crate::StoreError| e.to_string();
    let step = |s: &str| -> Result<EscalationTarget, Failure> {
        Ok(EscalationTarget::Step {
            run_id: ident(RunId::parse("run-conformance"))?,
            step_id: ident(StepId::parse(s))?,
        })
    };
    let created = |o: &PutEscalation| match o {
        PutEscalation::Created => vec![draft("escalation_created")],
        PutEscalation::Existing(_) => Vec::new(),
    };
    let none = |_: &Option<EscalationRecord>| Vec::new();
    let resolved = |_: &ResolveEscalation| Vec::new();

    let o = store
        .put_escalation(escalation("esc-c-1", step("a")?), Box::new(created))
        .await
        .map_err(err)?;
    check(o == PutEscalation::Created, "a new escalation is created")?;
    let o = store
        .put_escalation(escalation("esc-c-2", step("a")?), Box::new(created))
        .await
        .map_err(err)?;
    check(
        matches!(&o, PutEscalation::Existing(e) if e.escalation_id == "esc-c-1"),
        "a second escalation for an open target returns the open one",
    )?;
    check(
        store
            .get_escalation("esc-c-2".into())
            .await
            .map_err(err)?
            .is_none(),
        "the duplicate was not stored",
    )?;
    let dup = store
        .put_escalation(escalation("esc-c-1", step("b")?), Box::new(created))
        .await;
    check(
        matches!(dup, Err(crate::StoreError::Duplicate { entity: crate::Entity::Escalation, ref id }) if id == "esc-c-1"),
        "a reused escalation id is a duplicate",
    )?;
    let pending = store
        .list_escalations(Some(EscalationStatus::Pending))
        .await
        .map_err(err)?;
    check(
        pending.iter().any(|e| e.escalation_id == "esc-c-1"),
        "pending escalations are listed",
    )?;
    let consumed = store
        .consume_escalation(step("a")?, Timestamp(2), Box::new(none))
        .await
        .map_err(err)?;
    check(
        consumed.is_none(),
        "a pending escalation cannot be consumed",
    )?;
    let o = store
        .resolve_escalation(
            "esc-c-1".into(),
            EscalationResolution::Approve,
            Subject::Operator,
            Timestamp(3),
            Box::new(resolved),
        )
        .await
        .map_err(err)?;
    check(
        matches!(&o, ResolveEscalation::Resolved(e) if e.status == EscalationStatus::Approved
            && e.resolved_by == Some(Subject::Operator) && e.resolved_at == Some(Timestamp(3))),
        "approval resolves a pending escalation",
    )?;
    let o = store
        .resolve_escalation(
            "esc-c-1".into(),
            EscalationResolution::Reject { reason: "r".into() },
            Subject::Operator,
            Timestamp(4),
            Box::new(resolved),
        )
        .await
        .map_err(err)?;
    check(
        matches!(&o, ResolveEscalation::NotPending(e) if e.status == EscalationStatus::Approved),
        "a resolved escalation is not resolved again",
    )?;
    let o = store
        .resolve_escalation(
            "esc-c-missing".into(),
            EscalationResolution::Approve,
            Subject::Operator,
            Timestamp(4),
            Box::new(resolved),
        )
        .await
        .map_err(err)?;
    check(
        o == ResolveEscalation::NotFound,
        "an unknown id is not found",
    )?;
    let o = store
        .put_escalation(escalation("esc-c-3", step("a")?), Box::new(created))
        .await
        .map_err(err)?;
    check(
        matches!(&o, PutEscalation::Existing(e) if e.escalation_id == "esc-c-1"),
        "an approved, unconsumed escalation is still open",
    )?;
    let consumed = store
        .consume_escalation(step("a")?, Timestamp(5), Box::new(none))
        .await
        .map_err(err)?;
    check(
        consumed.as_ref().is_some_and(|e| {
            e.escalation_id == "esc-c-1"
                && e.status == EscalationStatus::Consumed
                && e.consumed_at == Some(Timestamp(5))
        }),
        "the approval is consumed",
    )?;
    let again = store
        .consume_escalation(step("a")?, Timestamp(6), Box::new(none))
        .await
        .map_err(err)?;
    check(again.is_none(), "an approval is consumed only once")?;
    let o = store
        .put_escalation(escalation("esc-c-4", step("a")?), Box::new(created))
        .await
        .map_err(err)?;
    check(
        o == PutEscalation::Created,
        "after consumption the target can escalate again",
    )?;
    let o = store
        .resolve_escalation(
            "esc-c-4".into(),
            EscalationResolution::Reject {
                reason: "not now".into(),
            },
            Subject::Operator,
            Timestamp(7),
            Box::new(resolved),
        )
        .await
        .map_err(err)?;
    check(
        matches!(&o, ResolveEscalation::Resolved(e) if e.status == EscalationStatus::Rejected
            && e.rejection_reason.as_deref() == Some("not now")),
        "rejection resolves with its reason",
    )?;
    let consumed = store
        .consume_escalation(step("a")?, Timestamp(8), Box::new(none))
        .await
        .map_err(err)?;
    check(
        consumed.is_none(),
        "a rejected escalation is never consumed",
    )?;
    let all = store.list_escalations(None).await.map_err(err)?;
    let ids: Vec<&str> = all
        .iter()
        .filter(|e| e.escalation_id.starts_with("esc-c-"))
        .map(|e| e.escalation_id.as_str())
        .collect();
    check(
        ids == ["esc-c-1", "esc-c-4"],
        "escalations are listed oldest first",
    )?;
    let rejected = store
        .list_escalations(Some(EscalationStatus::Rejected))
        .await
        .map_err(err)?;
    check(
        rejected
            .iter()
            .all(|e| e.status == EscalationStatus::Rejected),
        "the status filter applies",
    )
}
