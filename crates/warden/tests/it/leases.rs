//! Step leases: the first `begin` of a client-executed step holds it in the
//! store; every other `begin` is `in_progress` until the lease lapses, only
//! the holder records the outcome, and after expiry another worker takes
//! the step over. Evidence: gate answers, stored run state, the log.

use std::sync::Arc;

use serde_json::json;
use warden::{Admission, Completion, Engine, EngineError, ManualClock, StepGate, StepResult};
use warden_core::ids::{RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, Store};

use crate::support::*;

/// The lab bundle with a one-minute step lease.
pub(crate) fn policy() -> String {
    let p = LAB_POLICY.replacen("limits:\n", "limits:\n  step_lease_ms: 60000\n", 1);
    if p == LAB_POLICY {
        format!("{LAB_POLICY}\nlimits:\n  step_lease_ms: 60000\n")
    } else {
        p
    }
}

async fn engine() -> (Engine<MemoryStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let policy = warden_core::bundle::compile(&policy()).unwrap();
    let e = Engine::open(policy, MemoryStore::new(), clock.clone())
        .await
        .unwrap();
    (e, clock)
}

pub(crate) fn rid(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

pub(crate) fn sid(s: &str) -> StepId {
    StepId::parse(s).unwrap()
}

pub(crate) async fn admit<S: Store>(e: &Engine<S>, run: &str) {
    let sop = warden_core::sop::parse_sop(
        &json!({"sop_id": "save", "version": 1, "steps": [
            {"step_id": "save", "action": "artifact.save", "arguments": {"path": "internal/a.txt"}},
            {"step_id": "again", "action": "artifact.save", "arguments": {"path": "internal/b.txt"}},
        ]})
        .to_string(),
        &e.policy().sop_limits,
    )
    .unwrap();
    match e
        .admit_run(&id("researcher"), &sop, Some(rid(run)))
        .await
        .unwrap()
    {
        Admission::Admitted { .. } => {}
        other => panic!("{other:?}"),
    }
}

pub(crate) fn ok() -> StepResult {
    StepResult {
        result: Some(json!({"saved": true})),
        ..StepResult::default()
    }
}

pub(crate) fn proceed(g: StepGate) -> (String, Timestamp) {
    match g {
        StepGate::Proceed {
            lease_id,
            lease_expires_at,
            ..
        } => (lease_id, lease_expires_at),
        other => panic!("expected proceed: {other:?}"),
    }
}

/// Eight concurrent begins of one client-executed step: exactly one may
/// run it; the other seven are `in_progress` with its lease's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_begins_let_exactly_one_worker_run_the_step() {
    let (e, _) = engine().await;
    admit(&e, "run-race").await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let e = e.clone();
            tokio::spawn(async move {
                e.begin_step(&id("researcher"), &rid("run-race"), &sid("save"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut proceeded = Vec::new();
    let mut in_progress = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            g @ StepGate::Proceed { .. } => proceeded.push(proceed(g)),
            StepGate::InProgress {
                decision,
                lease_expires_at,
            } => {
                assert_eq!(decision.reason.as_str(), "step_in_progress");
                in_progress.push(lease_expires_at);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(proceeded.len(), 1, "exactly one begin proceeds");
    assert_eq!(in_progress.len(), 7);
    let (holder, expires) = proceeded.remove(0);
    assert!(in_progress.iter().all(|t| *t == expires));
    assert_eq!(expires, Timestamp(1_700_000_000_000 + 60_000));
    let state = e.store().get_run(rid("run-race")).await.unwrap().unwrap();
    let lease = state.leases.get(&sid("save")).unwrap();
    assert_eq!(lease.holder, holder);
    assert_eq!(lease.expires_at, expires);
    let refusals = audit(&e)
        .await
        .iter()
        .filter(|x| x.draft.reason.as_str() == "step_in_progress")
        .count();
    assert_eq!(refusals, 7, "every in_progress answer is recorded");
}

/// Only the holder records the outcome: another lease id is refused
/// (recorded, nothing stored); the holder, named by its lease id, completes.
/// The holder may begin its own step again after a crash.
#[tokio::test]
async fn only_the_lease_holder_completes_the_step() {
    let (e, _) = engine().await;
    admit(&e, "run-hold").await;
    let me = id("researcher");
    let (holder, _) = proceed(
        e.begin_step_as(&me, &rid("run-hold"), &sid("save"), Some("worker-a"))
            .await
            .unwrap(),
    );
    assert_eq!(holder, "worker-a");
    // Another worker's begin and completion are refused.
    assert!(matches!(
        e.begin_step_as(&me, &rid("run-hold"), &sid("save"), Some("worker-b"))
            .await
            .unwrap(),
        StepGate::InProgress { .. }
    ));
    let head = e.store().audit_head().await.unwrap().count;
    let out = e
        .complete_begun_step_as(&me, &rid("run-hold"), &sid("save"), Some("worker-b"), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::LeaseHeld { .. }), "{out:?}");
    let state = e.store().get_run(rid("run-hold")).await.unwrap().unwrap();
    assert!(state.outcomes.is_empty(), "nothing recorded");
    let entries = audit(&e).await;
    assert_eq!(entries.len() as u64, head + 1);
    assert_eq!(
        entries.last().unwrap().draft.reason.as_str(),
        "step_lease_held"
    );
    // The embedding API refuses a non-holder too.
    let err = e
        .complete_step(&id("researcher"), &rid("run-hold"), &sid("again"), ok())
        .await;
    assert!(err.is_ok(), "a step nobody leased completes (bypass path)");
    // The holder begins again (its crash-restart) and completes.
    let (again, _) = proceed(
        e.begin_step_as(&me, &rid("run-hold"), &sid("save"), Some("worker-a"))
            .await
            .unwrap(),
    );
    assert_eq!(again, "worker-a");
    let out = e
        .complete_begun_step_as(&me, &rid("run-hold"), &sid("save"), Some("worker-a"), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::Recorded(_)), "{out:?}");
    // Recorded: every later begin replays, nobody runs it again.
    assert!(matches!(
        e.begin_step_as(&me, &rid("run-hold"), &sid("save"), Some("worker-b"))
            .await
            .unwrap(),
        StepGate::Replay { .. }
    ));
}

/// After the lease lapses another worker takes the step over; the old
/// holder can then no longer record its outcome.
#[tokio::test]
async fn an_expired_lease_is_taken_over() {
    let (e, clock) = engine().await;
    admit(&e, "run-late").await;
    let me = id("researcher");
    let (first, expires) = proceed(
        e.begin_step(&me, &rid("run-late"), &sid("save"))
            .await
            .unwrap(),
    );
    clock.advance(59_999);
    assert!(matches!(
        e.begin_step(&me, &rid("run-late"), &sid("save"))
            .await
            .unwrap(),
        StepGate::InProgress { lease_expires_at, .. } if lease_expires_at == expires
    ));
    clock.advance(1);
    let (second, _) = proceed(
        e.begin_step(&me, &rid("run-late"), &sid("save"))
            .await
            .unwrap(),
    );
    assert_ne!(first, second);
    // The first worker comes back: refused, nothing recorded.
    let out = e
        .complete_begun_step_as(&me, &rid("run-late"), &sid("save"), Some(&first), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::LeaseHeld { .. }), "{out:?}");
    let out = e
        .complete_begun_step_as(&me, &rid("run-late"), &sid("save"), Some(&second), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::Recorded(_)), "{out:?}");
}

/// One in-memory store shared by two engines, as one database is by two
/// servers.
#[derive(Clone, Default)]
struct Shared {
    inner: Arc<MemoryStore>,
}

warden_store::forward_store!(impl Store for Shared => field inner);

/// Two engines over one store (two servers sharing a database): the lease
/// one took is seen by the other, which runs nothing; the holder completes
/// on the other engine by presenting its lease id, and a non-holder is
/// refused there.
#[tokio::test]
async fn a_second_engine_on_the_same_store_sees_the_lease() {
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let store = Shared::default();
    let a = Engine::open(
        warden_core::bundle::compile(&policy()).unwrap(),
        store.clone(),
        clock.clone(),
    )
    .await
    .unwrap();
    let b = Engine::open(
        warden_core::bundle::compile(&policy()).unwrap(),
        store,
        clock,
    )
    .await
    .unwrap();
    admit(&a, "run-two").await;
    let me = id("researcher");
    let (holder, _) = proceed(
        a.begin_step(&me, &rid("run-two"), &sid("save"))
            .await
            .unwrap(),
    );
    assert!(matches!(
        b.begin_step(&me, &rid("run-two"), &sid("save"))
            .await
            .unwrap(),
        StepGate::InProgress { .. }
    ));
    let err = b
        .complete_step(&me, &rid("run-two"), &sid("save"), ok())
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Conflict { .. }),
        "a non-holder's completion is refused: {err:?}"
    );
    let out = b
        .complete_begun_step_as(&me, &rid("run-two"), &sid("save"), None, ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::LeaseHeld { .. }), "{out:?}");
    let out = b
        .complete_begun_step_as(&me, &rid("run-two"), &sid("save"), Some(&holder), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::Recorded(_)), "{out:?}");
    assert!(matches!(
        a.begin_step(&me, &rid("run-two"), &sid("save"))
            .await
            .unwrap(),
        StepGate::Replay { .. }
    ));
}

/// `limits.step_lease_ms` is bounded: outside a second to a day the bundle
/// is refused, naming the field.
#[test]
fn the_lease_length_is_bounded() {
    for bad in ["0", "999", "86400001"] {
        let p = policy().replace("step_lease_ms: 60000", &format!("step_lease_ms: {bad}"));
        let err = warden_core::bundle::compile(&p).unwrap_err();
        assert!(err.to_string().contains("limits.step_lease_ms"), "{err}");
    }
}
