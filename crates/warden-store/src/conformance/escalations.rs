//! Escalations: one open escalation per target; resolution and
//! consumption happen exactly once.

use warden_core::decision::{Reason, Subject};
use warden_core::envelope::Sensitivity;
use warden_core::ids::{RunId, StepId};
use warden_core::time::Timestamp;

use super::envelopes::{Failure, check, ident, note};
use crate::{
    ConsumedEscalation, ESCALATION_WITHDRAWN, EscalationRecord, EscalationResolution,
    EscalationStatus, EscalationTarget, PutEscalation, ResolveEscalation, Store,
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
        request: None,
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
            request_digest: None,
        })
    };
    let created = |o: &PutEscalation| match o {
        PutEscalation::Created => vec![note("escalation_created")],
        PutEscalation::Existing(_) => Vec::new(),
    };
    let none = |_: &Option<ConsumedEscalation>| Vec::new();
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
        consumed.as_ref().is_some_and(|c| {
            c.escalation.escalation_id == "esc-c-1"
                && c.escalation.status == EscalationStatus::Consumed
                && c.escalation.consumed_at == Some(Timestamp(5))
                && c.withdrawn.is_empty()
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

/// A request digest is part of the target: requests for one slot with
/// different digests (or none, as records stored before requests were
/// bound) are different escalations, the stored request round-trips, an
/// approval is consumed only by its own digest, and consuming it withdraws
/// every other pending escalation of the slot in the same transaction
/// (reported to the audit function, which records them), and nothing else.
pub async fn check_bound_requests<S: Store>(store: &S) -> Result<(), Failure> {
    use warden_core::audit::Digest;
    let err = |e: crate::StoreError| e.to_string();
    let step = |s: &str, d: Option<u8>| -> Result<EscalationTarget, Failure> {
        Ok(EscalationTarget::Step {
            run_id: ident(RunId::parse("run-bound"))?,
            step_id: ident(StepId::parse(s))?,
            request_digest: d.map(|b| Digest([b; 32])),
        })
    };
    let with_request = |id: &str, t: EscalationTarget, by: &str| {
        let mut e = escalation(id, t);
        e.request = Some(serde_json::json!({"arguments": {"path": id}, "n": [1, 2]}));
        if let Ok(a) = warden_core::ids::AgentId::parse(by) {
            e.requested_by = Subject::Agent(a);
        }
        e
    };
    let none = |_: &PutEscalation| Vec::new();
    for (id, t) in [
        ("esc-b-1", step("x", Some(1))?),
        ("esc-b-2", step("x", Some(2))?),
        ("esc-b-legacy", step("x", None)?),
        ("esc-b-3", step("x", Some(3))?),
        ("esc-b-other", step("y", Some(2))?),
    ] {
        let o = store
            .put_escalation(with_request(id, t, "winner"), Box::new(none))
            .await
            .map_err(err)?;
        check(
            o == PutEscalation::Created,
            "escalations of one slot with different request digests are different escalations",
        )?;
    }
    let got = store.get_escalation("esc-b-2".into()).await.map_err(err)?;
    check(
        got.as_ref() == Some(&with_request("esc-b-2", step("x", Some(2))?, "winner")),
        "the request and its digest round-trip",
    )?;
    let resolved = |_: &ResolveEscalation| Vec::new();
    for id in ["esc-b-1", "esc-b-3"] {
        store
            .resolve_escalation(
                id.into(),
                EscalationResolution::Approve,
                Subject::Operator,
                Timestamp(20),
                Box::new(resolved),
            )
            .await
            .map_err(err)?;
    }
    let head = store.audit_head().await.map_err(err)?.count;
    let nothing = store
        .consume_escalation(
            step("x", Some(9))?,
            Timestamp(21),
            Box::new(|o: &Option<ConsumedEscalation>| {
                o.iter().map(|_| note("escalation_consumed")).collect()
            }),
        )
        .await
        .map_err(err)?;
    check(nothing.is_none(), "another digest consumes nothing")?;
    let legacy = store
        .consume_escalation(step("x", None)?, Timestamp(21), Box::new(|_| Vec::new()))
        .await
        .map_err(err)?;
    check(
        legacy.is_none(),
        "a pending record without a digest is never consumed",
    )?;
    check(
        store.audit_head().await.map_err(err)?.count == head,
        "consuming nothing appends nothing",
    )?;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = std::sync::Arc::clone(&seen);
    let consumed = store
        .consume_escalation(
            step("x", Some(1))?,
            Timestamp(22),
            Box::new(move |o: &Option<ConsumedEscalation>| {
                let mut out = Vec::new();
                if let Some(c) = o {
                    if let Ok(mut g) = seen2.lock() {
                        g.extend(c.withdrawn.iter().map(|w| w.escalation_id.clone()));
                    }
                    out.push(note("escalation_consumed"));
                    out.extend(c.withdrawn.iter().map(|_| note("escalation_withdrawn")));
                }
                out
            }),
        )
        .await
        .map_err(err)?;
    let Some(consumed) = consumed else {
        return Err("the approval of exactly this digest is consumed".into());
    };
    check(
        consumed.escalation.escalation_id == "esc-b-1"
            && consumed.escalation.status == EscalationStatus::Consumed,
        "the approval of exactly this digest is consumed",
    )?;
    let mut ids: Vec<&str> = consumed
        .withdrawn
        .iter()
        .map(|w| w.escalation_id.as_str())
        .collect();
    ids.sort_unstable();
    check(
        ids == ["esc-b-2", "esc-b-legacy"],
        "the pending escalations of the slot are withdrawn, not an approved one nor another slot's",
    )?;
    check(
        seen.lock().map(|g| g.len()).unwrap_or_default() == 2
            && store.audit_head().await.map_err(err)?.count == head + 3,
        "the withdrawals are reported to the audit function and recorded in the same transaction",
    )?;
    for w in ["esc-b-2", "esc-b-legacy"] {
        let e = store.get_escalation(w.into()).await.map_err(err)?;
        check(
            e.as_ref().is_some_and(|e| {
                e.status == EscalationStatus::Rejected
                    && e.rejection_reason.as_deref() == Some(ESCALATION_WITHDRAWN)
                    && e.resolved_at == Some(Timestamp(22))
                    && e.resolved_by == Some(consumed.escalation.requested_by.clone())
                    && consumed.withdrawn.contains(e)
            }),
            "a withdrawn escalation is stored rejected (`escalation_withdrawn`), as returned",
        )?;
    }
    for (id, status) in [
        ("esc-b-3", EscalationStatus::Approved),
        ("esc-b-other", EscalationStatus::Pending),
    ] {
        let e = store.get_escalation(id.into()).await.map_err(err)?;
        check(
            e.is_some_and(|e| e.status == status),
            "an approved escalation of the slot and another slot's are untouched",
        )?;
    }
    Ok(())
}
