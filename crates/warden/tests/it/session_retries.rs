//! A call without a call id retried after its hold timed out: once the
//! escalation is approved, the retry takes up the held call and proceeds
//! once, on another engine over the same store (another server) and after
//! a restart, since the held call and its escalation are stored; a second
//! retry escalates afresh; of retries racing for one approval exactly one
//! proceeds. On every backend.

use std::future::Future;
use std::sync::Arc;

use serde_json::{Value, json};
use warden::{CallAnswer, CallResult, Caller, Engine, ManualClock, OpenSession, ProposedCall};
use warden_core::audit::AuditEntry;
use warden_core::decision::Verdict;
use warden_core::ids::{CallId, SessionId};
use warden_core::time::Timestamp;
use warden_store::{CallStatus, EscalationStatus, EscalationTarget, Store};

use super::sessions::{SESSION_POLICY, Shared};
use super::support::id;

const LANDLORD: &str = "GB29NWBK60161331926819";

async fn engine_on<S: Store>(store: S) -> Engine<S> {
    Engine::open(
        warden_core::bundle::compile(SESSION_POLICY).unwrap(),
        store,
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap()
}

fn agent() -> Caller {
    Caller::Agent(id("agent"))
}

fn pay() -> Value {
    json!({"recipient": LANDLORD, "amount": 98.7})
}

/// `send_money` to the landlord without a call id: what an MCP client
/// sends, every time.
async fn pay_without_id<S: Store>(engine: &Engine<S>, s: &SessionId) -> CallAnswer {
    engine
        .session_call(
            &agent(),
            s,
            ProposedCall {
                call_id: None,
                action: "send_money".into(),
                arguments: pay(),
            },
        )
        .await
        .unwrap()
}

/// A session whose only source of the landlord's account is a file (an
/// untrusted result), so paying it escalates.
async fn session_with_the_bill<S: Store>(engine: &Engine<S>, name: &str) -> SessionId {
    let s = SessionId::parse(name).unwrap();
    engine
        .open_session(
            &agent(),
            OpenSession {
                session_id: Some(s.clone()),
                trusted_inputs: vec![json!("Read the bill and pay it")],
                ..OpenSession::default()
            },
        )
        .await
        .unwrap();
    let read = CallId::parse("c-read").unwrap();
    let answer = engine
        .session_call(
            &agent(),
            &s,
            ProposedCall {
                call_id: Some(read.clone()),
                action: "read_file".into(),
                arguments: json!({"file_path": "bill.txt"}),
            },
        )
        .await
        .unwrap();
    assert_eq!(answer.call.verdict, Verdict::Allow);
    engine
        .record_call_result(
            &agent(),
            &s,
            &read,
            CallResult {
                result: json!(format!("Pay to {LANDLORD}")),
                ..CallResult::default()
            },
        )
        .await
        .unwrap();
    s
}

async fn calls<S: Store>(engine: &Engine<S>, s: &SessionId) -> Vec<(CallId, CallStatus)> {
    let state = engine
        .store()
        .get_session(s.clone())
        .await
        .unwrap()
        .unwrap();
    state
        .calls
        .iter()
        .map(|c| (c.call_id.clone(), c.status))
        .collect()
}

async fn log<S: Store>(engine: &Engine<S>) -> Vec<AuditEntry> {
    engine.store().audit_page(0, usize::MAX).await.unwrap()
}

/// The entries of `operation` with `reason` about `resource`.
fn entries<'a>(
    log: &'a [AuditEntry],
    operation: &str,
    reason: &str,
    resource: &str,
) -> Vec<&'a AuditEntry> {
    log.iter()
        .filter(|e| {
            e.draft.operation == operation
                && e.draft.reason == reason
                && e.draft.resource == resource
        })
        .collect()
}

