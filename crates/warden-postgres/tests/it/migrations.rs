//! Migrations on start: concurrent starts, reconnects, refusal of a newer
//! schema, and the URL and schema-name checks.

use serde_json::json;
use warden_core::time::Timestamp;
use warden_postgres::{PgStore, SCHEMA_VERSION, is_postgres_url};
use warden_store::{Store, StoreError};

use crate::support::*;

/// Tables of a current schema: version 1's nine, version 2's three,
/// version 4's three, version 7's one and version 8's two.
const TABLES: i64 = 18;

async fn count_tables(sql: &tokio_postgres::Client, schema: &str) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM pg_tables WHERE schemaname = $1",
        &[&schema],
    )
    .await
    .unwrap()
    .get(0)
}

/// Four servers start at once on an empty schema: all connect, one schema
/// results, with one version row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_concurrent_starts_migrate_once() {
    let scratch = scratch_or_skip!();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (url, schema) = (scratch.url.clone(), scratch.schema.clone());
        tasks.push(tokio::spawn(async move {
            PgStore::connect_in_schema(&url, &schema).await
        }));
    }
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.unwrap().unwrap());
    }
    let sql = scratch.client().await;
    let versions: Vec<i64> = sql
        .query("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [SCHEMA_VERSION]);
    assert_eq!(count_tables(&sql, &scratch.schema).await, TABLES);
    // Every instance works on the same data.
    for (i, store) in stores.iter().enumerate() {
        store
            .put_record(
                put("a", "ns", &format!("k{i}"), json!(i), Some(0)),
                Timestamp(1),
                warden_store::StorageQuota::default(),
                put_audit("a", "k", 0),
            )
            .await
            .unwrap();
    }
    assert_eq!(head_count(&stores[0]).await, 4);
    assert_chain(&stores[3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_keeps_the_data() {
    let scratch = scratch_or_skip!();
    {
        let store = scratch.store().await;
        store.append_audit(vec![numbered(1)]).await.unwrap();
        store
            .insert_agent(agent("root", None), register("root"))
            .await
            .unwrap();
    }
    let store = scratch.store().await;
    assert_eq!(
        store.load_agents().await.unwrap(),
        vec![agent("root", None)]
    );
    assert_eq!(head_count(&store).await, 2);
    assert_eq!(store.schema(), scratch.schema);
    assert_eq!(
        store.channel(),
        format!("warden_changes_{}", scratch.schema)
    );
}

/// A database written by a newer Warden is refused and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_without_changes() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store.append_audit(vec![numbered(1)]).await.unwrap();
    drop(store);
    let sql = scratch.client().await;
    let newer = SCHEMA_VERSION + 1;
    sql.execute("UPDATE warden_meta SET schema_version = $1", &[&newer])
        .await
        .unwrap();
    let tables = count_tables(&sql, &scratch.schema).await;
    let err = PgStore::connect_in_schema(&scratch.url, &scratch.schema)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::SchemaTooNew {
            found: newer,
            supported: SCHEMA_VERSION
        }
    );
    let version: i64 = sql
        .query_one("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, newer);
    assert_eq!(count_tables(&sql, &scratch.schema).await, tables);
    let entries: i64 = sql
        .query_one("SELECT count(*) FROM audit_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(entries, 1);
}

/// A schema that holds tables named like Warden's but is not a Warden
/// schema is refused, not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_tables_are_not_adopted() {
    let scratch = scratch_or_skip!();
    let sql = raw_client(&scratch.url).await;
    sql.batch_execute(&format!(
        "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".memory (id int)",
        scratch.schema
    ))
    .await
    .unwrap();
    let err = PgStore::connect_in_schema(&scratch.url, &scratch.schema)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(count_tables(&sql, &scratch.schema).await, 1);
}

/// `connect` without a schema uses the connection's current schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_uses_the_current_schema() {
    let scratch = scratch_or_skip!();
    let sql = raw_client(&scratch.url).await;
    sql.batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let sep = if scratch.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options=-csearch_path%3D{}",
        scratch.url, scratch.schema
    );
    let store = PgStore::connect(&url).await.unwrap();
    assert_eq!(store.schema(), scratch.schema);
    store.append_audit(vec![numbered(1)]).await.unwrap();
    assert_eq!(count_tables(&sql, &scratch.schema).await, TABLES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_postgres_urls_and_plain_schema_names_are_accepted() {
    assert!(is_postgres_url("postgres://u@h/db"));
    assert!(is_postgres_url("postgresql://u@h/db"));
    assert!(!is_postgres_url("sqlite://warden.db"));
    let err = PgStore::connect("sqlite://warden.db").await.unwrap_err();
    assert!(
        matches!(err, StoreError::Backend { ref source } if source.to_string().contains("postgres://")),
        "{err:?}"
    );
    for bad in [
        "",
        "Upper",
        "1digit",
        "semi;colon",
        "quo\"te",
        &"x".repeat(49),
    ] {
        let err = PgStore::connect_in_schema("postgres://nobody@127.0.0.1:1/none", bad)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Backend { .. }), "{bad}: {err:?}");
    }
}

