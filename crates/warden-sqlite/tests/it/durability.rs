//! Reopening, concurrent readers, two stores on one file, export, and a
//! command that panics.

use std::sync::Arc;

use serde_json::json;
use warden_core::audit::{AuditEntry, Digest};
use warden_core::decision::Verdict;
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, Key, Namespace, RunId, StepId};
use warden_core::memory::{RecordClass, Visibility};
use warden_core::time::Timestamp;
use warden_sqlite::{SqliteStore, export_audit, verify_audit};
use warden_store::conformance::{audit_all, draft, put_audit};
use warden_store::{
    PutOutcome, RecordStep, RunRecord, RunStep, StepOutcome, StepStatus, Store, StoreError,
    StoredAgent, TokenRecord, TokenSubject, verify_store,
};

use crate::support::{id, note, put, temp_db, url};

fn agent(name: &str, parent: Option<&str>) -> StoredAgent {
    StoredAgent {
        id: id(name),
        parent: parent.map(id),
        capabilities: [ActionName::parse("memory.read").unwrap()]
            .into_iter()
            .collect(),
        tools: vec!["t".into()],
        config: Some(json!({"k": [1, "two"]})),
        status: AgentStatus::Active,
        created_at: Timestamp(3),
        envelope_id: parent.map(|p| EnvelopeId::parse(&format!("env-of-{p}")).unwrap()),
    }
}

fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}

#[tokio::test]
async fn reopening_keeps_everything() {
    let (_dir, path) = temp_db();
    let token = TokenRecord {
        token_id: "tok".into(),
        hash: Digest::of(b"secret"),
        subject: TokenSubject::Agent(id("kid")),
        created_at: Timestamp(4),
        revoked: false,
    };
    let run = RunRecord {
        run_id: RunId::parse("run-1").unwrap(),
        agent: id("kid"),
        sop_hash: Digest::of(b"sop"),
        sop: json!({"steps": 2}),
        steps: ["a", "b"]
            .iter()
            .map(|s| RunStep {
                step_id: StepId::parse(s).unwrap(),
                action: ActionName::parse("artifact.save").unwrap(),
                operation_id: format!("op-{s}"),
            })
            .collect(),
        policy_version: "v1".into(),
        created_at: Timestamp(5),
        envelope_id: Some(EnvelopeId::parse("env-run-1").unwrap()),
    };
    let outcome = StepOutcome {
        status: StepStatus::Completed,
        result: Some(json!({"saved": "internal/x"})),
        error: None,
        labels: vec![],
        recorded_at: Timestamp(6),
    };
    let before = {
        let store = SqliteStore::open(&url(&path)).await.unwrap();
        store
            .insert_agent(agent("root", None), vec![note(1)])
            .await
            .unwrap();
        store
            .insert_agent(agent("kid", Some("root")), vec![note(2)])
            .await
            .unwrap();
        store
            .set_agent_status(vec![id("kid")], AgentStatus::Revoked, vec![])
            .await
            .unwrap();
        store.insert_token(token.clone(), vec![]).await.unwrap();
        let secret = warden_core::memory::Put {
            visibility: Some(Visibility::Private),
            class: Some(RecordClass::Secret {
                grants: vec![id("kid")],
            }),
            ..put("root", "creds", "k", json!("s"), None)
        };
        store
            .put_record(
                secret,
                Timestamp(7),
                warden_store::StorageQuota::default(),
                put_audit("root", "creds.k", 1),
            )
            .await
            .unwrap();
        store
            .put_record(
                put("root", "ns", "k", json!([1]), None),
                Timestamp(8),
                warden_store::StorageQuota::default(),
                put_audit("root", "ns.k", 2),
            )
            .await
            .unwrap();
        store
            .put_record(
                put("root", "ns", "k", json!([2]), Some(1)),
                Timestamp(9),
                warden_store::StorageQuota::default(),
                put_audit("root", "ns.k", 3),
            )
            .await
            .unwrap();
        store
            .create_run(
                run.clone(),
                None,
                warden_store::audit_if_created(vec![note(3)]),
            )
            .await
            .unwrap();
        store
            .record_step(
                run.run_id.clone(),
                StepId::parse("a").unwrap(),
                outcome.clone(),
                vec![note(4)],
            )
            .await
            .unwrap();
        (
            store.load_agents().await.unwrap(),
            store.find_token(token.hash).await.unwrap(),
            store
                .get_records(ns("ns"), key("k"), vec![id("root")])
                .await
                .unwrap(),
            store
                .get_records(ns("creds"), key("k"), vec![id("root")])
                .await
                .unwrap(),
            store.get_run(run.run_id.clone()).await.unwrap(),
            audit_all(&store).await,
        )
    };
    assert_eq!(before.0[1].status, AgentStatus::Revoked);
    assert_eq!(before.2[0].revision, 2);
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    let after = (
        store.load_agents().await.unwrap(),
        store.find_token(token.hash).await.unwrap(),
        store
            .get_records(ns("ns"), key("k"), vec![id("root")])
            .await
            .unwrap(),
        store
            .get_records(ns("creds"), key("k"), vec![id("root")])
            .await
            .unwrap(),
        store.get_run(run.run_id.clone()).await.unwrap(),
        audit_all(&store).await,
    );
    assert_eq!(after, before);
    // Exactly-once holds across the restart.
    let retry = store
        .record_step(
            run.run_id.clone(),
            StepId::parse("a").unwrap(),
            StepOutcome {
                recorded_at: Timestamp(99),
                ..outcome.clone()
            },
            vec![note(5)],
        )
        .await
        .unwrap();
    assert_eq!(retry, RecordStep::AlreadyRecorded(outcome));
    // The chain continues where it stopped.
    let head = store.append_audit(vec![note(6)]).await.unwrap();
    assert_eq!(head.seq, before.5.len() as u64 + 1);
    assert_eq!(store.verify_audit(None).await.unwrap().verified, head);
    drop(store);
    // A clean close checkpoints the log into the file and removes it.
    let wal = path.with_file_name("warden.db-wal");
    assert!(!wal.exists(), "the write-ahead log outlived the store");
    assert_eq!(verify_audit(&url(&path), None).unwrap().verified, head);
}

