//! Change notifications across store instances (servers).

use std::time::Duration;

use warden_core::audit::Digest;
use warden_core::hierarchy::AgentStatus;
use warden_core::time::Timestamp;
use warden_postgres::{Change, ChangeEvent, ChangeKind, ChangeStream};
use warden_store::{Store, StoreError, TokenRecord, TokenSubject};

use crate::support::*;

/// How long a change may take to arrive before the test fails.
const DEADLINE: Duration = Duration::from_secs(15);

async fn next_event(stream: &mut ChangeStream) -> ChangeEvent {
    match tokio::time::timeout(DEADLINE, stream.recv()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("the change stream ended"),
        Err(_) => panic!("no change event within {DEADLINE:?}"),
    }
}

async fn next_change(stream: &mut ChangeStream) -> Change {
    match next_event(stream).await {
        ChangeEvent::Change(c) => c,
        other => panic!("expected a change, got {other:?}"),
    }
}

fn change(seq: u64, kind: ChangeKind, ids: &[&str]) -> Change {
    Change {
        seq,
        kind,
        ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

fn token(token_id: &str) -> TokenRecord {
    TokenRecord {
        token_id: token_id.into(),
        hash: Digest::of(token_id.as_bytes()),
        subject: TokenSubject::Agent(id("root")),
        created_at: Timestamp(1),
        revoked: false,
    }
}

/// A change made through one store instance is observed through another
/// instance's subscription, every kind, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_on_one_instance_reach_another() {
    let scratch = scratch_or_skip!();
    let a = scratch.store().await;
    let b = scratch.store().await;
    let mut stream = a.subscribe().await.unwrap();
    assert_eq!(stream.start_seq(), 0);
    b.insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut stream).await,
        change(1, ChangeKind::AgentInserted, &["root"])
    );
    // The node re-reads what the change names.
    let fresh = a.agents_by_id(&[id("root")]).await.unwrap();
    assert_eq!(fresh, vec![agent("root", None)]);

    b.insert_agent(agent("kid", Some("root")), register("kid"))
        .await
        .unwrap();
    b.set_agent_status(vec![id("root"), id("kid")], AgentStatus::Revoked, vec![])
        .await
        .unwrap();
    let caps = ["memory.read"].into_iter().map(action).collect();
    b.set_agent_capabilities(id("kid"), caps, vec![])
        .await
        .unwrap();
    b.insert_token(token("tok-1"), vec![]).await.unwrap();
    assert!(b.revoke_token("tok-1".into(), vec![]).await.unwrap());
    let expected = [
        change(2, ChangeKind::AgentInserted, &["kid"]),
        change(3, ChangeKind::AgentStatus, &["root", "kid"]),
        change(4, ChangeKind::AgentCapabilities, &["kid"]),
        change(5, ChangeKind::TokenInserted, &["tok-1"]),
        change(6, ChangeKind::TokenRevoked, &["tok-1"]),
    ];
    for e in expected {
        assert_eq!(next_change(&mut stream).await, e);
    }
    assert_eq!(a.change_head().await.unwrap(), 6);
}

/// Failed operations record no change and send no notification; memory
/// writes and plain appends are not changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_committed_agent_and_token_changes_are_changes() {
    let scratch = scratch_or_skip!();
    let a = scratch.store().await;
    let b = scratch.store().await;
    let mut stream = a.subscribe().await.unwrap();
    b.insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    assert!(matches!(
        b.insert_agent(agent("root", None), register("root")).await,
        Err(StoreError::Duplicate { .. })
    ));
    assert!(
        b.set_agent_status(vec![id("ghost")], AgentStatus::Revoked, vec![])
            .await
            .is_err()
    );
    assert!(!b.revoke_token("nope".into(), vec![]).await.unwrap());
    b.put_record(
        put("root", "ns", "k", serde_json::json!(1), None),
        Timestamp(1),
        warden_store::StorageQuota::default(),
        put_audit("root", "k", 0),
    )
    .await
    .unwrap();
    b.append_audit(vec![numbered(1)]).await.unwrap();
    b.insert_token(token("marker"), vec![]).await.unwrap();
    assert_eq!(
        next_change(&mut stream).await,
        change(1, ChangeKind::AgentInserted, &["root"])
    );
    // The next change is the marker: nothing in between was recorded.
    assert_eq!(
        next_change(&mut stream).await,
        change(2, ChangeKind::TokenInserted, &["marker"])
    );
    assert_eq!(
        a.changes_since(0, 100).await.unwrap(),
        vec![
            change(1, ChangeKind::AgentInserted, &["root"]),
            change(2, ChangeKind::TokenInserted, &["marker"])
        ]
    );
    assert_eq!(a.changes_since(1, 100).await.unwrap().len(), 1);
    assert_eq!(a.changes_since(0, 1).await.unwrap().len(), 1);
    assert!(a.changes_since(2, 100).await.unwrap().is_empty());
}