/// Escalate, give up waiting, approve, retry without a call id on a second
/// engine over the same store (`reopen`: another server, or the server
/// restarted): the held call proceeds once; a second retry escalates
/// afresh and takes up nothing.
async fn a_retry_after_approval_proceeds_once<S, F, Fut>(reopen: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let first = engine_on(reopen().await).await;
    let s = session_with_the_bill(&first, "s-retry").await;
    let held = pay_without_id(&first, &s).await;
    assert_eq!(held.call.verdict, Verdict::Escalate);
    assert_eq!(held.call.status, CallStatus::Escalated);
    let held_id = held.call.call_id.clone();
    let escalation = held.call.escalation_id.clone().unwrap();
    // The holder gave up waiting (the gateway's hold timed out); the
    // process that held it goes away.
    drop(first);

    let second = engine_on(reopen().await).await;
    second
        .approve_escalation(&escalation, &Caller::Operator)
        .await
        .unwrap();
    let before = calls(&second, &s).await;
    assert_eq!(
        before,
        vec![
            (CallId::parse("c-read").unwrap(), CallStatus::Completed),
            (held_id.clone(), CallStatus::Escalated)
        ]
    );

    let retry = pay_without_id(&second, &s).await;
    assert_eq!(retry.call.verdict, Verdict::Allow);
    assert_eq!(retry.call.reason.as_str(), "escalation_approved");
    assert!(!retry.replayed);
    assert_eq!(retry.call.call_id, held_id, "the retry is the held call");
    assert_eq!(retry.call.seq, 1);
    // Stored: the held call allowed (no new call), its approval used.
    assert_eq!(
        calls(&second, &s).await,
        vec![
            (CallId::parse("c-read").unwrap(), CallStatus::Completed),
            (held_id.clone(), CallStatus::Allowed)
        ]
    );
    let e = second.escalation(&escalation).await.unwrap();
    assert_eq!(e.status, EscalationStatus::Consumed);
    let resource = format!("{s}:{held_id}");
    let entries_now = log(&second).await;
    assert_eq!(
        entries(
            &entries_now,
            "session.call",
            "escalation_consumed",
            &resource
        )
        .len(),
        1
    );

    // A second retry: the approval is used; it is a new call, held afresh.
    let again = pay_without_id(&second, &s).await;
    assert_eq!(again.call.verdict, Verdict::Escalate);
    assert_ne!(again.call.call_id, held_id);
    let fresh = again.call.escalation_id.clone().unwrap();
    assert_ne!(fresh, escalation);
    assert_eq!(
        second.escalation(&fresh).await.unwrap().status,
        EscalationStatus::Pending
    );
    assert_eq!(
        second.escalation(&escalation).await.unwrap().status,
        EscalationStatus::Consumed
    );
    let after = calls(&second, &s).await;
    assert_eq!(after.len(), 3);
    assert_eq!(after[1], (held_id.clone(), CallStatus::Allowed));
    assert_eq!(
        after[2],
        (again.call.call_id.clone(), CallStatus::Escalated)
    );

    // A retry with a call id of its own is that call: an approval of
    // another call is not taken up by it.
    second
        .approve_escalation(&fresh, &Caller::Operator)
        .await
        .unwrap();
    let own = second
        .session_call(
            &agent(),
            &s,
            ProposedCall {
                call_id: Some(CallId::parse("c-own").unwrap()),
                action: "send_money".into(),
                arguments: pay(),
            },
        )
        .await
        .unwrap();
    assert_eq!(own.call.verdict, Verdict::Escalate);
    assert_eq!(
        second.escalation(&fresh).await.unwrap().status,
        EscalationStatus::Approved
    );
    // A rejected hold is never taken up: the retry is held afresh.
    let own_escalation = own.call.escalation_id.clone().unwrap();
    second
        .reject_escalation(&own_escalation, &Caller::Operator, "not this one")
        .await
        .unwrap();
    let v = second.verify_audit().await.unwrap();
    assert!(v.is_valid(), "{v:?}");
}

