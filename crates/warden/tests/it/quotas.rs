//! The bundle's quotas through the embedded engine, with no server: storage
//! quotas (`max_records`, `max_bytes`) and `max_runs_in_flight` are decided
//! by the engine, checked by the store inside the write's transaction, and
//! recorded.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use warden::{Admission, Engine, ManualClock, StepGate, WriteStatus};
use warden_core::decision::Verdict;
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, QuotaKind, StepStatus, Store};

use crate::support::*;

fn policy() -> String {
    format!(
        "{LAB_POLICY}\nquotas:\n  agents:\n    researcher: {{max_records: 2, max_bytes: 64, max_runs_in_flight: 1}}\n"
    )
}

async fn engine() -> (Engine<MemoryStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let e = Engine::open(
        warden_core::bundle::compile(&policy()).unwrap(),
        MemoryStore::new(),
        clock.clone(),
    )
    .await
    .unwrap();
    (e, clock)
}

async fn owned(e: &Engine<MemoryStore>, owner: &str) -> u64 {
    e.store().owner_usage(id(owner)).await.unwrap().records
}

#[tokio::test]
async fn storage_quotas_stop_growth_not_updates_and_are_recorded() {
    let (e, _) = engine().await;
    let me = id("researcher");
    for k in ["a", "b"] {
        let out = e.write(&me, write_req("notes", k, json!(1))).await.unwrap();
        assert_eq!(out.status, WriteStatus::Done);
    }
    let before = audit(&e).await.len();
    let out = e
        .write(&me, write_req("notes", "c", json!(1)))
        .await
        .unwrap();
    assert_eq!(
        out.status,
        WriteStatus::OverQuota {
            quota: QuotaKind::Records,
            limit: 2,
            used: 2
        }
    );
    assert_eq!(out.decision.verdict, Verdict::Deny);
    assert_eq!(out.decision.reason.as_str(), "quota_max_records");
    assert!(out.record.is_none());
    // Nothing stored, one deny recorded.
    assert_eq!(owned(&e, "researcher").await, 2);
    let log = audit(&e).await;
    assert_eq!(log.len(), before + 1);
    let last = &log[before];
    assert_eq!(
        (last.draft.subject.as_str(), last.draft.reason.as_str()),
        ("researcher", "quota_max_records")
    );
    assert_eq!(last.draft.details["limit"], json!(2));
    // Updates that do not grow past the byte limit still go through.
    let out = e
        .write(&me, write_req("notes", "a", json!(2)))
        .await
        .unwrap();
    assert_eq!(out.status, WriteStatus::Done);
    // Growing a value past max_bytes is refused; the old value stays.
    let big = json!("x".repeat(80));
    let out = e.write(&me, write_req("notes", "a", big)).await.unwrap();
    assert!(matches!(
        out.status,
        WriteStatus::OverQuota {
            quota: QuotaKind::Bytes,
            limit: 64,
            ..
        }
    ));
    assert_eq!(out.decision.reason.as_str(), "quota_max_bytes");
    let stored = e
        .store()
        .get_records(ns("notes"), key("a"), vec![me.clone()])
        .await
        .unwrap();
    assert_eq!(stored[0].value, json!(2));
    // A delete frees room for a new record.
    e.delete(&me, None, ns("notes"), key("b"), None)
        .await
        .unwrap();
    let out = e
        .write(&me, write_req("notes", "c", json!(1)))
        .await
        .unwrap();
    assert_eq!(out.status, WriteStatus::Done);
    // Another agent is not affected.
    let out = e
        .write(&id("report_manager"), write_req("notes", "z", json!(1)))
        .await
        .unwrap();
    assert_eq!(out.status, WriteStatus::Done);
    assert!(verify(&e).await > 0);
}