/// The version 1 schema, exactly as a version 1 build created it.
const V1_SQL: &str = include_str!("../../src/migrations/0001_initial.sql");

/// A database written by a version 1 build (agents, tokens, a memory
/// record, a run with a recorded step, a change and a chained audit entry)
/// migrates to the current version on connect, with every row intact;
/// several servers starting on it at once migrate it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_1_database_migrates_with_data_intact() {
    use warden_core::audit::Digest;
    use warden_core::ids::{RunId, StepId};
    use warden_store::{RecordStep, StepOutcome, StepStatus};

    let scratch = scratch_or_skip!();
    let raw = raw_client(&scratch.url).await;
    raw.batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let sql = scratch.client().await;
    sql.batch_execute(V1_SQL).await.unwrap();
    let entry = numbered(1).seal(1, Digest::GENESIS);
    sql.batch_execute(
        "INSERT INTO warden_meta (schema_version) VALUES (1);
         INSERT INTO agents (id, parent, capabilities, tools, config, status, created_at)
           VALUES ('root', NULL, '{memory.read,memory.write}', '{search}', '{\"m\":1}', 'active', 10),
                  ('child', 'root', '{memory.read}', '{}', NULL, 'revoked', 11);
         INSERT INTO tokens (token_id, hash, subject_kind, subject_agent, created_at)
           VALUES ('tok-1', decode(repeat('ab', 32), 'hex'), 'agent', 'root', 12);
         INSERT INTO memory (owner, namespace, key, value, visibility, class, revision,
                             created_at, updated_at)
           VALUES ('root', 'project', 'region', '\"eu\"', 'descendants', 'preference', 3, 1, 2);
         INSERT INTO runs (run_id, agent, sop_hash, sop, policy_version, created_at)
           VALUES ('run-old', 'root', decode(repeat('cd', 32), 'hex'), '{}', 'v1', 20);
         INSERT INTO run_steps (run_id, ord, step_id, action, operation_id)
           VALUES ('run-old', 0, 's1', 'memory.read', 'run-old:s1'),
                  ('run-old', 1, 's2', 'memory.read', 'run-old:s2');
         INSERT INTO changes (seq, kind, ids) VALUES (1, 'agent_inserted', '{root}');",
    )
    .await
    .unwrap();
    let (prev, hash): (Vec<u8>, Vec<u8>) = (entry.prev_hash.0.to_vec(), entry.hash.0.to_vec());
    sql.execute(
        "INSERT INTO audit_log VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        &[
            &1i64,
            &entry.draft.time.0,
            &entry.draft.subject,
            &entry.draft.operation,
            &entry.draft.resource,
            &entry.draft.verdict.as_str(),
            &entry.draft.reason,
            &entry.draft.policy_version,
            &entry.draft.details.to_string(),
            &prev,
            &hash,
        ],
    )
    .await
    .unwrap();
    sql.execute("UPDATE audit_head SET seq = 1, hash = $1", &[&hash])
        .await
        .unwrap();

    // Three servers start at once on the version 1 database.
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (url, schema) = (scratch.url.clone(), scratch.schema.clone());
        tasks.push(tokio::spawn(async move {
            PgStore::connect_in_schema(&url, &schema).await
        }));
    }
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.unwrap().unwrap());
    }
    let versions: Vec<i64> = sql
        .query("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [SCHEMA_VERSION]);
    assert_eq!(count_tables(&sql, &scratch.schema).await, TABLES);

    let store = &stores[0];
    let agents = store.load_agents().await.unwrap();
    assert_eq!(agents.len(), 2);
    assert_eq!(agents[0].id, id("root"));
    assert_eq!(agents[0].config, Some(json!({"m": 1})));
    assert_eq!(agents[1].parent, Some(id("root")));
    assert_eq!(
        agents[1].status,
        warden_core::hierarchy::AgentStatus::Revoked
    );
    assert!(agents.iter().all(|a| a.envelope_id.is_none()));
    let token = store.find_token(Digest([0xab; 32])).await.unwrap().unwrap();
    assert_eq!(token.token_id, "tok-1");
    let record = get_one(store, "root", "project", "region").await.unwrap();
    assert_eq!((record.value, record.revision), (json!("eu"), 3));
    let run_id = RunId::parse("run-old").unwrap();
    let run = store.get_run(run_id.clone()).await.unwrap().unwrap();
    assert_eq!(run.run.steps.len(), 2);
    assert_eq!(run.run.envelope_id, None);
    assert_eq!(store.changes_since(0, 10).await.unwrap().len(), 1);
    let report = store.verify_audit(None).await.unwrap();
    assert_eq!(report.verified.seq, 1);
    assert_eq!(report.verified.hash, entry.hash);

    // The migrated database keeps working, old rows and new features alike.
    let o = store
        .record_step(
            run_id,
            StepId::parse("s1").unwrap(),
            StepOutcome {
                status: StepStatus::Completed,
                result: Some(json!(1)),
                error: None,
                labels: Vec::new(),
                recorded_at: Timestamp(30),
            },
            vec![numbered(2)],
        )
        .await
        .unwrap();
    assert_eq!(o, RecordStep::Recorded);
    warden_store::conformance::run_context_checks(&stores[2])
        .await
        .unwrap();
    assert_chain(&stores[1]).await;
}

