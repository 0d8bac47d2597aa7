//! Context envelopes and the escalation queue across store instances (as
//! several servers would run them) on one schema; the shared checks run in
//! the conformance suite.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;
use warden_core::audit::AuditDraft;
use warden_core::decision::{Obligation, Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::ids::{Label, RunId, StepId};
use warden_core::time::Timestamp;
use warden_postgres::PgStore;
use warden_store::{
    AuditFn, EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget,
    PutEnvelope, PutEscalation, ResolveEscalation, Store, StoreError,
};

use crate::support::*;

const RACERS: usize = 16;

fn envelope(id: &str, version: u64, labels: &[&str]) -> EnvelopeRecord {
    EnvelopeRecord {
        envelope_id: EnvelopeId::parse(id).unwrap(),
        parent_envelope_id: Some(EnvelopeId::parse("env-parent").unwrap()),
        workflow_id: WorkflowId::parse("wf-1").unwrap(),
        agent_id: id_of("researcher"),
        labels: labels.iter().map(|l| Label::parse(l).unwrap()).collect(),
        aggregate_sensitivity: Sensitivity::Confidential,
        derived: BTreeSet::new(),
        delegation_depth: 1,
        restrictions: [Label::parse("no_external_export").unwrap()]
            .into_iter()
            .collect(),
        version,
    }
}

fn id_of(s: &str) -> warden_core::ids::AgentId {
    id(s)
}

fn envelope_audit(tag: usize) -> AuditFn<PutEnvelope> {
    Box::new(move |o: &PutEnvelope| {
        let (verdict, reason) = match o {
            PutEnvelope::Written => (Verdict::Allow, "context_accumulated"),
            PutEnvelope::Conflict { .. } => (Verdict::Deny, "envelope_conflict"),
        };
        vec![AuditDraft {
            details: json!({"tag": tag}),
            ..draft("researcher", "context.fold", "env-race", verdict, reason)
        }]
    })
}

fn step_target(step: &str) -> EscalationTarget {
    EscalationTarget::Step {
        run_id: RunId::parse("run-1").unwrap(),
        step_id: StepId::parse(step).unwrap(),
        request_digest: None,
    }
}

fn escalation(escalation_id: &str, target: EscalationTarget) -> EscalationRecord {
    EscalationRecord {
        escalation_id: escalation_id.to_string(),
        target,
        requested_by: Subject::Agent(id("researcher")),
        operation: "step.begin".to_string(),
        resource: "run-1:s2".to_string(),
        reason: Reason::code("sensitivity_floor"),
        envelope_id: Some(EnvelopeId::parse("env-race").unwrap()),
        envelope_version: Some(3),
        classification: Sensitivity::Restricted,
        obligations: vec![Obligation::ResultLabels {
            labels: vec![Label::parse("pii").unwrap()],
        }],
        request: None,
        status: EscalationStatus::Pending,
        created_at: Timestamp(100),
        resolved_by: None,
        resolved_at: None,
        rejection_reason: None,
        consumed_at: None,
    }
}

fn one_entry<T: 'static>(reason: &'static str) -> AuditFn<T> {
    Box::new(move |_: &T| {
        vec![draft(
            "@operator",
            "escalation",
            "esc",
            Verdict::Allow,
            reason,
        )]
    })
}

/// Every field of an envelope version and of an escalation round-trips,
/// including a delegation target and a free-form text with a NUL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_round_trip_exactly() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let e0 = envelope("env-rt", 0, &["pii"]);
    let e1 = envelope("env-rt", 1, &["pii", "financial"]);
    assert_eq!(
        store
            .put_envelope(e0.clone(), None, envelope_audit(0))
            .await
            .unwrap(),
        PutEnvelope::Written
    );
    assert_eq!(
        store
            .put_envelope(e1.clone(), Some(0), envelope_audit(1))
            .await
            .unwrap(),
        PutEnvelope::Written
    );
    let eid = EnvelopeId::parse("env-rt").unwrap();
    assert_eq!(
        store.get_envelope(eid.clone(), None).await.unwrap(),
        Some(e1)
    );
    assert_eq!(
        store.get_envelope(eid.clone(), Some(0)).await.unwrap(),
        Some(e0)
    );
    assert_eq!(store.get_envelope(eid, Some(u64::MAX)).await.unwrap(), None);

    let target = EscalationTarget::Delegation {
        parent: id("manager"),
        child: id("helper"),
        from_run: Some(RunId::parse("run-9").unwrap()),
        request_digest: None,
    };
    let mut esc = escalation("esc-rt", target.clone());
    esc.resource = "odd\0resource \u{E000}".to_string();
    let o = store
        .put_escalation(esc.clone(), one_entry("created"))
        .await
        .unwrap();
    assert_eq!(o, PutEscalation::Created);
    assert_eq!(
        store.get_escalation("esc-rt".into()).await.unwrap(),
        Some(esc.clone())
    );
    let o = store
        .resolve_escalation(
            "esc-rt".into(),
            EscalationResolution::Reject {
                reason: "too broad\0".into(),
            },
            Subject::Operator,
            Timestamp(200),
            one_entry("rejected"),
        )
        .await
        .unwrap();
    let mut rejected = esc;
    rejected.status = EscalationStatus::Rejected;
    rejected.resolved_by = Some(Subject::Operator);
    rejected.resolved_at = Some(Timestamp(200));
    rejected.rejection_reason = Some("too broad\0".into());
    assert_eq!(o, ResolveEscalation::Resolved(Box::new(rejected.clone())));
    assert_eq!(
        store
            .list_escalations(Some(EscalationStatus::Rejected))
            .await
            .unwrap(),
        vec![rejected]
    );
    assert!(
        store
            .consume_escalation(target, Timestamp(300), one_entry("consume"))
            .await
            .unwrap()
            .is_none()
    );
    // Two envelope writes, create, reject and a consume that found nothing:
    // every outcome's entries were committed.
    assert_eq!(head_count(&store).await, 5);
    assert_chain(&store).await;
}

