//! Databases written at earlier schema versions (1: before context
//! envelopes, 2: before runs in flight, 3: before tool-call sessions, 4:
//! before unique call positions) open with this build, migrate, and keep
//! every row.

use std::path::Path;

use rusqlite::{Connection, params};
use serde_json::json;
use warden_core::audit::{AuditDraft, ChainHead, Digest};
use warden_core::decision::{Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Namespace, RunId, StepId};
use warden_core::memory::{MemoryRecord, RecordClass, Visibility};
use warden_core::time::Timestamp;
use warden_store::{
    EscalationRecord, EscalationStatus, EscalationTarget, PutEnvelope, PutEscalation, RunRecord,
    RunState, RunStep, StepOutcome, StepStatus, Store, StoredAgent, TokenRecord, TokenSubject,
};

use crate::schema::{APPLICATION_ID, SCHEMA_VERSION, migrate};
use crate::{SqliteOptions, SqliteStore};

fn agent_id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

fn note(i: u64) -> AuditDraft {
    AuditDraft {
        time: Timestamp(i64::try_from(i).unwrap()),
        subject: Subject::OPERATOR.into(),
        operation: "v1".into(),
        resource: format!("r{i}"),
        verdict: Verdict::Allow,
        reason: "ok".into(),
        policy_version: "p1".into(),
        details: json!({ "i": i }),
    }
}

/// Write a database exactly as version 1 did: only the v1 migration, then
/// rows through the v1 build's statements. Returns the chain head.
fn write_v1(path: &Path) -> ChainHead {
    let mut conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    migrate(&mut conn, path, 1).unwrap();
    let version: i64 = conn
        .query_row("SELECT schema_version FROM meta", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 1);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name IN ('envelopes', 'escalations')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "only the v1 migration ran");

    let tx = conn.transaction().unwrap();
    for (id, parent) in [("root", None), ("kid", Some("root"))] {
        tx.execute(
            "INSERT INTO agents (id, parent, capabilities, tools, config, status, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                id,
                parent,
                r#"["memory.read"]"#,
                r#"["t"]"#,
                r#"{"k":1}"#,
                "active",
                3
            ],
        )
        .unwrap();
    }
    tx.execute(
        "INSERT INTO tokens (token_id, hash, subject_kind, agent_id, created_at, revoked) \
         VALUES ('tok', ?1, 'agent', 'kid', 4, 0)",
        [Digest::of(b"secret").0],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO memory (owner, namespace, key, value, visibility, class, combine, \
         grants, expires_at, revision, created_at, updated_at) \
         VALUES ('root', 'ns', 'k', '[1,2]', 'private', 'preference', NULL, NULL, NULL, 2, 5, 6)",
        [],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO runs (run_id, agent, sop_hash, sop, policy_version, created_at) \
         VALUES ('run-1', 'kid', ?1, '{\"steps\":2}', 'p1', 7)",
        [Digest::of(b"sop").0],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO run_steps (run_id, position, step_id, action, operation_id, status, \
         result, error, labels, recorded_at) \
         VALUES ('run-1', 0, 'a', 'artifact.save', 'op-a', 'completed', '{\"ok\":true}', \
         NULL, '[]', 8)",
        [],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO run_steps (run_id, position, step_id, action, operation_id) \
         VALUES ('run-1', 1, 'b', 'artifact.save', 'op-b')",
        [],
    )
    .unwrap();
    let mut head = ChainHead {
        count: 0,
        seq: 0,
        hash: Digest::GENESIS,
    };
    for i in 1..=3 {
        let entry = note(i).seal(head.seq + 1, head.hash);
        tx.execute(
            "INSERT INTO audit (seq, time, subject, operation, resource, verdict, reason, \
             policy_version, details, prev_hash, hash) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                i64::try_from(entry.seq).unwrap(),
                entry.draft.time.0,
                entry.draft.subject,
                entry.draft.operation,
                entry.draft.resource,
                entry.draft.verdict.as_str(),
                entry.draft.reason,
                entry.draft.policy_version,
                String::from_utf8(warden_core::canonical::to_canonical(&entry.draft.details))
                    .unwrap(),
                entry.prev_hash.0,
                entry.hash.0,
            ],
        )
        .unwrap();
        head = ChainHead {
            count: head.count + 1,
            seq: entry.seq,
            hash: entry.hash,
        };
    }
    tx.execute(
        "UPDATE audit_head SET seq = ?1, hash = ?2 WHERE id = 1",
        params![i64::try_from(head.seq).unwrap(), head.hash.0],
    )
    .unwrap();
    tx.commit().unwrap();
    conn.close().unwrap();
    head
}