#[tokio::test]
async fn concurrent_creates_by_one_agent_never_exceed_max_records() {
    let (e, _) = engine().await;
    let me = id("researcher");
    let writes = (0..16).map(|i| {
        let e = e.clone();
        let me = me.clone();
        tokio::spawn(async move {
            e.write(&me, write_req("notes", &format!("k{i}"), json!(i)))
                .await
                .unwrap()
                .status
        })
    });
    let mut done = 0;
    let mut refused = 0;
    for w in writes {
        match w.await.unwrap() {
            WriteStatus::Done => done += 1,
            WriteStatus::OverQuota { .. } => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((done, refused), (2, 14));
    assert_eq!(owned(&e, "researcher").await, 2);
    let denials = audit(&e)
        .await
        .iter()
        .filter(|a| a.draft.reason == "quota_max_records")
        .count();
    assert_eq!(denials, 14);
}

#[tokio::test]
async fn a_memory_step_over_quota_fails_the_step_and_writes_nothing() {
    let (e, _) = engine().await;
    let me = id("researcher");
    for k in ["a", "b"] {
        e.write(&me, write_req("notes", k, json!(1))).await.unwrap();
    }
    let s = sop(
        &e,
        r#"{"sop_id":"m","version":1,"steps":[{"step_id":"w","action":"memory.write","arguments":{"namespace":"notes","key":"c","value":1}}]}"#,
    );
    let Admission::Admitted { run, .. } = e.admit_run(&me, &s, None).await.unwrap() else {
        panic!("not admitted")
    };
    match e
        .begin_step(&me, &run.run_id, &run.steps[0].step_id)
        .await
        .unwrap()
    {
        StepGate::Executed { outcome, .. } => {
            assert_eq!(outcome.status, StepStatus::Failed);
            assert_eq!(outcome.error.as_deref(), Some("quota_max_records"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(owned(&e, "researcher").await, 2);
}

#[tokio::test]
async fn runs_in_flight_are_limited_until_a_run_finishes_or_expires() {
    let (e, clock) = engine().await;
    let me = id("researcher");
    let s = example_sop(&e, "valid-report");
    let run = |r: &str| warden_core::ids::RunId::parse(r).unwrap();
    assert!(matches!(
        e.admit_run(&me, &s, Some(run("r1"))).await.unwrap(),
        Admission::Admitted {
            existing: false,
            ..
        }
    ));
    let before = audit(&e).await.len();
    match e.admit_run(&me, &s, Some(run("r2"))).await.unwrap() {
        Admission::OverQuota {
            decision,
            limit,
            in_flight,
            ..
        } => {
            assert_eq!((limit, in_flight), (1, 1));
            assert_eq!(decision.reason.as_str(), "quota_max_runs_in_flight");
        }
        other => panic!("{other:?}"),
    }
    // Only the refusal is recorded, and no run was created.
    let log = audit(&e).await;
    assert_eq!(log.len(), before + 1);
    assert_eq!(log[before].draft.reason, "quota_max_runs_in_flight");
    assert!(e.store().get_run(run("r2")).await.unwrap().is_none());
    // Re-admitting the run in flight is idempotent, not a new run.
    assert!(matches!(
        e.admit_run(&me, &s, Some(run("r1"))).await.unwrap(),
        Admission::Admitted { existing: true, .. }
    ));
    // Finishing r1 (every step recorded) frees the slot.
    let (handlers, _) = recording_handlers();
    let report = e
        .execute_sop(&me, &s, &handlers, Some(run("r1")))
        .await
        .unwrap();
    assert!(report.completed);
    assert!(matches!(
        e.admit_run(&me, &s, Some(run("r2"))).await.unwrap(),
        Admission::Admitted {
            existing: false,
            ..
        }
    ));
    // An abandoned run stops counting after the run TTL.
    e.set_run_ttl(Duration::from_secs(60));
    assert!(matches!(
        e.admit_run(&me, &s, Some(run("r3"))).await.unwrap(),
        Admission::OverQuota { .. }
    ));
    clock.advance(61_000);
    assert!(matches!(
        e.admit_run(&me, &s, Some(run("r3"))).await.unwrap(),
        Admission::Admitted {
            existing: false,
            ..
        }
    ));
}
