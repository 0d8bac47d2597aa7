//! Escalations: one open escalation per target; resolution and
//! consumption happen exactly once.

use warden_core::decision::{Reason, Subject};
use warden_core::envelope::Sensitivity;
use warden_core::ids::{RunId, StepId};
use warden_core::time::Timestamp;

use super::envelopes::{Failure, check, ident, note};
use crate::{
    EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget, PutEscalation,
    ResolveEscalation, Store,
};

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
pub async fn check_escalation_lifecycle<S: Store>(store: &S) -> Result<(), Failure> {
    let err = |e: crate::StoreError| e.to_string();
    let step = |s: &str| -> Result<EscalationTarget, Failure> {
        Ok(EscalationTarget::Step {
            run_id: ident(RunId::parse("run-conformance"))?,
            step_id: ident(StepId::parse(s))?,
        })
    };
    let created = |o: &PutEscalation| match o {
        PutEscalation::Created => vec![note("escalation_created")],
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