/// The version 2 schema, exactly as a version 2 build created it.
const V2_SQL: &str = include_str!("../../src/migrations/0002_context.sql");

/// A database at version 2 (before runs in flight were stored) migrates to
/// version 3 on connect: runs already finished are marked (a step that did
/// not complete, every step recorded, no steps), the others count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_database_marks_its_finished_runs() {
    use warden_core::audit::Digest;
    use warden_core::ids::{RunId, StepId};
    use warden_store::{CreateRun, RunRecord, RunStep, RunsInFlight, audit_if_created};

    let scratch = scratch_or_skip!();
    let raw = raw_client(&scratch.url).await;
    raw.batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let sql = scratch.client().await;
    sql.batch_execute(V1_SQL).await.unwrap();
    sql.batch_execute(V2_SQL).await.unwrap();
    sql.batch_execute(
        "INSERT INTO warden_meta (schema_version) VALUES (2);
         INSERT INTO runs (run_id, agent, sop_hash, sop, policy_version, created_at)
           SELECT r, 'kid', decode(repeat('cd', 32), 'hex'), '{}', 'v2', 7
           FROM unnest(ARRAY['open', 'done', 'failed', 'denied', 'empty']) AS r;
         INSERT INTO run_steps (run_id, ord, step_id, action, operation_id, status, labels,
                                recorded_at)
           VALUES ('open', 0, 'a', 'x', 'o:a', 'completed', '{}', 10),
                  ('open', 1, 'b', 'x', 'o:b', NULL, NULL, NULL),
                  ('done', 0, 'a', 'x', 'd:a', 'completed', '{}', 10),
                  ('done', 1, 'b', 'x', 'd:b', 'completed', '{}', 11),
                  ('failed', 0, 'a', 'x', 'f:a', 'failed', '{}', 10),
                  ('failed', 1, 'b', 'x', 'f:b', NULL, NULL, NULL),
                  ('denied', 0, 'a', 'x', 'n:a', 'denied', '{}', 10);",
    )
    .await
    .unwrap();
    let store = PgStore::connect_in_schema(&scratch.url, &scratch.schema)
        .await
        .unwrap();
    let version: i64 = sql
        .query_one("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    let finished: Vec<(String, Option<i64>)> = sql
        .query("SELECT run_id, finished_at FROM runs ORDER BY run_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        finished,
        vec![
            ("denied".to_string(), Some(10)),
            ("done".to_string(), Some(11)),
            ("empty".to_string(), Some(7)),
            ("failed".to_string(), Some(10)),
            ("open".to_string(), None),
        ]
    );
    let run = RunRecord {
        run_id: RunId::parse("new-1").unwrap(),
        agent: id("kid"),
        sop_hash: Digest::of(b"sop"),
        sop: json!({}),
        steps: vec![RunStep {
            step_id: StepId::parse("a").unwrap(),
            action: action("artifact.save"),
            operation_id: "new-1:a".into(),
        }],
        policy_version: "p".into(),
        created_at: Timestamp(20),
        envelope_id: None,
    };
    let limit = |max| {
        Some(RunsInFlight {
            max,
            since: Timestamp(0),
        })
    };
    let o = store
        .create_run(run.clone(), limit(1), audit_if_created(vec![]))
        .await
        .unwrap();
    assert_eq!(
        o,
        CreateRun::OverQuota {
            limit: 1,
            in_flight: 1
        }
    );
    let o = store
        .create_run(run, limit(2), audit_if_created(vec![]))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
}

