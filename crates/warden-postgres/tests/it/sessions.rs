//! Tool-call sessions across servers: two store instances on one database
//! (two `warden serve` processes) decide imports one after the other and
//! never lose a session update; the schema refuses rewriting sessions.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;
use warden_core::audit::Digest;
use warden_core::decision::{Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, Sensitivity};
use warden_core::ids::{ActionName, CallId, Label, SessionId};
use warden_core::time::Timestamp;
use warden_postgres::PgStore;
use warden_store::{
    AuditFn, CallRecord, CallStatus, CreateSession, EnvelopeImport, ImportRefusal, IndexChange,
    SessionRecord, SessionState, SessionStatus, SessionUpdate, Store, StoreError, UpdateSession,
};

use crate::support::*;

const WRITERS: usize = 16;

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

fn session(name: &str) -> SessionState {
    SessionState {
        session: SessionRecord {
            session_id: sid(name),
            agent: id("agent"),
            opened_by: Subject::Operator,
            created_at: Timestamp(1),
            policy_version: "pg-1".into(),
            status: SessionStatus::Open,
            closure: None,
            envelope_id: None,
            plan: None,
            imported: None,
            trusted_inputs_hash: Digest::of(name.as_bytes()),
            revision: 1,
        },
        sources: Vec::new(),
        calls: Vec::new(),
    }
}

fn import(session: &str, version: u64) -> EnvelopeImport {
    EnvelopeImport {
        issuer: "partner".into(),
        envelope_id: EnvelopeId::parse("env-remote").unwrap(),
        version,
        restrictions: [Label::parse("no_export").unwrap()].into_iter().collect(),
        sensitivity: Sensitivity::Confidential,
        session_id: sid(session),
        at: Timestamp(2),
    }
}

fn call(name: &str, seq: u64) -> CallRecord {
    CallRecord {
        call_id: CallId::parse(name).unwrap(),
        seq,
        action: ActionName::parse("http.get").unwrap(),
        arguments_hash: Digest::of(name.as_bytes()),
        verdict: Verdict::Allow,
        reason: Reason::code("allowed"),
        detail: json!({}),
        plan_step: None,
        escalation_id: None,
        status: CallStatus::Allowed,
        decided_at: Timestamp(3),
        result_hash: None,
        result_labels: Vec::new(),
        completed_at: None,
    }
}

/// Records a create's outcome with `tag`; `created` tells them apart.
fn tagged(tag: u64) -> AuditFn<CreateSession> {
    Box::new(move |o: &CreateSession| {
        let reason = match o {
            CreateSession::Created => "created",
            _ => "refused",
        };
        vec![warden_core::audit::AuditDraft {
            details: json!({ "tag": tag }),
            ..draft("@operator", "session.open", "s", Verdict::Allow, reason)
        }]
    })
}

async fn open(store: &PgStore, name: &str, version: u64, tag: u64) -> CreateSession {
    let mut state = session(name);
    state.session.imported = Some(import(name, version));
    store
        .create_session(state, None, Some(import(name, version)), tagged(tag))
        .await
        .unwrap()
}

/// Two servers open sessions from one envelope at once. The same version:
/// exactly one creates. Sixteen different versions: the creates happen in
/// commit order with rising versions, and every refusal is a downgrade
/// below a version committed before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn imports_are_decided_once_across_two_servers() {
    let scratch = scratch_or_skip!();
    let servers = [
        Arc::new(scratch.store_with(4).await),
        Arc::new(scratch.store_with(4).await),
    ];
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let (store, barrier) = (Arc::clone(&servers[i % 2]), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            open(&store, &format!("same-{i}"), 1, 0).await
        }));
    }
    let mut created = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            CreateSession::Created => created.push(i),
            CreateSession::ImportRefused(ImportRefusal::Replayed { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(created.len(), 1, "created: {created:?}");
    assert_eq!(servers[0].list_sessions(None, 100).await.unwrap().len(), 1);

    let head = head_count(&servers[0]).await;
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let (store, barrier) = (Arc::clone(&servers[i % 2]), Arc::clone(&barrier));
        let version = 2 + i as u64;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            (
                version,
                open(&store, &format!("v-{version}"), version, version).await,
            )
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            (_, CreateSession::Created) => {}
            (v, CreateSession::ImportRefused(ImportRefusal::Downgraded { seen_version })) => {
                assert!(seen_version > v, "{v} refused against {seen_version}");
            }
            (v, other) => panic!("{v}: {other:?}"),
        }
    }
    // Commit order is the audit order: the versions created rise in it,
    // and each refused one was below the latest created before it.
    let entries = audit_all(&*servers[1]).await;
    let mut latest = 1;
    for e in entries.iter().skip(usize::try_from(head).unwrap()) {
        let v = e.draft.details["tag"].as_u64().unwrap();
        if e.draft.reason == "created" {
            assert!(v > latest, "{v} created after {latest}");
            latest = v;
        } else {
            assert!(v < latest, "{v} refused while the latest was {latest}");
        }
    }
    assert_chain(&servers[0]).await;
}

