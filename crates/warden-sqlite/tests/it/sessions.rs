//! Tool-call sessions: what a restart must not forget (rows, calls, source
//! bytes, imports), values SQLite cannot hold, atomicity with the audit
//! log, and the schema's own refusals.

use std::collections::BTreeSet;

use serde_json::json;
use warden_core::audit::Digest;
use warden_core::decision::{Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::ids::{ActionName, CallId, Label, SessionId};
use warden_core::time::Timestamp;
use warden_sqlite::SqliteStore;
use warden_store::{
    CallRecord, CallStatus, CreateSession, EnvelopeImport, ImportRefusal, IndexChange,
    SessionRecord, SessionState, SessionStatus, SessionUpdate, Store, StoreError, UpdateSession,
    audit_if_session_created,
};

use crate::support::{id, note, temp_db, url};

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

fn session(name: &str, agent: &str) -> SessionRecord {
    SessionRecord {
        session_id: sid(name),
        agent: id(agent),
        opened_by: Subject::Operator,
        created_at: Timestamp(5),
        policy_version: "p1".into(),
        status: SessionStatus::Open,
        closure: None,
        envelope_id: Some(EnvelopeId::parse(&format!("env-{name}")).unwrap()),
        plan: None,
        imported: None,
        trusted_inputs_hash: Digest::of(name.as_bytes()),
        revision: 1,
    }
}

fn envelope(name: &str) -> EnvelopeRecord {
    EnvelopeRecord {
        envelope_id: EnvelopeId::parse(&format!("env-{name}")).unwrap(),
        parent_envelope_id: None,
        workflow_id: WorkflowId::parse("wf").unwrap(),
        agent_id: id("agent"),
        labels: BTreeSet::new(),
        aggregate_sensitivity: Sensitivity::Internal,
        derived: BTreeSet::new(),
        delegation_depth: 0,
        restrictions: BTreeSet::new(),
        version: 0,
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
        at: Timestamp(6),
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
        detail: json!({"provenance": [{"path": "/url", "origins": ["user"]}]}),
        plan_step: None,
        escalation_id: None,
        status: CallStatus::Allowed,
        decided_at: Timestamp(7),
        result_hash: None,
        result_labels: Vec::new(),
        completed_at: None,
    }
}

fn opened(state: &SessionState, import: Option<EnvelopeImport>) -> (SessionState, EnvelopeRecord) {
    let mut state = state.clone();
    state.session.imported = import;
    let name = state.session.session_id.to_string();
    (state, envelope(&name))
}

fn next(s: &SessionRecord) -> SessionRecord {
    SessionRecord {
        revision: s.revision + 1,
        ..s.clone()
    }
}

#[tokio::test]
async fn sessions_and_imports_survive_reopening() {
    let (_dir, path) = temp_db();
    let first = SessionState {
        session: session("s-1", "agent"),
        sources: vec![0, 1, 2, 255, 0],
        calls: Vec::new(),
    };
    let (first, env) = opened(&first, Some(import("s-1", 2)));
    let before = {
        let store = SqliteStore::open(&url(&path)).await.unwrap();
        let o = store
            .create_session(
                first.clone(),
                Some(env.clone()),
                first.session.imported.clone(),
                audit_if_session_created(vec![note(1)]),
            )
            .await
            .unwrap();
        assert_eq!(o, CreateSession::Created);
        let empty = SessionState {
            session: session("s-2", "other"),
            sources: Vec::new(),
            calls: Vec::new(),
        };
        let (empty, env2) = opened(&empty, None);
        let o = store
            .create_session(empty, Some(env2), None, audit_if_session_created(vec![]))
            .await
            .unwrap();
        assert_eq!(o, CreateSession::Created);
        let mut rev = first.session.clone();
        for (i, c) in [call("c-1", 1), call("c-0", 0)].into_iter().enumerate() {
            rev = next(&rev);
            // A replace, then an append (a recorded result's delta).
            let bytes = vec![u8::try_from(i).unwrap(); 3];
            let sources = if i == 0 {
                IndexChange::Replace(bytes)
            } else {
                IndexChange::Append(bytes)
            };
            let o = store
                .update_session(
                    SessionUpdate {
                        session: rev.clone(),
                        sources: Some(sources),
                        call: Some(c),
                    },
                    rev.revision - 1,
                    Box::new(|_| vec![note(2)]),
                )
                .await
                .unwrap();
            assert_eq!(o, UpdateSession::Updated);
        }
        (
            store.get_session(sid("s-1")).await.unwrap().unwrap(),
            store.get_session(sid("s-2")).await.unwrap().unwrap(),
            store.list_sessions(None, 10).await.unwrap(),
            store.audit_head().await.unwrap(),
        )
    };
    assert_eq!(before.0.session.revision, 3);
    assert_eq!(before.0.sources, vec![0, 0, 0, 1, 1, 1]);
    assert_eq!(before.0.calls, vec![call("c-0", 0), call("c-1", 1)]);
    assert!(before.1.sources.is_empty());

    let store = SqliteStore::open(&url(&path)).await.unwrap();
    assert_eq!(
        store.get_session(sid("s-1")).await.unwrap().unwrap(),
        before.0
    );
    assert_eq!(
        store.get_session(sid("s-2")).await.unwrap().unwrap(),
        before.1
    );
    assert_eq!(store.list_sessions(None, 10).await.unwrap(), before.2);
    assert_eq!(store.audit_head().await.unwrap(), before.3);
    assert_eq!(
        store
            .get_envelope(env.envelope_id.clone(), None)
            .await
            .unwrap(),
        Some(env)
    );
    store.verify_audit(None).await.unwrap();
    // The compare-and-set continues from the stored revision.
    let o = store
        .update_session(
            SessionUpdate {
                session: next(&first.session),
                sources: None,
                call: None,
            },
            1,
            Box::new(|_| Vec::new()),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(3) });
    // The import made before the restart is remembered: a replay and a
    // downgrade are refused, and nothing of them is stored.
    for (name, version, refusal) in [
        (
            "s-replay",
            2,
            ImportRefusal::Replayed {
                session_id: sid("s-1"),
            },
        ),
        ("s-down", 1, ImportRefusal::Downgraded { seen_version: 2 }),
    ] {
        let base = SessionState {
            session: session(name, "agent"),
            sources: Vec::new(),
            calls: Vec::new(),
        };
        let (state, env) = opened(&base, Some(import(name, version)));
        let o = store
            .create_session(
                state,
                Some(env.clone()),
                Some(import(name, version)),
                audit_if_session_created(vec![note(3)]),
            )
            .await
            .unwrap();
        assert_eq!(o, CreateSession::ImportRefused(refusal));
        assert_eq!(store.get_session(sid(name)).await.unwrap(), None);
        assert_eq!(
            store.get_envelope(env.envelope_id, None).await.unwrap(),
            None
        );
    }
    assert_eq!(store.audit_head().await.unwrap(), before.3);
}