#[tokio::test]
async fn readers_never_wait_for_the_writer() {
    let (_dir, path) = temp_db();
    let store = Arc::new(SqliteStore::open(&url(&path)).await.unwrap());
    store.append_audit(vec![note(1)]).await.unwrap();
    // A reader holding a snapshot open the whole time.
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let count = |c: &rusqlite::Connection| {
        c.query_row("SELECT count(*) FROM audit", [], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    assert_eq!(count(&reader), 1);
    // The writer is not held up by it...
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                store.append_audit(vec![note(t * 100 + i)]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // ...nor are other readers, who see every acknowledged write.
    assert_eq!(store.audit_head().await.unwrap().count, 81);
    // The old snapshot is still consistent.
    assert_eq!(count(&reader), 1);
    reader.execute_batch("COMMIT").unwrap();
    assert_eq!(count(&reader), 81);
}

#[tokio::test]
async fn two_stores_on_one_file_race_and_keep_one_chain() {
    // As two processes would: two writer threads, two write connections.
    let (_dir, path) = temp_db();
    let a = Arc::new(SqliteStore::open(&url(&path)).await.unwrap());
    let b = Arc::new(SqliteStore::open(&url(&path)).await.unwrap());
    a.put_record(
        put("o", "ns", "k", json!("start"), Some(0)),
        Timestamp(1),
        warden_store::StorageQuota::default(),
        put_audit("o", "ns.k", 100),
    )
    .await
    .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let store = Arc::clone(if i.is_multiple_of(2) { &a } else { &b });
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .put_record(
                    put("o", "ns", "k", json!(i), Some(1)),
                    Timestamp(2),
                    warden_store::StorageQuota::default(),
                    put_audit("o", "ns.k", i),
                )
                .await
                .unwrap()
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            PutOutcome::Written { record, .. } => winners.push(record.value),
            PutOutcome::Conflict { current } => assert_eq!(current, Some(2)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1);
    let stored = b
        .get_records(ns("ns"), key("k"), vec![id("o")])
        .await
        .unwrap();
    assert_eq!(stored[0].value, winners[0]);
    // Appends from both interleave into one chain.
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let store = Arc::clone(if t.is_multiple_of(2) { &a } else { &b });
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                store
                    .append_audit(vec![note(t * 1000 + i), note(t * 1000 + i)])
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let head = verify_store(&*a, None).await.unwrap().verified;
    assert_eq!(head.count, 1 + 16 + 200);
    assert_eq!(b.verify_audit(None).await.unwrap().verified, head);
}

#[tokio::test]
async fn export_and_verify_beside_a_live_writer() {
    let (_dir, path) = temp_db();
    let store = Arc::new(SqliteStore::open(&url(&path)).await.unwrap());
    store
        .append_audit((1..=20).map(note).collect())
        .await
        .unwrap();
    let writer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for i in 21..=200 {
                store.append_audit(vec![note(i)]).await.unwrap();
            }
        })
    };
    // Snapshots: each verification sees a consistent prefix and its head.
    for _ in 0..5 {
        let report = verify_audit(&url(&path), None).unwrap();
        assert!(report.verified.seq >= 20);
    }
    writer.await.unwrap();
    let mut out = Vec::new();
    assert_eq!(export_audit(&url(&path), 0, &mut out).unwrap(), 200);
    let exported: Vec<AuditEntry> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(exported, audit_all(&*store).await);
    let mut out = Vec::new();
    assert_eq!(export_audit(&url(&path), 195, &mut out).unwrap(), 5);
    let first: AuditEntry =
        serde_json::from_str(String::from_utf8(out).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first.seq, 196);
    let line = String::from_utf8({
        let mut o = Vec::new();
        export_audit(&url(&path), 199, &mut o).unwrap();
        o
    })
    .unwrap();
    for field in [
        "\"seq\":200",
        "\"subject\":",
        "\"verdict\":\"allow\"",
        "\"prev_hash\":\"",
        "\"hash\":\"",
    ] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    let mut out = Vec::new();
    assert_eq!(export_audit(&url(&path), u64::MAX, &mut out).unwrap(), 0);
}