/// Two engines over one store (two servers) retry the same held call at
/// once, `rounds` times: each time exactly one proceeds (the held call),
/// the other is a new call held afresh, and the approval is consumed once.
async fn racing_retries_proceed_once<S, F, Fut>(reopen: F, rounds: usize)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let a = engine_on(reopen().await).await;
    let b = engine_on(reopen().await).await;
    for round in 0..rounds {
        let s = session_with_the_bill(&a, &format!("s-race-{round}")).await;
        let held = pay_without_id(&a, &s).await;
        assert_eq!(held.call.status, CallStatus::Escalated);
        let held_id = held.call.call_id.clone();
        let escalation = held.call.escalation_id.clone().unwrap();
        b.approve_escalation(&escalation, &Caller::Operator)
            .await
            .unwrap();

        let (x, y) = tokio::join!(pay_without_id(&a, &s), pay_without_id(&b, &s));
        let proceeded: Vec<&CallAnswer> = [&x, &y]
            .into_iter()
            .filter(|r| r.call.verdict == Verdict::Allow)
            .collect();
        assert_eq!(proceeded.len(), 1, "round {round}: {x:?} / {y:?}");
        assert_eq!(proceeded[0].call.call_id, held_id);
        let other = if x.call.verdict == Verdict::Allow {
            &y
        } else {
            &x
        };
        assert_eq!(other.call.verdict, Verdict::Escalate);
        assert_ne!(other.call.call_id, held_id);
        assert_ne!(
            other.call.escalation_id.as_deref(),
            Some(escalation.as_str())
        );

        let stored = calls(&a, &s).await;
        assert_eq!(stored.len(), 3, "round {round}: {stored:?}");
        assert_eq!(
            stored
                .iter()
                .filter(|(_, st)| *st == CallStatus::Allowed)
                .map(|(c, _)| c.clone())
                .collect::<Vec<_>>(),
            vec![held_id.clone()]
        );
        assert_eq!(
            a.escalation(&escalation).await.unwrap().status,
            EscalationStatus::Consumed
        );
        let resource = format!("{s}:{held_id}");
        let entries_now = log(&b).await;
        assert_eq!(
            entries(
                &entries_now,
                "session.call",
                "escalation_consumed",
                &resource
            )
            .len(),
            1
        );
        // Exactly one pending escalation of this session: the loser's.
        let pending: Vec<_> = a
            .list_escalations(Some(EscalationStatus::Pending))
            .await
            .unwrap()
            .into_iter()
            .filter(|e| matches!(&e.target, EscalationTarget::Call { session_id, .. } if *session_id == s))
            .collect();
        assert_eq!(pending.len(), 1, "round {round}");
    }
    let v = a.verify_audit().await.unwrap();
    assert!(v.is_valid(), "{v:?}");
}

#[tokio::test]
async fn a_retry_proceeds_once_on_the_memory_store() {
    let shared = Shared::default();
    a_retry_after_approval_proceeds_once(|| {
        let s = shared.clone();
        async move { s }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_proceed_once_on_the_memory_store() {
    let shared = Shared::default();
    racing_retries_proceed_once(
        || {
            let s = shared.clone();
            async move { s }
        },
        8,
    )
    .await;
}

fn sqlite_url(name: &str) -> (std::path::PathBuf, String) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!("warden-{name}-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("w.db").display());
    (dir, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_proceeds_once_on_sqlite_after_a_restart() {
    let (dir, url) = sqlite_url("retry");
    a_retry_after_approval_proceeds_once(|| {
        let url = url.clone();
        async move { warden_sqlite::SqliteStore::open(&url).await.unwrap() }
    })
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_proceed_once_on_sqlite() {
    let (dir, url) = sqlite_url("race");
    racing_retries_proceed_once(
        || {
            let url = url.clone();
            async move { warden_sqlite::SqliteStore::open(&url).await.unwrap() }
        },
        8,
    )
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
}

fn postgres_url() -> Option<String> {
    let url = std::env::var("WARDEN_TEST_DATABASE_URL")
        .ok()
        .filter(|s| !s.trim().is_empty());
    if url.is_none() {
        eprintln!("skipped: WARDEN_TEST_DATABASE_URL is not set");
    }
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_proceeds_once_on_postgres_on_another_server() {
    let Some(url) = postgres_url() else { return };
    let schema = super::model::fresh_schema();
    a_retry_after_approval_proceeds_once(|| {
        let (url, schema) = (url.clone(), schema.clone());
        async move {
            warden_postgres::PgStore::connect_in_schema(&url, &schema)
                .await
                .unwrap()
        }
    })
    .await;
    super::model::drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_on_two_servers_proceed_once_on_postgres() {
    let Some(url) = postgres_url() else { return };
    let schema = super::model::fresh_schema();
    racing_retries_proceed_once(
        || {
            let (url, schema) = (url.clone(), schema.clone());
            async move {
                warden_postgres::PgStore::connect_in_schema(&url, &schema)
                    .await
                    .unwrap()
            }
        },
        12,
    )
    .await;
    super::model::drop_schema(&url, &schema).await;
}