/// A number SQLite cannot hold is a precise error, and the command's
/// savepoint takes everything it did with it: an update whose call cannot
/// be stored leaves the session row and the audit log as they were.
#[tokio::test]
async fn values_sqlite_cannot_hold_change_nothing() {
    let store = SqliteStore::open_temp().await.unwrap();
    let mut huge = SessionState {
        session: session("s-huge", "agent"),
        sources: Vec::new(),
        calls: Vec::new(),
    };
    huge.session.revision = u64::MAX;
    huge.session.envelope_id = None;
    let err = store
        .create_session(huge, None, None, Box::new(|_| vec![note(1)]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Backend { ref source } if source.to_string().contains("session revision 18446744073709551615 is too large")),
        "{err:?}"
    );
    assert_eq!(store.get_session(sid("s-huge")).await.unwrap(), None);
    assert_eq!(store.audit_head().await.unwrap().count, 0);

    let base = SessionState {
        session: session("s-ok", "agent"),
        sources: b"kept".to_vec(),
        calls: Vec::new(),
    };
    let (base, env) = opened(&base, None);
    store
        .create_session(base.clone(), Some(env), None, Box::new(|_| vec![note(1)]))
        .await
        .unwrap();
    let head = store.audit_head().await.unwrap();
    let err = store
        .update_session(
            SessionUpdate {
                session: next(&base.session),
                sources: Some(IndexChange::Append(b"lost".to_vec())),
                call: Some(call("c-huge", u64::MAX)),
            },
            1,
            Box::new(|_| vec![note(2)]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Backend { ref source } if source.to_string().contains("call position")),
        "{err:?}"
    );
    assert_eq!(store.get_session(sid("s-ok")).await.unwrap(), Some(base));
    assert_eq!(store.audit_head().await.unwrap(), head);
    // A revision past what SQLite holds never matches: a conflict.
    let o = store
        .update_session(
            SessionUpdate {
                session: SessionRecord {
                    revision: u64::MAX,
                    ..session("s-ok", "agent")
                },
                sources: None,
                call: None,
            },
            u64::MAX - 1,
            Box::new(|_| Vec::new()),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(1) });
}

#[tokio::test]
async fn the_schema_refuses_rewriting_sessions() {
    let (_dir, path) = temp_db();
    {
        let store = SqliteStore::open(&url(&path)).await.unwrap();
        let state = SessionState {
            session: session("s-h", "agent"),
            sources: Vec::new(),
            calls: vec![call("c-h", 0)],
        };
        let (state, env) = opened(&state, Some(import("s-h", 1)));
        store
            .create_session(
                state,
                Some(env),
                Some(import("s-h", 1)),
                Box::new(|_| Vec::new()),
            )
            .await
            .unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "foreign_keys", true).unwrap();
    for sql in [
        "UPDATE sessions SET revision = 7",
        "UPDATE sessions SET revision = revision - 1",
        "UPDATE sessions SET session_id = 'other', revision = revision + 1",
        "DELETE FROM sessions",
        "DELETE FROM session_calls",
        "UPDATE envelope_imports SET version = 9",
        "DELETE FROM envelope_imports",
        "INSERT INTO session_calls (session_id, call_id, seq, record) \
         VALUES ('ghost', 'c', 0, '{}')",
    ] {
        assert!(conn.execute(sql, []).is_err(), "{sql} was allowed");
    }
    // A row whose columns disagree with its record reads as corrupt.
    assert_eq!(
        conn.execute(
            "UPDATE sessions SET agent = 'someone-else', revision = revision + 1",
            []
        )
        .unwrap(),
        1
    );
    drop(conn);
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    let err = store.get_session(sid("s-h")).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { ref detail, .. } if detail.contains("session `s-h`")),
        "{err:?}"
    );
    let err = store.list_sessions(None, 10).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}