/// The version 3 schema, exactly as a version 3 build created it.
const V3_SQL: &str = include_str!("../../src/migrations/0003_runs_in_flight.sql");

/// A database at version 3 (before tool-call sessions) migrates to version
/// 4 on connect: its envelopes are kept and shared with sessions (an id it
/// holds is taken), and sessions are stored and read back after a
/// reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_database_takes_sessions() {
    use warden_core::audit::Digest;
    use warden_core::decision::Subject;
    use warden_core::envelope::EnvelopeId;
    use warden_core::ids::SessionId;
    use warden_store::{CreateSession, SessionRecord, SessionState, SessionStatus};

    let scratch = scratch_or_skip!();
    let raw = raw_client(&scratch.url).await;
    raw.batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let sql = scratch.client().await;
    for migration in [V1_SQL, V2_SQL, V3_SQL] {
        sql.batch_execute(migration).await.unwrap();
    }
    let old = r#"{"envelope_id":"env-old","parent_envelope_id":null,"workflow_id":"wf","agent_id":"kid","labels":[],"aggregate_sensitivity":"internal","derived":[],"delegation_depth":0,"restrictions":[],"version":0}"#;
    sql.execute("INSERT INTO warden_meta (schema_version) VALUES (3)", &[])
        .await
        .unwrap();
    sql.execute(
        "INSERT INTO envelope_heads (envelope_id, version) VALUES ('env-old', 0)",
        &[],
    )
    .await
    .unwrap();
    sql.execute(
        "INSERT INTO envelopes (envelope_id, version, record) VALUES ('env-old', 0, $1)",
        &[&old],
    )
    .await
    .unwrap();
    let store = scratch.store().await;
    let version: i64 = sql
        .query_one("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(count_tables(&sql, &scratch.schema).await, TABLES);
    let kept = store
        .get_envelope(EnvelopeId::parse("env-old").unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    let state = |name: &str, envelope: &str| SessionState {
        session: SessionRecord {
            session_id: SessionId::parse(name).unwrap(),
            agent: id("kid"),
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
    let err = store
        .create_session(
            state("s-clash", "env-old"),
            Some(kept.clone()),
            None,
            Box::new(|_| vec![numbered(1)]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { ref id, .. } if id == "env-old"),
        "{err:?}"
    );
    let fresh = warden_core::envelope::EnvelopeRecord {
        envelope_id: EnvelopeId::parse("env-new").unwrap(),
        ..kept
    };
    let o = store
        .create_session(
            state("s-new", "env-new"),
            Some(fresh),
            None,
            Box::new(|_| vec![numbered(1)]),
        )
        .await
        .unwrap();
    assert_eq!(o, CreateSession::Created);
    drop(store);
    let store = scratch.store().await;
    assert_eq!(
        store
            .get_session(SessionId::parse("s-new").unwrap())
            .await
            .unwrap(),
        Some(state("s-new", "env-new"))
    );
    assert_eq!(store.list_sessions(None, 10).await.unwrap().len(), 1);
    assert_chain(&store).await;
}

/// The version 4 schema, exactly as a version 4 build created it.
const V4_SQL: &str = include_str!("../../src/migrations/0004_sessions.sql");

/// A schema at version 4 holding the session `s-old` with the calls
/// `(call_id, seq)` given, written through version 4's statements.
async fn write_v4_session(scratch: &Scratch, calls: &[(&str, u64)]) -> warden_store::SessionState {
    use warden_core::audit::Digest;
    use warden_core::decision::{Reason, Subject, Verdict};
    use warden_core::ids::{ActionName, CallId, SessionId};
    use warden_store::{CallRecord, CallStatus, SessionRecord, SessionState, SessionStatus};

    let raw = raw_client(&scratch.url).await;
    raw.batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let sql = scratch.client().await;
    for migration in [V1_SQL, V2_SQL, V3_SQL, V4_SQL] {
        sql.batch_execute(migration).await.unwrap();
    }
    sql.execute("INSERT INTO warden_meta (schema_version) VALUES (4)", &[])
        .await
        .unwrap();
    let session = SessionRecord {
        session_id: SessionId::parse("s-old").unwrap(),
        agent: id("kid"),
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
    sql.execute(
        "INSERT INTO sessions (session_id, agent, revision, created_at, record, sources) \
         VALUES ('s-old', 'kid', $1, 9, $2, '\\x01')",
        &[
            &i64::try_from(session.revision).unwrap(),
            &serde_json::to_string(&session).unwrap(),
        ],
    )
    .await
    .unwrap();
    let mut records = Vec::new();
    for (call_id, seq) in calls {
        let c = CallRecord {
            call_id: CallId::parse(call_id).unwrap(),
            seq: *seq,
            action: ActionName::parse("http.get").unwrap(),
            arguments_hash: Digest::of(call_id.as_bytes()),
            verdict: Verdict::Allow,
            reason: Reason::code("call_allowed"),
            detail: json!({"provenance": []}),
            plan_step: None,
            escalation_id: None,
            status: CallStatus::Allowed,
            decided_at: Timestamp(10),
            result_hash: None,
            result_labels: Vec::new(),
            completed_at: None,
        };
        sql.execute(
            "INSERT INTO session_calls (session_id, call_id, seq, record) \
             VALUES ('s-old', $1, $2, $3)",
            &[
                &c.call_id.as_str(),
                &i64::try_from(c.seq).unwrap(),
                &serde_json::to_string(&c).unwrap(),
            ],
        )
        .await
        .unwrap();
        records.push(c);
    }
    records.sort_by_key(|c| c.seq);
    SessionState {
        session,
        sources: vec![1],
        calls: records,
    }
}

/// A schema at version 4 migrates to version 5 with its sessions and calls
/// intact, and from then on a call at a taken `seq` is refused; one whose
/// session holds two calls at one `seq` (which no engine wrote) fails the
/// migration and is left at version 4, unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_database_takes_unique_call_positions() {
    use warden_core::ids::CallId;
    use warden_store::{Entity, SessionUpdate, UpdateSession};

    let scratch = scratch_or_skip!();
    let before = write_v4_session(&scratch, &[("c-b", 1), ("c-a", 0)]).await;
    let store = scratch.store().await;
    let id = before.session.session_id.clone();
    assert_eq!(
        store.get_session(id.clone()).await.unwrap(),
        Some(before.clone())
    );
    let mut taken = before.calls[0].clone();
    taken.call_id = CallId::parse("c-new").unwrap();
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
            Box::new(|_| vec![numbered(1)]),
        )
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::duplicate(Entity::Call, "s-old/#0"));
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
            Box::new(|_| vec![numbered(1)]),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    assert_eq!(store.get_session(id).await.unwrap().unwrap().calls.len(), 3);
    drop(store);

    // Two calls at one position: the migration fails and changes nothing.
    let scratch = scratch_or_skip!();
    write_v4_session(&scratch, &[("c-a", 0), ("c-b", 0)]).await;
    let err = PgStore::connect_in_schema(&scratch.url, &scratch.schema)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("version 5"), "{err}");
    let sql = scratch.client().await;
    let version: i64 = sql
        .query_one("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 4);
    let calls: i64 = sql
        .query_one("SELECT count(*) FROM session_calls", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(calls, 2);
}
