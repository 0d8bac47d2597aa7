//! Context envelopes and escalations: the shared conformance checks,
//! reopening, races and atomicity with the audit log.

use std::collections::BTreeSet;
use std::sync::Arc;

use warden_core::audit::AuditDraft;
use warden_core::decision::{Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::ids::{Label, RunId, StepId};
use warden_core::time::Timestamp;
use warden_sqlite::SqliteStore;
use warden_store::conformance::draft;
use warden_store::{
    EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget, PutEnvelope,
    PutEscalation, ResolveEscalation, Store, StoreError,
};

use crate::support::{id, temp_db, url};

fn envelope(name: &str, version: u64) -> EnvelopeRecord {
    EnvelopeRecord {
        envelope_id: EnvelopeId::parse(name).unwrap(),
        parent_envelope_id: Some(EnvelopeId::parse("env-parent").unwrap()),
        workflow_id: WorkflowId::parse("wf-1").unwrap(),
        agent_id: id("agent"),
        labels: [Label::parse("pii").unwrap()].into_iter().collect(),
        aggregate_sensitivity: Sensitivity::Restricted,
        derived: BTreeSet::new(),
        delegation_depth: 1,
        restrictions: BTreeSet::new(),
        version,
    }
}

fn target(step: &str) -> EscalationTarget {
    EscalationTarget::Step {
        run_id: RunId::parse("run-ctx").unwrap(),
        step_id: StepId::parse(step).unwrap(),
        request_digest: None,
    }
}

fn escalation(esc: &str, target: EscalationTarget) -> EscalationRecord {
    EscalationRecord {
        escalation_id: esc.into(),
        target,
        requested_by: Subject::Agent(id("agent")),
        operation: "step.begin".into(),
        resource: "run-ctx:a".into(),
        reason: Reason::code("sensitivity_floor"),
        envelope_id: Some(EnvelopeId::parse("env-a").unwrap()),
        envelope_version: Some(1),
        classification: Sensitivity::Restricted,
        obligations: Vec::new(),
        request: None,
        status: EscalationStatus::Pending,
        created_at: Timestamp(10),
        resolved_by: None,
        resolved_at: None,
        rejection_reason: None,
        consumed_at: None,
    }
}

fn note(what: &str) -> AuditDraft {
    draft("agent", "context", what, Verdict::Allow, "ok")
}

#[tokio::test]
async fn envelopes_and_escalations_survive_reopening() {
    let (_dir, path) = temp_db();
    let env_a = EnvelopeId::parse("env-a").unwrap();
    let before = {
        let store = SqliteStore::open(&url(&path)).await.unwrap();
        for (version, expected) in [(0, None), (1, Some(0)), (4, Some(1))] {
            let o = store
                .put_envelope(
                    envelope("env-a", version),
                    expected,
                    Box::new(|_| vec![note("envelope")]),
                )
                .await
                .unwrap();
            assert_eq!(o, PutEnvelope::Written);
        }
        for (esc, step) in [("esc-1", "a"), ("esc-2", "b"), ("esc-3", "c")] {
            let o = store
                .put_escalation(
                    escalation(esc, target(step)),
                    Box::new(|_| vec![note("escalation")]),
                )
                .await
                .unwrap();
            assert_eq!(o, PutEscalation::Created);
        }
        let approve = |esc: &str, resolution| {
            store.resolve_escalation(
                esc.into(),
                resolution,
                Subject::Operator,
                Timestamp(11),
                Box::new(|_| vec![note("resolved")]),
            )
        };
        assert!(matches!(
            approve("esc-1", EscalationResolution::Approve)
                .await
                .unwrap(),
            ResolveEscalation::Resolved(_)
        ));
        assert!(matches!(
            approve(
                "esc-2",
                EscalationResolution::Reject {
                    reason: "no".into()
                }
            )
            .await
            .unwrap(),
            ResolveEscalation::Resolved(_)
        ));
        (
            store.audit_head().await.unwrap(),
            store.list_escalations(None).await.unwrap(),
        )
    };
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    assert_eq!(store.audit_head().await.unwrap(), before.0);
    assert_eq!(store.list_escalations(None).await.unwrap(), before.1);
    store.verify_audit(None).await.unwrap();
    // Every version is still there, the latest is the latest.
    for v in [0, 1, 4] {
        assert_eq!(
            store.get_envelope(env_a.clone(), Some(v)).await.unwrap(),
            Some(envelope("env-a", v))
        );
    }
    assert_eq!(
        store.get_envelope(env_a.clone(), None).await.unwrap(),
        Some(envelope("env-a", 4))
    );
    // The compare-and-set continues from the stored latest version.
    let o = store
        .put_envelope(envelope("env-a", 5), Some(1), Box::new(|_| Vec::new()))
        .await
        .unwrap();
    assert_eq!(o, PutEnvelope::Conflict { current: Some(4) });
    // The approval made before closing is consumed once, after reopening.
    let consumed = store
        .consume_escalation(target("a"), Timestamp(12), Box::new(|_| Vec::new()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(consumed.escalation.escalation_id, "esc-1");
    assert_eq!(consumed.escalation.resolved_by, Some(Subject::Operator));
    assert!(
        store
            .consume_escalation(target("a"), Timestamp(13), Box::new(|_| Vec::new()))
            .await
            .unwrap()
            .is_none()
    );
    // The pending one still holds its target; ids stay taken.
    let o = store
        .put_escalation(escalation("esc-4", target("c")), Box::new(|_| Vec::new()))
        .await
        .unwrap();
    assert!(matches!(o, PutEscalation::Existing(e) if e.escalation_id == "esc-3"));
    let dup = store
        .put_escalation(escalation("esc-2", target("z")), Box::new(|_| Vec::new()))
        .await;
    assert!(matches!(dup, Err(StoreError::Duplicate { .. })), "{dup:?}");
    drop(store);
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    let consumed_again = store.get_escalation("esc-1".into()).await.unwrap().unwrap();
    assert_eq!(consumed_again.status, EscalationStatus::Consumed);
    assert_eq!(consumed_again.consumed_at, Some(Timestamp(12)));
}

#[tokio::test]
async fn concurrent_envelope_writers_and_consumers_win_once() {
    let store = Arc::new(SqliteStore::open_temp().await.unwrap());
    store
        .put_envelope(envelope("env-race", 0), None, Box::new(|_| Vec::new()))
        .await
        .unwrap();
    let head = store.audit_head().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            store
                .put_envelope(
                    envelope("env-race", 1),
                    Some(0),
                    Box::new(|o| match o {
                        PutEnvelope::Written => vec![note("won")],
                        PutEnvelope::Conflict { .. } => vec![note("lost")],
                    }),
                )
                .await
                .unwrap()
        }));
    }
    let mut written = 0;
    for t in tasks {
        match t.await.unwrap() {
            PutEnvelope::Written => written += 1,
            PutEnvelope::Conflict { current } => assert_eq!(current, Some(1)),
        }
    }
    assert_eq!(written, 1);
    // Every outcome, won or lost, was recorded with it.
    assert_eq!(store.audit_head().await.unwrap().count, head.count + 16);

    store
        .put_escalation(
            escalation("esc-race", target("r")),
            Box::new(|_| Vec::new()),
        )
        .await
        .unwrap();
    store
        .resolve_escalation(
            "esc-race".into(),
            EscalationResolution::Approve,
            Subject::Operator,
            Timestamp(2),
            Box::new(|_| Vec::new()),
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            store
                .consume_escalation(target("r"), Timestamp(100 + i), Box::new(|_| Vec::new()))
                .await
                .unwrap()
        }));
    }
    let mut consumed = 0;
    for t in tasks {
        consumed += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(consumed, 1);
}