fn expected_agents() -> Vec<StoredAgent> {
    [("root", None), ("kid", Some("root"))]
        .into_iter()
        .map(|(id, parent)| StoredAgent {
            id: agent_id(id),
            parent: parent.map(agent_id),
            capabilities: [ActionName::parse("memory.read").unwrap()]
                .into_iter()
                .collect(),
            tools: vec!["t".into()],
            config: Some(json!({"k": 1})),
            status: AgentStatus::Active,
            created_at: Timestamp(3),
            envelope_id: None,
        })
        .collect()
}

fn step(s: &str) -> RunStep {
    RunStep {
        step_id: StepId::parse(s).unwrap(),
        action: ActionName::parse("artifact.save").unwrap(),
        operation_id: format!("op-{s}"),
    }
}

#[tokio::test]
async fn a_v1_database_migrates_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warden.db");
    let head = write_v1(&path);

    let store = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap();
    // Migrated to the current version, marked as Warden's.
    {
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("SELECT schema_version FROM meta", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let app: i32 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .unwrap();
        assert_eq!(app, APPLICATION_ID);
    }
    // Every v1 row reads back, with no envelope where v1 had none.
    assert_eq!(store.load_agents().await.unwrap(), expected_agents());
    assert_eq!(
        store.find_token(Digest::of(b"secret")).await.unwrap(),
        Some(TokenRecord {
            token_id: "tok".into(),
            hash: Digest::of(b"secret"),
            subject: TokenSubject::Agent(agent_id("kid")),
            created_at: Timestamp(4),
            revoked: false,
        })
    );
    let records = store
        .get_records(
            Namespace::parse("ns").unwrap(),
            Key::parse("k").unwrap(),
            vec![agent_id("root")],
        )
        .await
        .unwrap();
    assert_eq!(
        records,
        vec![MemoryRecord {
            owner: agent_id("root"),
            namespace: Namespace::parse("ns").unwrap(),
            key: Key::parse("k").unwrap(),
            value: json!([1, 2]),
            visibility: Visibility::Private,
            class: RecordClass::Preference,
            revision: 2,
            created_at: Timestamp(5),
            updated_at: Timestamp(6),
        }]
    );
    let run_id = RunId::parse("run-1").unwrap();
    let expected_run = RunState {
        run: RunRecord {
            run_id: run_id.clone(),
            agent: agent_id("kid"),
            sop_hash: Digest::of(b"sop"),
            sop: json!({"steps": 2}),
            steps: vec![step("a"), step("b")],
            policy_version: "p1".into(),
            created_at: Timestamp(7),
            envelope_id: None,
        },
        outcomes: [(
            StepId::parse("a").unwrap(),
            StepOutcome {
                status: StepStatus::Completed,
                result: Some(json!({"ok": true})),
                error: None,
                labels: Vec::new(),
                recorded_at: Timestamp(8),
            },
        )]
        .into_iter()
        .collect(),
        leases: Default::default(),
    };
    assert_eq!(
        store.get_run(run_id.clone()).await.unwrap(),
        Some(expected_run.clone())
    );
    assert_eq!(store.audit_head().await.unwrap(), head);
    let report = store.verify_audit(None).await.unwrap();
    assert_eq!(report.verified, head);

    // The migrated file takes the new records, and the chain goes on.
    let envelope = EnvelopeRecord {
        envelope_id: EnvelopeId::parse("env-new").unwrap(),
        parent_envelope_id: None,
        workflow_id: WorkflowId::parse("wf").unwrap(),
        agent_id: agent_id("kid"),
        labels: Default::default(),
        aggregate_sensitivity: Sensitivity::Internal,
        derived: Default::default(),
        delegation_depth: 0,
        restrictions: Default::default(),
        version: 0,
    };
    let o = store
        .put_envelope(envelope.clone(), None, Box::new(|_| vec![note(4)]))
        .await
        .unwrap();
    assert_eq!(o, PutEnvelope::Written);
    let target = EscalationTarget::Step {
        run_id: run_id.clone(),
        step_id: StepId::parse("b").unwrap(),
        request_digest: None,
    };
    let escalation = EscalationRecord {
        escalation_id: "esc-1".into(),
        target,
        requested_by: Subject::Agent(agent_id("kid")),
        operation: "step.begin".into(),
        resource: "run-1:b".into(),
        reason: warden_core::decision::Reason::code("sensitivity_floor"),
        envelope_id: Some(envelope.envelope_id.clone()),
        envelope_version: Some(0),
        classification: Sensitivity::Internal,
        obligations: Vec::new(),
        request: None,
        status: EscalationStatus::Pending,
        created_at: Timestamp(9),
        resolved_by: None,
        resolved_at: None,
        rejection_reason: None,
        consumed_at: None,
    };
    let o = store
        .put_escalation(escalation.clone(), Box::new(|_| vec![note(5)]))
        .await
        .unwrap();
    assert_eq!(o, PutEscalation::Created);
    let mut child = expected_agents().remove(1);
    child.id = agent_id("grandkid");
    child.parent = Some(agent_id("kid"));
    child.envelope_id = Some(envelope.envelope_id.clone());
    store.insert_agent(child.clone(), vec![]).await.unwrap();
    drop(store);

    // Reopening a migrated file changes nothing.
    let store = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap();
    let mut agents = expected_agents();
    agents.push(child);
    assert_eq!(store.load_agents().await.unwrap(), agents);
    assert_eq!(store.get_run(run_id).await.unwrap(), Some(expected_run));
    assert_eq!(
        store
            .get_envelope(envelope.envelope_id.clone(), None)
            .await
            .unwrap(),
        Some(envelope)
    );
    assert_eq!(
        store.get_escalation("esc-1".into()).await.unwrap(),
        Some(escalation)
    );
    let report = store.verify_audit(None).await.unwrap();
    assert_eq!(report.verified.count, 5);
}