/// Sixteen writers on two servers each add their own call to one session,
/// and append their own byte to its index, re-reading and retrying on
/// conflict: no update is lost, and no append either (each byte once, in
/// the order the calls were stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_updates_are_never_lost_across_two_servers() {
    let scratch = scratch_or_skip!();
    let servers = [
        Arc::new(scratch.store_with(4).await),
        Arc::new(scratch.store_with(4).await),
    ];
    let o = servers[0]
        .create_session(session("shared"), None, None, Box::new(|_| Vec::new()))
        .await
        .unwrap();
    assert_eq!(o, CreateSession::Created);
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let (store, barrier) = (Arc::clone(&servers[i % 2]), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut conflicts = 0;
            loop {
                let current = store.get_session(sid("shared")).await.unwrap().unwrap();
                let rev = current.session.revision;
                let update = SessionUpdate {
                    session: SessionRecord {
                        revision: rev + 1,
                        ..current.session
                    },
                    sources: Some(IndexChange::Append(vec![u8::try_from(i).unwrap()])),
                    call: Some(call(&format!("c-{i}"), current.calls.len() as u64)),
                };
                match store
                    .update_session(update, rev, Box::new(|_| Vec::new()))
                    .await
                    .unwrap()
                {
                    UpdateSession::Updated => return conflicts,
                    UpdateSession::Conflict { current } => {
                        assert!(current.unwrap() > rev);
                        conflicts += 1;
                    }
                }
            }
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let stored = servers[1]
        .get_session(sid("shared"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.session.revision, 1 + WRITERS as u64);
    let seqs: Vec<u64> = stored.calls.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (0..WRITERS as u64).collect::<Vec<_>>());
    let ids: BTreeSet<String> = stored.calls.iter().map(|c| c.call_id.to_string()).collect();
    assert_eq!(ids.len(), WRITERS);
    let by_seq: Vec<u8> = stored
        .calls
        .iter()
        .map(|c| c.call_id.as_str()[2..].parse().unwrap())
        .collect();
    assert_eq!(stored.sources, by_seq);
    assert_eq!(
        servers[0]
            .get_session(sid("shared"))
            .await
            .unwrap()
            .unwrap(),
        stored
    );
    eprintln!("{conflicts} conflicts retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_refuses_rewriting_sessions() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let mut state = session("s-h");
    state.calls = vec![call("c-h", 0)];
    store
        .create_session(
            state,
            None,
            Some(import("s-h", 1)),
            Box::new(|_| Vec::new()),
        )
        .await
        .unwrap();
    let sql = scratch.client().await;
    for stmt in [
        "UPDATE sessions SET revision = 7",
        "UPDATE sessions SET revision = revision - 1",
        "UPDATE sessions SET session_id = 'other', revision = revision + 1",
        "DELETE FROM sessions",
        "DELETE FROM session_calls",
        "UPDATE envelope_imports SET version = 9",
        "DELETE FROM envelope_imports",
        "INSERT INTO session_calls (session_id, call_id, seq, record) VALUES ('ghost', 'c', 0, '{}')",
    ] {
        assert!(sql.batch_execute(stmt).await.is_err(), "{stmt} was allowed");
    }
    // A row whose columns disagree with its record reads as corrupt.
    sql.batch_execute("UPDATE sessions SET agent = 'someone-else', revision = revision + 1")
        .await
        .unwrap();
    let err = store.get_session(sid("s-h")).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { ref detail, .. } if detail.contains("session `s-h`")),
        "{err:?}"
    );
    assert!(matches!(
        store.list_sessions(None, 10).await,
        Err(StoreError::Corrupt { .. })
    ));
}