/// A revocation naming more ids than fit a notification arrives whole (the
/// stream reads the ids from the table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_changes_arrive_whole() {
    let scratch = scratch_or_skip!();
    let a = scratch.store().await;
    let b = scratch.store_with(2).await;
    let names: Vec<String> = (0..100)
        .map(|i| format!("agent-with-a-long-identifier-{i:04}"))
        .collect();
    for n in &names {
        b.insert_agent(agent(n, None), vec![]).await.unwrap();
    }
    let mut stream = a.subscribe().await.unwrap();
    assert_eq!(stream.start_seq(), 100);
    let ids = names.iter().map(|n| id(n)).collect();
    b.set_agent_status(ids, AgentStatus::Revoked, vec![])
        .await
        .unwrap();
    let got = next_change(&mut stream).await;
    assert_eq!(got.seq, 101);
    assert_eq!(got.kind, ChangeKind::AgentStatus);
    assert_eq!(got.ids, names);
}

/// `subscribe_from` replays what is stored after a sequence number, says
/// it has caught up, then streams new changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_from_replays_then_streams() {
    let scratch = scratch_or_skip!();
    let a = scratch.store().await;
    for n in ["a1", "a2", "a3"] {
        a.insert_agent(agent(n, None), vec![]).await.unwrap();
    }
    let mut stream = a.subscribe_from(1).await.unwrap();
    assert_eq!(next_change(&mut stream).await.ids, ["a2"]);
    assert_eq!(next_change(&mut stream).await.ids, ["a3"]);
    assert_eq!(
        next_event(&mut stream).await,
        ChangeEvent::Resumed { seq: 3 }
    );
    a.insert_agent(agent("a4", None), vec![]).await.unwrap();
    assert_eq!(
        next_change(&mut stream).await,
        change(4, ChangeKind::AgentInserted, &["a4"])
    );
}

/// When the listening connection is killed, the stream says so, reconnects,
/// and delivers the changes made meanwhile, without gaps or repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listener_reconnects_and_catches_up() {
    let scratch = scratch_or_skip!();
    let a = scratch.store().await;
    let b = scratch.store().await;
    let mut stream = a.subscribe().await.unwrap();
    b.insert_agent(agent("before", None), vec![]).await.unwrap();
    assert_eq!(next_change(&mut stream).await.ids, ["before"]);

    let sql = raw_client(&scratch.url).await;
    let app = format!("warden-listen:{}", scratch.schema);
    let killed: i64 = sql
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1) t",
            &[&app],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    assert_eq!(next_event(&mut stream).await, ChangeEvent::Disconnected);
    // Made while the listener is down (or reconnecting).
    b.insert_agent(agent("during", None), vec![]).await.unwrap();
    b.insert_token(token("tok-during"), vec![]).await.unwrap();
    let mut seen = Vec::new();
    let mut resumed = false;
    while seen.len() < 2 {
        match next_event(&mut stream).await {
            ChangeEvent::Change(c) => seen.push(c),
            ChangeEvent::Resumed { seq } => {
                assert!(seq >= 1);
                resumed = true;
            }
            ChangeEvent::Disconnected => panic!("disconnected twice"),
        }
    }
    assert!(resumed || matches!(next_event(&mut stream).await, ChangeEvent::Resumed { .. }));
    assert_eq!(
        seen,
        vec![
            change(2, ChangeKind::AgentInserted, &["during"]),
            change(3, ChangeKind::TokenInserted, &["tok-during"])
        ]
    );
    b.insert_agent(agent("after", None), vec![]).await.unwrap();
    assert_eq!(
        next_change(&mut stream).await,
        change(4, ChangeKind::AgentInserted, &["after"])
    );
}

/// A change whose notification never came (inserted here without NOTIFY)
/// is still delivered, by the listener's periodic check of the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_notification_is_caught_by_the_heartbeat() {
    let scratch = scratch_or_skip!();
    let options = warden_postgres::PgOptions {
        listen_heartbeat: Duration::from_millis(200),
        ..scratch.options(2)
    };
    let a = warden_postgres::PgStore::connect_with(&scratch.url, options)
        .await
        .unwrap();
    let mut stream = a.subscribe().await.unwrap();
    let sql = scratch.client().await;
    sql.batch_execute(
        "INSERT INTO changes (seq, kind, ids) VALUES (1, 'agent_status', '{silent}')",
    )
    .await
    .unwrap();
    assert_eq!(
        next_change(&mut stream).await,
        change(1, ChangeKind::AgentStatus, &["silent"])
    );
    // Notifications keep working after it.
    a.insert_agent(agent("loud", None), vec![]).await.unwrap();
    assert_eq!(
        next_change(&mut stream).await,
        change(2, ChangeKind::AgentInserted, &["loud"])
    );
}