#[tokio::test]
async fn a_failed_audit_fn_stores_nothing() {
    let store = SqliteStore::open_temp().await.unwrap();
    let head = store.audit_head().await.unwrap();
    let err = store
        .put_envelope(
            envelope("env-panic", 0),
            None,
            Box::new(|_| panic!("audit function failed")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    let id = EnvelopeId::parse("env-panic").unwrap();
    assert_eq!(store.get_envelope(id, None).await.unwrap(), None);

    store
        .put_escalation(escalation("esc-p", target("p")), Box::new(|_| Vec::new()))
        .await
        .unwrap();
    let err = store
        .resolve_escalation(
            "esc-p".into(),
            EscalationResolution::Approve,
            Subject::Operator,
            Timestamp(2),
            Box::new(|_| panic!("audit function failed")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    let e = store.get_escalation("esc-p".into()).await.unwrap().unwrap();
    assert_eq!(e.status, EscalationStatus::Pending);
    assert_eq!(e.resolved_by, None);
    assert_eq!(store.audit_head().await.unwrap(), head);
}

#[tokio::test]
async fn the_schema_refuses_rewriting_history() {
    let (_dir, path) = temp_db();
    {
        let store = SqliteStore::open(&url(&path)).await.unwrap();
        store
            .put_envelope(envelope("env-h", 0), None, Box::new(|_| Vec::new()))
            .await
            .unwrap();
        store
            .put_escalation(escalation("esc-h", target("h")), Box::new(|_| Vec::new()))
            .await
            .unwrap();
        store
            .resolve_escalation(
                "esc-h".into(),
                EscalationResolution::Approve,
                Subject::Operator,
                Timestamp(2),
                Box::new(|_| Vec::new()),
            )
            .await
            .unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    for sql in [
        "UPDATE envelopes SET version = 9",
        "DELETE FROM envelopes",
        "UPDATE escalations SET status = 'pending'",
        "UPDATE escalations SET status = 'rejected'",
        "DELETE FROM escalations",
    ] {
        assert!(conn.execute(sql, []).is_err(), "{sql} was allowed");
    }
    // A second open escalation for the same target is refused too.
    let dup = conn.execute(
        "INSERT INTO escalations (escalation_id, target, status, created_at, record) \
         SELECT 'esc-x', target, 'pending', created_at, record FROM escalations",
        [],
    );
    assert!(dup.is_err());
    // The legal move still works.
    assert_eq!(
        conn.execute("UPDATE escalations SET status = 'consumed'", [])
            .unwrap(),
        1
    );
}