#[tokio::test]
async fn synchronous_normal_is_available() {
    let (_dir, path) = temp_db();
    let store = SqliteStore::open(&format!("{}?synchronous=normal", url(&path)))
        .await
        .unwrap();
    store.append_audit(vec![note(1)]).await.unwrap();
    drop(store);
    assert_eq!(verify_audit(&url(&path), None).unwrap().verified.count, 1);
}

#[tokio::test]
async fn a_panicking_audit_fn_changes_nothing() {
    let store = SqliteStore::open_temp().await.unwrap();
    store.append_audit(vec![note(1)]).await.unwrap();
    let bomb: warden_store::PutAuditFn = Box::new(|_| panic!("audit fn exploded"));
    let err = store
        .put_record(
            put("o", "ns", "k", json!(1), None),
            Timestamp(1),
            warden_store::StorageQuota::default(),
            bomb,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(
        store
            .get_records(ns("ns"), key("k"), vec![id("o")])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.audit_head().await.unwrap().count, 1);
    // The writer carries on.
    let ok = store
        .put_record(
            put("o", "ns", "k", json!(2), None),
            Timestamp(2),
            warden_store::StorageQuota::default(),
            put_audit("o", "ns.k", 2),
        )
        .await
        .unwrap();
    assert!(matches!(ok, PutOutcome::Written { .. }));
    let entries = audit_all(&store).await;
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[1].draft,
        warden_core::audit::AuditDraft {
            details: json!({"tag": 2, "revision": 1, "created": true}),
            ..draft("o", "memory.write", "ns.k", Verdict::Allow, "owner_write")
        }
    );
    assert!(store.verify_audit(None).await.is_ok());
}