/// Store instances on one schema (servers, in effect), one connection each.
async fn servers(scratch: &Scratch, n: usize) -> Vec<PgStore> {
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        let s = scratch.store_with(1).await;
        s.audit_head().await.unwrap();
        stores.push(s);
    }
    stores
}

/// 16 servers fold the same envelope version at once: exactly one writes
/// the next version, the others conflict on it, and every attempt is
/// audited in the one chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_envelope_folds_one_winner() {
    let scratch = scratch_or_skip!();
    let setup = scratch.store().await;
    setup
        .put_envelope(envelope("env-race", 0, &[]), None, envelope_audit(999))
        .await
        .unwrap();
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for (i, store) in servers(&scratch, RACERS).await.into_iter().enumerate() {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            // Half of them also try to skip ahead: still only one wins.
            let version = 1 + (i as u64 % 2);
            let label = format!("l{i}");
            let o = store
                .put_envelope(
                    envelope("env-race", version, &[label.as_str()]),
                    Some(0),
                    envelope_audit(i),
                )
                .await
                .unwrap();
            (i, version, o)
        }));
    }
    let mut winners = Vec::new();
    let mut outcomes = Vec::new();
    for t in tasks {
        let (i, version, o) = t.await.unwrap();
        if o == PutEnvelope::Written {
            winners.push((i, version));
        }
        outcomes.push(o);
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let (winner, version) = winners[0];
    for o in outcomes {
        assert!(
            o == PutEnvelope::Written
                || o == PutEnvelope::Conflict {
                    current: Some(version)
                },
            "{o:?}"
        );
    }
    let latest = setup
        .get_envelope(EnvelopeId::parse("env-race").unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.version, version);
    assert!(
        latest
            .labels
            .contains(&Label::parse(&format!("l{winner}")).unwrap())
    );
    assert_eq!(head_count(&setup).await, 1 + RACERS as u64);
    assert_chain(&setup).await;
}

/// 16 servers escalate the same target at once with different ids: one is
/// created, the others get it back, and only it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_escalations_of_one_target_store_one() {
    let scratch = scratch_or_skip!();
    let setup = scratch.store().await;
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for (i, store) in servers(&scratch, RACERS).await.into_iter().enumerate() {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let created: AuditFn<PutEscalation> = Box::new(|o: &PutEscalation| match o {
                PutEscalation::Created => {
                    vec![draft(
                        "researcher",
                        "step.begin",
                        "s2",
                        Verdict::Escalate,
                        "queued",
                    )]
                }
                PutEscalation::Existing(_) => Vec::new(),
            });
            let o = store
                .put_escalation(escalation(&format!("esc-{i}"), step_target("s2")), created)
                .await
                .unwrap();
            (i, o)
        }));
    }
    let mut created = Vec::new();
    let mut existing = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, PutEscalation::Created) => created.push(format!("esc-{i}")),
            (_, PutEscalation::Existing(e)) => existing.push(e.escalation_id),
        }
    }
    assert_eq!(created.len(), 1, "{created:?}");
    assert!(existing.iter().all(|e| *e == created[0]), "{existing:?}");
    let all = setup.list_escalations(None).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].escalation_id, created[0]);
    assert_eq!(head_count(&setup).await, 1);
    assert_chain(&setup).await;
}