/// A version 2 database (before runs in flight were stored) migrates to
/// version 3: runs already finished are marked, the others count.
#[tokio::test]
async fn a_v2_database_marks_its_finished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warden.db");
    {
        let mut conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        migrate(&mut conn, &path, 2).unwrap();
        let tx = conn.transaction().unwrap();
        // (run, [(step, status)]): open, every step completed, failed half
        // way, denied, and one without steps.
        type Steps<'a> = &'a [(&'a str, Option<&'a str>)];
        let runs: [(&str, Steps<'_>); 5] = [
            ("open", &[("a", Some("completed")), ("b", None)]),
            (
                "done",
                &[("a", Some("completed")), ("b", Some("completed"))],
            ),
            ("failed", &[("a", Some("failed")), ("b", None)]),
            ("denied", &[("a", Some("denied"))]),
            ("empty", &[]),
        ];
        for (run, steps) in runs {
            tx.execute(
                "INSERT INTO runs (run_id, agent, sop_hash, sop, policy_version, created_at) \
                 VALUES (?1, 'kid', ?2, '{}', 'p1', 7)",
                params![run, Digest::of(b"sop").0],
            )
            .unwrap();
            for (i, (step, status)) in steps.iter().enumerate() {
                tx.execute(
                    "INSERT INTO run_steps (run_id, position, step_id, action, operation_id, \
                     status, labels, recorded_at) VALUES (?1, ?2, ?3, 'artifact.save', ?3, ?4, \
                     CASE WHEN ?4 IS NULL THEN NULL ELSE '[]' END, \
                     CASE WHEN ?4 IS NULL THEN NULL ELSE 10 + ?2 END)",
                    params![run, i64::try_from(i).unwrap(), step, status],
                )
                .unwrap();
            }
        }
        tx.commit().unwrap();
    }
    let store = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap();
    {
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("SELECT schema_version FROM meta", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let finished: Vec<(String, Option<i64>)> = conn
            .prepare("SELECT run_id, finished_at FROM runs ORDER BY run_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected: Vec<(String, Option<i64>)> = vec![
            ("denied".into(), Some(10)),
            ("done".into(), Some(11)),
            ("empty".into(), Some(7)),
            ("failed".into(), Some(10)),
            ("open".into(), None),
        ];
        assert_eq!(finished, expected);
    }
    // Only `open` is in flight for `kid`.
    let run = |id: &str| RunRecord {
        run_id: RunId::parse(id).unwrap(),
        agent: agent_id("kid"),
        sop_hash: Digest::of(b"sop"),
        sop: json!({}),
        steps: vec![step("a")],
        policy_version: "p1".into(),
        created_at: Timestamp(20),
        envelope_id: None,
    };
    let limit = |max| {
        Some(warden_store::RunsInFlight {
            max,
            since: Timestamp(0),
        })
    };
    let o = store
        .create_run(
            run("new-1"),
            limit(1),
            warden_store::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    assert_eq!(
        o,
        warden_store::CreateRun::OverQuota {
            limit: 1,
            in_flight: 1
        }
    );
    let o = store
        .create_run(
            run("new-1"),
            limit(2),
            warden_store::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    assert_eq!(o, warden_store::CreateRun::Created);
}

/// A version 3 database (before tool-call sessions) migrates to version 4:
/// its rows are kept, the envelope table is shared with sessions (an id it
/// holds is taken), and sessions are stored and survive reopening.
#[tokio::test]
async fn a_v3_database_takes_sessions() {
    use warden_store::{CreateSession, SessionRecord, SessionState, SessionStatus};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warden.db");
    let old = EnvelopeRecord {
        envelope_id: EnvelopeId::parse("env-old").unwrap(),
        parent_envelope_id: None,
        workflow_id: WorkflowId::parse("wf").unwrap(),
        agent_id: agent_id("kid"),
        labels: Default::default(),
        aggregate_sensitivity: Sensitivity::Internal,
        derived: Default::default(),
        delegation_depth: 0,
        restrictions: Default::default(),
        version: 0,
    };
    {
        let mut conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        migrate(&mut conn, &path, 3).unwrap();
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name LIKE '%session%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 0, "only the migrations up to 3 ran");
        conn.execute(
            "INSERT INTO envelopes (envelope_id, version, workflow_id, agent_id, record) \
             VALUES ('env-old', 0, 'wf', 'kid', ?1)",
            [crate::codec::canonical_text(&old).unwrap()],
        )
        .unwrap();
    }
    let session = |name: &str, envelope: &str| SessionState {
        session: SessionRecord {
            session_id: warden_core::ids::SessionId::parse(name).unwrap(),
            agent: agent_id("kid"),
            opened_by: Subject::Operator,
            created_at: Timestamp(9),
            policy_version: "p3".into(),
            status: SessionStatus::Open,
            closure: None,
            envelope_id: Some(EnvelopeId::parse(envelope).unwrap()),
            plan: None,
            imported: None,
            trusted_inputs_hash: Digest::of(name.as_bytes()),
            revision: 1,
        },
        sources: b"index".to_vec(),
        calls: Vec::new(),
    };
    let fresh = |id: &str| EnvelopeRecord {
        envelope_id: EnvelopeId::parse(id).unwrap(),
        ..old.clone()
    };
    let store = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap();
    {
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("SELECT schema_version FROM meta", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }
    assert_eq!(
        store
            .get_envelope(old.envelope_id.clone(), None)
            .await
            .unwrap(),
        Some(old.clone())
    );
    let err = store
        .create_session(
            session("s-clash", "env-old"),
            Some(fresh("env-old")),
            None,
            Box::new(|_| vec![note(1)]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, warden_store::StoreError::Duplicate { ref id, .. } if id == "env-old"),
        "{err:?}"
    );
    let o = store
        .create_session(
            session("s-new", "env-new"),
            Some(fresh("env-new")),
            None,
            Box::new(|_| vec![note(1)]),
        )
        .await
        .unwrap();
    assert_eq!(o, CreateSession::Created);
    drop(store);
    let store = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap();
    let id = warden_core::ids::SessionId::parse("s-new").unwrap();
    assert_eq!(
        store.get_session(id).await.unwrap(),
        Some(session("s-new", "env-new"))
    );
    assert_eq!(store.list_sessions(None, 10).await.unwrap().len(), 1);
    assert_eq!(store.verify_audit(None).await.unwrap().verified.count, 1);
}

/// Write a version 4 database holding the session `s-old` with the calls
/// `(call_id, seq)` given, through version 4's statements.
fn write_v4_session(path: &Path, calls: &[(&str, u64)]) -> warden_store::SessionState {
    use warden_store::{CallRecord, CallStatus, SessionRecord, SessionState, SessionStatus};

    let mut conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    migrate(&mut conn, path, 4).unwrap();
    let session = SessionRecord {
        session_id: warden_core::ids::SessionId::parse("s-old").unwrap(),
        agent: agent_id("kid"),
        opened_by: Subject::Operator,
        created_at: Timestamp(9),
        policy_version: "p4".into(),
        status: SessionStatus::Open,
        closure: None,
        envelope_id: None,
        plan: None,
        imported: None,
        trusted_inputs_hash: Digest::of(b"s-old"),
        revision: 1 + calls.len() as u64,
    };
    let calls: Vec<CallRecord> = calls
        .iter()
        .map(|(id, seq)| CallRecord {
            call_id: warden_core::ids::CallId::parse(id).unwrap(),
            seq: *seq,
            action: ActionName::parse("http.get").unwrap(),
            arguments_hash: Digest::of(id.as_bytes()),
            verdict: Verdict::Allow,
            reason: warden_core::decision::Reason::code("call_allowed"),
            detail: json!({"provenance": []}),
            plan_step: None,
            escalation_id: None,
            status: CallStatus::Allowed,
            decided_at: Timestamp(10),
            result_hash: None,
            result_labels: Vec::new(),
            completed_at: None,
        })
        .collect();
    conn.execute(
        "INSERT INTO sessions (session_id, pos, agent, revision, created_at, record, sources) \
         VALUES ('s-old', 1, 'kid', ?1, 9, ?2, x'01')",
        params![
            i64::try_from(session.revision).unwrap(),
            crate::codec::canonical_text(&session).unwrap()
        ],
    )
    .unwrap();
    for c in &calls {
        conn.execute(
            "INSERT INTO session_calls (session_id, call_id, seq, record) \
             VALUES ('s-old', ?1, ?2, ?3)",
            params![
                c.call_id.as_str(),
                i64::try_from(c.seq).unwrap(),
                crate::codec::canonical_text(c).unwrap()
            ],
        )
        .unwrap();
    }
    let mut calls = calls;
    calls.sort_by_key(|c| c.seq);
    SessionState {
        session,
        sources: vec![1],
        calls,
    }
}

/// A version 4 database migrates to version 5 with its sessions and calls
/// intact, and from then on a call at a taken `seq` is refused; one whose
/// session holds two calls at one `seq` (which no engine wrote) fails the
/// migration and is left at version 4, unchanged.
#[tokio::test]
async fn a_v4_database_takes_unique_call_positions() {
    use warden_store::{SessionUpdate, StoreError, UpdateSession};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warden.db");
    let before = write_v4_session(&path, &[("c-b", 1), ("c-a", 0)]);
    let store = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap();
    let id = before.session.session_id.clone();
    assert_eq!(
        store.get_session(id.clone()).await.unwrap(),
        Some(before.clone())
    );
    let mut taken = before.calls[0].clone();
    taken.call_id = warden_core::ids::CallId::parse("c-new").unwrap();
    let mut session = before.session.clone();
    session.revision += 1;
    let err = store
        .update_session(
            SessionUpdate {
                session: session.clone(),
                sources: None,
                call: Some(taken.clone()),
            },
            before.session.revision,
            Box::new(|_| vec![note(1)]),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::duplicate(warden_store::Entity::Call, "s-old/#0")
    );
    assert_eq!(
        store.get_session(id.clone()).await.unwrap(),
        Some(before.clone())
    );
    taken.seq = 2;
    let o = store
        .update_session(
            SessionUpdate {
                session,
                sources: None,
                call: Some(taken),
            },
            before.session.revision,
            Box::new(|_| vec![note(1)]),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    assert_eq!(store.get_session(id).await.unwrap().unwrap().calls.len(), 3);
    drop(store);

    // Two calls at one position: the migration fails and changes nothing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warden.db");
    write_v4_session(&path, &[("c-a", 0), ("c-b", 0)]);
    let err = SqliteStore::open_with(SqliteOptions::new(path.clone()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("UNIQUE"), "{err}");
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("SELECT schema_version FROM meta", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
    let calls: i64 = conn
        .query_row("SELECT count(*) FROM session_calls", [], |r| r.get(0))
        .unwrap();
    assert_eq!(calls, 2);
}