/// Concurrent approvals and rejections: exactly one resolves; then
/// concurrent consumers across servers: exactly one gets the approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resolution_and_consumption_happen_once_across_servers() {
    let scratch = scratch_or_skip!();
    let setup = scratch.store().await;
    setup
        .put_escalation(escalation("esc-once", step_target("s3")), one_entry("q"))
        .await
        .unwrap();
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for (i, store) in servers(&scratch, RACERS).await.into_iter().enumerate() {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            // Odd racers reject, even ones approve.
            let resolution = if i % 2 == 0 {
                EscalationResolution::Approve
            } else {
                EscalationResolution::Reject {
                    reason: format!("reviewer {i}"),
                }
            };
            let o = store
                .resolve_escalation(
                    "esc-once".into(),
                    resolution,
                    Subject::Operator,
                    Timestamp(10 + i as i64),
                    one_entry("resolve"),
                )
                .await
                .unwrap();
            (i, o, store)
        }));
    }
    let mut resolved = Vec::new();
    let mut stores = Vec::new();
    for t in tasks {
        let (i, o, store) = t.await.unwrap();
        stores.push(store);
        match o {
            ResolveEscalation::Resolved(e) => resolved.push((i, *e)),
            ResolveEscalation::NotPending(e) => assert_ne!(e.status, EscalationStatus::Pending),
            ResolveEscalation::NotFound => panic!("not found"),
        }
    }
    assert_eq!(resolved.len(), 1, "{resolved:?}");
    let (winner, record) = &resolved[0];
    assert_eq!(record.resolved_at, Some(Timestamp(10 + *winner as i64)));
    if record.status == EscalationStatus::Rejected {
        // Make an approved one to consume.
        setup
            .put_escalation(escalation("esc-once-2", step_target("s3")), one_entry("q"))
            .await
            .unwrap();
        setup
            .resolve_escalation(
                "esc-once-2".into(),
                EscalationResolution::Approve,
                Subject::Operator,
                Timestamp(50),
                one_entry("approve"),
            )
            .await
            .unwrap();
    }
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for store in stores {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let audit: AuditFn<Option<warden_store::ConsumedEscalation>> =
                Box::new(|o: &Option<warden_store::ConsumedEscalation>| match o {
                    Some(_) => vec![draft(
                        "researcher",
                        "step.begin",
                        "s3",
                        Verdict::Allow,
                        "escalation_approved",
                    )],
                    None => Vec::new(),
                });
            store
                .consume_escalation(step_target("s3"), Timestamp(99), audit)
                .await
                .unwrap()
        }));
    }
    let mut consumed = Vec::new();
    for t in tasks {
        if let Some(e) = t.await.unwrap() {
            consumed.push(e);
        }
    }
    assert_eq!(consumed.len(), 1, "{consumed:?}");
    assert_eq!(consumed[0].escalation.status, EscalationStatus::Consumed);
    assert_eq!(consumed[0].escalation.consumed_at, Some(Timestamp(99)));
    let approved = setup
        .list_escalations(Some(EscalationStatus::Approved))
        .await
        .unwrap();
    assert!(approved.is_empty());
    assert_chain(&setup).await;
}

/// A failed operation (an error, not an outcome) stores nothing and
/// appends nothing; the database refuses transitions Warden never makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_change_nothing_and_the_schema_guards_transitions() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store
        .put_escalation(escalation("esc-g", step_target("g")), one_entry("q"))
        .await
        .unwrap();
    let err = store
        .put_escalation(escalation("esc-g", step_target("other")), one_entry("q"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err:?}");
    assert_eq!(head_count(&store).await, 1);
    assert_eq!(store.list_escalations(None).await.unwrap().len(), 1);

    store
        .put_envelope(envelope("env-g", 0, &[]), None, envelope_audit(0))
        .await
        .unwrap();
    let sql = scratch.client().await;
    // pending -> consumed skips the review.
    let err = sql
        .execute(
            "UPDATE escalations SET status = 'consumed', consumed_at = 1, resolved_by = '@operator', \
             resolved_at = 1 WHERE escalation_id = 'esc-g'",
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        db_message(&err).contains("cannot go from pending to consumed"),
        "{err:?}"
    );
    // What was escalated never changes.
    let err = sql
        .execute(
            "UPDATE escalations SET status = 'approved', resolved_by = '@operator', \
             resolved_at = 1, resource = 'else' WHERE escalation_id = 'esc-g'",
            &[],
        )
        .await
        .unwrap_err();
    assert!(db_message(&err).contains("only its status"), "{err:?}");
    assert!(sql.execute("DELETE FROM escalations", &[]).await.is_err());
    assert!(
        sql.execute("UPDATE envelopes SET record = '{}'", &[])
            .await
            .is_err()
    );
    assert!(sql.execute("DELETE FROM envelopes", &[]).await.is_err());
    // A second open escalation for one target cannot be inserted at all.
    let err = sql
        .execute(
            "INSERT INTO escalations (escalation_id, target, requested_by, operation, resource, \
             reason, classification, obligations, status, created_at) \
             SELECT 'esc-h', target, requested_by, operation, resource, reason, classification, \
             obligations, 'pending', 1 FROM escalations WHERE escalation_id = 'esc-g'",
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        db_message(&err).contains("escalations_one_open_per_target"),
        "{err:?}"
    );
    assert_chain(&store).await;
}

fn db_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}
