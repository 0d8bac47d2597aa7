//! The group-commit writers: concurrent writes through two stores (two
//! servers) form one chain with no gaps; a job that fails in a group rolls
//! back alone; a group whose connection is killed acknowledges none of its
//! jobs, and the writer carries on; the writers run on a thread of their
//! own.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use warden_core::audit::ChainHead;
use warden_core::decision::Verdict;
use warden_core::hierarchy::AgentStatus;
use warden_core::time::Timestamp;
use warden_postgres::{PgOptions, PgStore};
use warden_store::{PutOutcome, StorageQuota, Store, StoreError};

use crate::support::*;

async fn store(scratch: &Scratch, writers: usize) -> PgStore {
    PgStore::connect_with(
        &scratch.url,
        PgOptions {
            writers,
            ..scratch.options(4)
        },
    )
    .await
    .unwrap()
}

/// Hold the audit head row lock on a raw connection: every group that
/// reaches its append waits, and the jobs sent meanwhile queue up behind
/// it. Returns the client (roll back to release) and its backend pid.
async fn hold_head(scratch: &Scratch) -> (tokio_postgres::Client, i32) {
    scratch
        .holding("BEGIN; SELECT seq FROM audit_head FOR UPDATE")
        .await
}

async fn wait_blocked(client: &tokio_postgres::Client, blocker: i32, n: usize) -> Vec<i32> {
    for _ in 0..500 {
        let pids = blocked_by(client, blocker).await;
        if pids.len() >= n {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no writer reached the head lock");
}

/// The stored records' keys (as the key of a map).
async fn stored_keys(scratch: &Scratch) -> BTreeMap<String, ()> {
    scratch
        .client()
        .await
        .query("SELECT key FROM memory", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), ()))
        .collect()
}

/// The transaction (`xmin`) of each audit entry, by resource: a group
/// inserts its entries in one statement of its top-level transaction.
async fn xmins(scratch: &Scratch) -> BTreeMap<String, String> {
    scratch
        .client()
        .await
        .query("SELECT resource, xmin::text FROM audit_log", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// 2 stores x 2 writers, 160 concurrent tasks each making a create-only put
/// and a plain audit append: every one is acknowledged, every record has
/// its one audit entry, the chain has no gap and verifies, and groups did
/// form (fewer transactions than writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_through_two_stores_form_one_chain() {
    let scratch = scratch_or_skip!();
    let a = store(&scratch, 2).await;
    let b = store(&scratch, 2).await;
    const TASKS: u64 = 160;
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let k = format!("k{i}");
            let outcome = s
                .put_record(
                    put(&format!("agent{}", i % 7), "batch", &k, json!(i), Some(0)),
                    Timestamp(1),
                    StorageQuota::default(),
                    put_audit("w", &format!("batch.{k}"), i),
                )
                .await
                .unwrap();
            assert!(matches!(outcome, PutOutcome::Written { created: true, .. }));
            s.append_audit(vec![numbered(10_000 + i)]).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let head = assert_chain(&a).await;
    assert_eq!(head.count, 2 * TASKS);
    let entries = audit_all(&b).await;
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=2 * TASKS).collect::<Vec<_>>());
    for i in 0..TASKS {
        let k = format!("k{i}");
        let owner = format!("agent{}", i % 7);
        assert_eq!(
            get_one(&a, &owner, "batch", &k).await.unwrap().value,
            json!(i)
        );
        let resource = format!("batch.{k}");
        assert_eq!(
            entries
                .iter()
                .filter(|e| e.draft.resource == resource)
                .count(),
            1,
            "{resource}"
        );
        let details = json!({"i": 10_000 + i});
        assert_eq!(
            entries
                .iter()
                .filter(|e| e.draft.details == details)
                .count(),
            1
        );
    }
    let groups: std::collections::BTreeSet<String> = xmins(&scratch).await.into_values().collect();
    assert!(
        (groups.len() as u64) < 2 * TASKS,
        "{} transactions for {} decisions: no group formed",
        groups.len(),
        2 * TASKS
    );
}

/// One group holding a write, a compare-and-set that conflicts, a job
/// that fails after changing a row (a revocation naming an unknown agent),
/// and another write: the writes and the conflict's record commit together,
/// the failed job's change and its audit entries are absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_job_rolls_back_alone_in_its_group() {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    s.insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    s.put_record(
        put("root", "g", "cas", json!(1), Some(0)),
        Timestamp(1),
        StorageQuota::default(),
        put_audit("root", "g.cas", 0),
    )
    .await
    .unwrap();
    let before = head_count(&s).await;

    let (holder, pid) = hold_head(&scratch).await;
    // The first group waits at the head lock; the rest queue behind it.
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.append_audit(vec![numbered(1)]).await }
    });
    wait_blocked(&holder, pid, 1).await;
    let w1 = tokio::spawn({
        let s = s.clone();
        async move {
            s.put_record(
                put("root", "g", "one", json!("one"), Some(0)),
                Timestamp(2),
                StorageQuota::default(),
                put_audit("root", "g.one", 1),
            )
            .await
        }
    });
    let cas = tokio::spawn({
        let s = s.clone();
        async move {
            s.put_record(
                put("root", "g", "cas", json!(2), Some(7)),
                Timestamp(2),
                StorageQuota::default(),
                put_audit("root", "g.cas.again", 2),
            )
            .await
        }
    });
    let failing = tokio::spawn({
        let s = s.clone();
        async move {
            s.set_agent_status(
                vec![id("root"), id("nobody")],
                AgentStatus::Revoked,
                vec![draft(
                    "@operator",
                    "agent.revoke",
                    "root",
                    Verdict::Allow,
                    "revoked",
                )],
            )
            .await
        }
    });
    let w2 = tokio::spawn({
        let s = s.clone();
        async move {
            s.put_record(
                put("root", "g", "two", json!("two"), Some(0)),
                Timestamp(2),
                StorageQuota::default(),
                put_audit("root", "g.two", 3),
            )
            .await
        }
    });
    // Let the four jobs reach the writer's queue, then release the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.batch_execute("ROLLBACK").await.unwrap();

    first.await.unwrap().unwrap();
    assert!(matches!(
        w1.await.unwrap().unwrap(),
        PutOutcome::Written { created: true, .. }
    ));
    assert!(matches!(
        cas.await.unwrap().unwrap(),
        PutOutcome::Conflict { current: Some(1) }
    ));
    let err = failing.await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(matches!(
        w2.await.unwrap().unwrap(),
        PutOutcome::Written { created: true, .. }
    ));

    // The two writes committed in one transaction: one group.
    let x = xmins(&scratch).await;
    assert_eq!(x["g.one"], x["g.two"]);
    assert_eq!(
        x["g.one"], x["g.cas.again"],
        "the conflict's record is in the group"
    );
    // The failed job's revocation is absent, and so is its record.
    let agents = s.load_agents().await.unwrap();
    assert_eq!(agents[0].status, AgentStatus::Active);
    let entries = audit_all(&s).await;
    assert!(entries.iter().all(|e| e.draft.operation != "agent.revoke"));
    let head = assert_chain(&s).await;
    // first's entry, w1's, the conflict's, w2's.
    assert_eq!(head.count, before + 4);
    assert_eq!(
        get_one(&s, "root", "g", "cas").await.unwrap().value,
        json!(1)
    );
}

/// The writer's connection is killed (`pg_terminate_backend`) while its
/// group waits for the head lock and more jobs are queued: every caller
/// gets an answer, each either an error or a write that is stored with its
/// audit entry (nothing acknowledged is missing), nothing of the killed
/// group is stored, and the writer reconnects for the next writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_group_acknowledges_nothing_and_the_writer_recovers() {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    s.audit_head().await.unwrap();
    let (holder, pid) = hold_head(&scratch).await;
    const N: u64 = 40;
    let mut tasks = Vec::new();
    for i in 0..N {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let k = format!("k{i}");
            let r = s
                .put_record(
                    put("w", "kill", &k, json!(i), Some(0)),
                    Timestamp(1),
                    StorageQuota::default(),
                    put_audit("w", &format!("kill.{k}"), i),
                )
                .await;
            (k, r)
        }));
        if i == 0 {
            // The first group (this job) reaches the lock; the others queue.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let writer = wait_blocked(&holder, pid, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for victim in writer {
        holder
            .query("SELECT pg_terminate_backend($1)", &[&victim])
            .await
            .unwrap();
    }
    holder.batch_execute("ROLLBACK").await.unwrap();

    let mut acknowledged = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await.unwrap() {
            (k, Ok(PutOutcome::Written { .. })) => acknowledged.push(k),
            (_, Ok(other)) => panic!("{other:?}"),
            (_, Err(e)) => {
                assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
                failed += 1;
            }
        }
    }
    assert!(failed >= 1, "the killed group's job must fail");
    // Written later through the reconnected writer.
    s.put_record(
        put("w", "kill", "after", json!("after"), Some(0)),
        Timestamp(2),
        StorageQuota::default(),
        put_audit("w", "kill.after", 99),
    )
    .await
    .unwrap();
    let entries = audit_all(&s).await;
    let stored = stored_keys(&scratch).await;
    for k in &acknowledged {
        assert!(stored.contains_key(k), "acknowledged `{k}` is missing");
        let resource = format!("kill.{k}");
        assert_eq!(
            entries
                .iter()
                .filter(|e| e.draft.resource == resource)
                .count(),
            1
        );
    }
    // Only what was acknowledged (and the later write) is stored.
    assert_eq!(stored.len(), acknowledged.len() + 1);
    assert_eq!(entries.len(), acknowledged.len() + 1);
    assert!(stored.contains_key("after"));
    assert_chain(&s).await;
}

/// The `i` of each entry's details, in chain order.
async fn numbers(store: &PgStore) -> Vec<u64> {
    audit_all(store)
        .await
        .iter()
        .map(|e| e.draft.details["i"].as_u64().unwrap())
        .collect()
}

/// A store's writers seal an audit-only group after the head they expect;
/// when another store has moved the head meanwhile, the group writes
/// nothing and is appended again under the head lock: every entry is
/// stored once, in order, and the chain verifies. Alternating appends
/// through two stores make every prediction after the first wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_append_on_a_head_another_store_moved_is_appended_again() {
    let scratch = scratch_or_skip!();
    let a = store(&scratch, 1).await;
    let b = store(&scratch, 1).await;
    for i in 0..12 {
        let s = if i % 3 == 0 { &b } else { &a };
        let head = s
            .append_audit(vec![numbered(i), numbered(100 + i)])
            .await
            .unwrap();
        // The head returned is that of the last entry stored.
        let all = audit_all(s).await;
        let last = all.last().unwrap();
        assert_eq!(
            head,
            ChainHead {
                count: 2 * i + 2,
                seq: last.seq,
                hash: last.hash,
            },
            "append {i}"
        );
        assert_eq!(last.seq, 2 * i + 2);
    }
    assert_chain(&a).await;
    let expected: Vec<u64> = (0..12).flat_map(|i| [i, 100 + i]).collect();
    assert_eq!(numbers(&a).await, expected);
}

/// 2 stores x 3 writers, 600 concurrent audit-only appends: predictions
/// race one another (within a store, consecutive groups are sealed one
/// after the other; across stores they collide) and every append is
/// acknowledged once, stored once, and the chain verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_audit_only_appends_through_two_stores_form_one_chain() {
    let scratch = scratch_or_skip!();
    let a = store(&scratch, 3).await;
    let b = store(&scratch, 3).await;
    race_appends(a, b).await;
}

/// The same race where the database's default isolation is serializable
/// (set for the connections by the URL): a predicted append is a statement
/// run as its own transaction, which the connection setup puts at read
/// committed. At serializable, its update of a head row another store has
/// just moved would fail with a serialization error instead of checking
/// the row again and writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_appends_hold_where_the_default_isolation_is_serializable() {
    let scratch = scratch_or_skip!();
    let sep = if scratch.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options=-c%20default_transaction_isolation%3Dserializable",
        scratch.url
    );
    let shown: String = raw_client(&url)
        .await
        .query_one("SHOW default_transaction_isolation", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown, "serializable", "the URL sets the default");
    let open = || {
        PgStore::connect_with(
            &url,
            PgOptions {
                writers: 3,
                ..scratch.options(4)
            },
        )
    };
    let a = open().await.unwrap();
    let b = open().await.unwrap();
    race_appends(a, b).await;
}

/// 600 concurrent audit-only appends, alternately through `a` and `b`.
async fn race_appends(a: PgStore, b: PgStore) {
    const TASKS: u64 = 600;
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { s.append_audit(vec![numbered(i)]).await.unwrap() })
        })
        .collect();
    let mut acknowledged = Vec::new();
    for t in tasks {
        acknowledged.push(t.await.unwrap().seq);
    }
    acknowledged.sort_unstable();
    assert_eq!(acknowledged, (1..=TASKS).collect::<Vec<_>>());
    let head = assert_chain(&b).await;
    assert_eq!(head.count, TASKS);
    let mut stored = numbers(&a).await;
    stored.sort_unstable();
    assert_eq!(stored, (0..TASKS).collect::<Vec<_>>());
}

/// Audit-only groups sealed on a predicted head wait on the head row held
/// by another transaction; their writer's connection is killed: every
/// caller is answered, the killed groups' entries are absent, everything
/// acknowledged is present once, and the next appends (no longer on the
/// lost prediction) chain on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_predicted_append_acknowledges_nothing() {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    // A first append sets the prediction.
    s.append_audit(vec![numbered(0)]).await.unwrap();
    let (holder, pid) = hold_head(&scratch).await;
    const N: u64 = 30;
    let mut tasks = Vec::new();
    for i in 1..=N {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.append_audit(vec![numbered(i)]).await
        }));
        if i == 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let writer = wait_blocked(&holder, pid, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for victim in writer {
        holder
            .query("SELECT pg_terminate_backend($1)", &[&victim])
            .await
            .unwrap();
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    let mut acknowledged = vec![0];
    let mut failed = 0;
    for (i, t) in (1..=N).zip(tasks) {
        match t.await.unwrap() {
            Ok(_) => acknowledged.push(i),
            Err(e) => {
                assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
                failed += 1;
            }
        }
    }
    assert!(failed >= 1, "the killed group's append must fail");
    s.append_audit(vec![numbered(1_000)]).await.unwrap();
    s.append_audit(vec![numbered(1_001)]).await.unwrap();
    acknowledged.extend([1_000, 1_001]);
    assert_chain(&s).await;
    let mut stored = numbers(&s).await;
    stored.sort_unstable();
    assert_eq!(stored, acknowledged);
}

/// Send a put on its own task and give it time to reach the writer's
/// queue, so that puts queue in the order they are sent.
async fn queued_put(
    s: &PgStore,
    p: warden_core::memory::Put,
    quota: StorageQuota,
    resource: &str,
    tag: u64,
) -> tokio::task::JoinHandle<Result<PutOutcome, StoreError>> {
    let s = s.clone();
    let audit = put_audit("w", resource, tag);
    let task = tokio::spawn(async move { s.put_record(p, Timestamp(5), quota, audit).await });
    tokio::time::sleep(Duration::from_millis(30)).await;
    task
}

/// The head lock held and a first group waiting on it, so that what is
/// sent next queues up into the writer's next group.
async fn stalled_writer(
    scratch: &Scratch,
    s: &PgStore,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<ChainHead, StoreError>>,
) {
    let (holder, pid) = hold_head(scratch).await;
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.append_audit(vec![numbered(1)]).await }
    });
    wait_blocked(&holder, pid, 1).await;
    (holder, first)
}

fn written(outcome: PutOutcome) -> (u64, bool) {
    match outcome {
        PutOutcome::Written { record, created } => (record.revision, created),
        other => panic!("not written: {other:?}"),
    }
}

/// Puts of distinct owners queued together are decided together (their
/// reads in one round trip, their writes in another) and answer as one at
/// a time would: an update, a compare-and-set conflict, a create over the
/// owner's record quota, a create without a quota; a second put of an
/// owner waits for the first wave and sees its owner's first write, while
/// a later put of a new owner joins the first wave. All commit in one
/// transaction, the audit entries in wave order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_of_puts_of_distinct_owners_answers_as_one_at_a_time_would() {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    for owner in ["a", "b", "c"] {
        s.put_record(
            put(owner, "g", "k", json!(0), Some(0)),
            Timestamp(1),
            StorageQuota::default(),
            put_audit("w", "setup", 0),
        )
        .await
        .unwrap();
    }
    let before = head_count(&s).await;
    let one_record = StorageQuota {
        max_records: Some(1),
        max_bytes: None,
    };
    let roomy = StorageQuota {
        max_records: Some(10),
        max_bytes: Some(1_000),
    };
    let (holder, first) = stalled_writer(&scratch, &s).await;
    let update = queued_put(&s, put("a", "g", "k", json!("a1"), None), roomy, "r.a", 1).await;
    let conflict = queued_put(
        &s,
        put("b", "g", "k", json!("b1"), Some(7)),
        StorageQuota::default(),
        "r.b",
        2,
    )
    .await;
    let over = queued_put(
        &s,
        put("c", "g", "new", json!("c1"), Some(0)),
        one_record,
        "r.c",
        3,
    )
    .await;
    let create = queued_put(
        &s,
        put("d", "g", "k", json!("d1"), Some(0)),
        StorageQuota::default(),
        "r.d",
        4,
    )
    .await;
    // Owner `a` again: after the others, on the first's write (revision 2).
    let again = queued_put(
        &s,
        put("a", "g", "k", json!("a2"), Some(2)),
        roomy,
        "r.a2",
        5,
    )
    .await;
    // A new owner after it runs with the first wave.
    let late = queued_put(&s, put("e", "g", "k", json!("e1"), None), roomy, "r.e", 6).await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    first.await.unwrap().unwrap();

    assert_eq!(written(update.await.unwrap().unwrap()), (2, false));
    assert!(matches!(
        conflict.await.unwrap().unwrap(),
        PutOutcome::Conflict { current: Some(1) }
    ));
    assert!(matches!(
        over.await.unwrap().unwrap(),
        PutOutcome::OverQuota {
            limit: 1,
            used: 1,
            ..
        }
    ));
    assert_eq!(written(create.await.unwrap().unwrap()), (1, true));
    assert_eq!(written(again.await.unwrap().unwrap()), (3, false));
    assert_eq!(written(late.await.unwrap().unwrap()), (1, true));

    assert_eq!(get_one(&s, "a", "g", "k").await.unwrap().value, json!("a2"));
    assert_eq!(get_one(&s, "b", "g", "k").await.unwrap().value, json!(0));
    assert!(get_one(&s, "c", "g", "new").await.is_none());
    assert_eq!(get_one(&s, "d", "g", "k").await.unwrap().value, json!("d1"));
    let x = xmins(&scratch).await;
    for r in ["r.b", "r.c", "r.d", "r.a2", "r.e"] {
        assert_eq!(x[r], x["r.a"], "{r} is in the group's transaction");
    }
    let head = assert_chain(&s).await;
    assert_eq!(head.count, before + 7);
    let order: Vec<String> = audit_all(&s)
        .await
        .into_iter()
        .skip(before as usize + 1)
        .map(|e| e.draft.resource)
        .collect();
    // The first put of each owner, then `a`'s second.
    assert_eq!(order, ["r.a", "r.b", "r.c", "r.d", "r.e", "r.a2"]);
}

/// A statement of a run of puts fails (a trigger refuses one key): the
/// run rolls back to its savepoint and every put runs alone, so the
/// failing put fails alone, without its audit entry, and the others
/// commit with theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_statement_in_a_run_of_puts_fails_that_put_alone() {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    scratch
        .client()
        .await
        .batch_execute(
            "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.key = 'boom' THEN RAISE EXCEPTION 'boom refused'; END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER refuse_boom BEFORE INSERT OR UPDATE ON memory \
             FOR EACH ROW EXECUTE FUNCTION refuse_boom()",
        )
        .await
        .unwrap();
    s.audit_head().await.unwrap();
    let before = head_count(&s).await;
    let (holder, first) = stalled_writer(&scratch, &s).await;
    let q = StorageQuota::default();
    let one = queued_put(&s, put("a", "g", "one", json!(1), Some(0)), q, "r.one", 1).await;
    let boom = queued_put(&s, put("b", "g", "boom", json!(2), Some(0)), q, "r.boom", 2).await;
    let two = queued_put(&s, put("c", "g", "two", json!(3), Some(0)), q, "r.two", 3).await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    first.await.unwrap().unwrap();

    assert_eq!(written(one.await.unwrap().unwrap()), (1, true));
    let err = boom.await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    // Its own statement's error, not the run's.
    let mut chain = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(&err);
    while let Some(c) = cause {
        chain.push(c.to_string());
        cause = c.source();
    }
    assert!(
        chain.iter().any(|c| c.contains("boom refused")),
        "{chain:?}"
    );
    assert_eq!(written(two.await.unwrap().unwrap()), (1, true));
    let stored = stored_keys(&scratch).await;
    assert_eq!(stored.keys().collect::<Vec<_>>(), ["one", "two"]);
    let x = xmins(&scratch).await;
    assert_eq!(x["r.one"], x["r.two"]);
    assert!(!x.contains_key("r.boom"));
    assert_eq!(assert_chain(&s).await.count, before + 3);
}

/// Another transaction changes two rows of a run between its reads and
/// its writes (the writes wait on its row locks): each conditional write
/// changes nothing, and each put is decided again alone against what that
/// transaction committed: the unconditional put is written on top of it,
/// the compare-and-set on the old revision is a conflict. A group of puts
/// only sends its writes with its audit entries and `COMMIT`: the write
/// that changed nothing rolls the group back, and the group runs again
/// the careful way; each put's audit entry is the one of the outcome
/// that committed, recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_of_a_run_that_loses_a_race_is_decided_again() {
    lost_race(false).await;
}

/// The same race in a group that also holds a job of another kind, so
/// that the group runs the careful way from the start: the run of puts
/// reads in one round trip and writes in another, in its savepoint, and
/// the puts whose writes changed nothing are decided again alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_of_a_run_that_loses_a_race_in_a_mixed_group_is_decided_again() {
    lost_race(true).await;
}

async fn lost_race(mixed: bool) {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    for owner in ["a", "b"] {
        s.put_record(
            put(owner, "g", "k", json!(0), Some(0)),
            Timestamp(1),
            StorageQuota::default(),
            put_audit("w", "setup", 0),
        )
        .await
        .unwrap();
    }
    let (outside, outside_pid) = scratch
        .holding(
            "BEGIN; UPDATE memory SET value = '\"outside\"', revision = revision + 1 \
             WHERE key = 'k'",
        )
        .await;
    let (holder, first) = stalled_writer(&scratch, &s).await;
    let q = StorageQuota::default();
    let plain = queued_put(&s, put("a", "g", "k", json!("ours"), None), q, "r.a", 1).await;
    let cas = queued_put(&s, put("b", "g", "k", json!("ours"), Some(1)), q, "r.b", 2).await;
    // A job of another kind in the same group: a revocation naming an
    // unknown agent, which fails alone.
    let other = mixed.then(|| {
        let s = s.clone();
        tokio::spawn(async move {
            s.set_agent_status(
                vec![id("nobody")],
                AgentStatus::Revoked,
                vec![draft(
                    "@operator",
                    "agent.revoke",
                    "nobody",
                    Verdict::Allow,
                    "revoked",
                )],
            )
            .await
        })
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    first.await.unwrap().unwrap();
    // The run has read revision 1 and its writes wait on the rows.
    wait_blocked(&holder, outside_pid, 1).await;
    outside.batch_execute("COMMIT").await.unwrap();

    assert_eq!(written(plain.await.unwrap().unwrap()), (3, false));
    assert!(matches!(
        cas.await.unwrap().unwrap(),
        PutOutcome::Conflict { current: Some(2) }
    ));
    if let Some(other) = other {
        assert!(other.await.unwrap().is_err());
    }
    let entries = audit_all(&s).await;
    let of = |resource: &str| -> Vec<Value> {
        entries
            .iter()
            .filter(|e| e.draft.resource == resource)
            .map(|e| e.draft.details.clone())
            .collect()
    };
    assert_eq!(of("r.a").len(), 1, "{:?}", of("r.a"));
    assert_eq!(of("r.a")[0]["revision"], json!(3));
    assert_eq!(of("r.b").len(), 1, "{:?}", of("r.b"));
    assert!(of("nobody").is_empty());
    assert_eq!(
        get_one(&s, "a", "g", "k").await.unwrap().value,
        json!("ours")
    );
    assert_eq!(
        get_one(&s, "b", "g", "k").await.unwrap().value,
        json!("outside")
    );
    assert_chain(&s).await;
}

/// The writer's connection is killed while a run of puts waits on a row
/// lock half-way through: no put of the run is acknowledged or stored,
/// nor its audit entry, and the writer carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_of_puts_killed_half_way_acknowledges_nothing() {
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    s.put_record(
        put("a", "g", "k", json!(0), Some(0)),
        Timestamp(1),
        StorageQuota::default(),
        put_audit("w", "setup", 0),
    )
    .await
    .unwrap();
    let before = head_count(&s).await;
    let (outside, outside_pid) = scratch
        .holding("BEGIN; SELECT 1 FROM memory WHERE key = 'k' FOR UPDATE")
        .await;
    let (holder, first) = stalled_writer(&scratch, &s).await;
    let q = StorageQuota::default();
    let mut puts = Vec::new();
    for (i, owner) in ["b", "a", "c", "d"].into_iter().enumerate() {
        let p = put(owner, "g", "k", json!("run"), None);
        puts.push(queued_put(&s, p, q, &format!("r.{owner}"), i as u64).await);
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    first.await.unwrap().unwrap();
    let writer = wait_blocked(&holder, outside_pid, 1).await;
    for victim in writer {
        holder
            .query("SELECT pg_terminate_backend($1)", &[&victim])
            .await
            .unwrap();
    }
    outside.batch_execute("ROLLBACK").await.unwrap();
    for p in puts {
        let err = p.await.unwrap().unwrap_err();
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    }
    assert_eq!(stored_keys(&scratch).await.len(), 1);
    assert_eq!(get_one(&s, "a", "g", "k").await.unwrap().value, json!(0));
    assert_eq!(assert_chain(&s).await.count, before + 1);
    // The writer reconnects for the next group.
    let after = put("e", "g", "k", json!("after"), Some(0));
    assert_eq!(
        written(
            s.put_record(after, Timestamp(6), q, put_audit("w", "r.e", 9))
                .await
                .unwrap()
        ),
        (1, true)
    );
}

/// Every class through a run of puts (creates and updates in one group):
/// what is stored is what each put answered, column for column (the
/// grants in their order, an empty grant list, a policy's combinator, a
/// task's expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_of_puts_stores_every_class_as_it_answered() {
    use warden_core::memory::{Combinator, RecordClass};
    let scratch = scratch_or_skip!();
    let s = store(&scratch, 1).await;
    let with_class = |owner: &str, value, class: RecordClass, expected| {
        let mut p = put(owner, "g", "k", value, expected);
        p.class = Some(class);
        p
    };
    let secret = |grants: &[&str]| RecordClass::Secret {
        grants: grants.iter().map(|g| id(g)).collect(),
    };
    // Records to update, written one at a time.
    for (owner, class) in [
        ("u1", secret(&["z", "y"])),
        (
            "u2",
            RecordClass::Policy {
                combine: Combinator::Min,
            },
        ),
    ] {
        s.put_record(
            with_class(owner, json!(1), class, Some(0)),
            Timestamp(1),
            StorageQuota::default(),
            put_audit("w", "setup", 0),
        )
        .await
        .unwrap();
    }
    let (holder, first) = stalled_writer(&scratch, &s).await;
    let q = StorageQuota::default();
    let puts = [
        with_class("u1", json!(2), secret(&["b", "a", "c"]), Some(1)),
        with_class(
            "u2",
            json!(3),
            RecordClass::Policy {
                combine: Combinator::Max,
            },
            Some(1),
        ),
        with_class("n1", json!("s"), secret(&["y", "x"]), Some(0)),
        with_class("n2", json!("s"), secret(&[]), Some(0)),
        with_class(
            "n3",
            json!(4),
            RecordClass::Policy {
                combine: Combinator::Min,
            },
            None,
        ),
        with_class(
            "n4",
            json!({"t": [1, 2]}),
            RecordClass::Task {
                expires_at: Some(Timestamp(99)),
            },
            None,
        ),
        with_class(
            "n5",
            json!(null),
            RecordClass::Task { expires_at: None },
            None,
        ),
    ];
    let mut tasks = Vec::new();
    for (i, p) in puts.into_iter().enumerate() {
        let owner = p.owner.to_string();
        tasks.push((
            owner,
            queued_put(&s, p, q, &format!("r{i}"), i as u64).await,
        ));
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    first.await.unwrap().unwrap();
    for (owner, task) in tasks {
        let PutOutcome::Written { record, .. } = task.await.unwrap().unwrap() else {
            panic!("{owner}: not written");
        };
        let stored = get_one(&s, &owner, "g", "k").await.unwrap();
        assert_eq!(stored, record, "{owner}");
    }
    let stored = get_one(&s, "u1", "g", "k").await.unwrap();
    assert_eq!(stored.class, secret(&["b", "a", "c"]));
    assert_eq!(stored.revision, 2);
    let x = xmins(&scratch).await;
    assert!((1..7).all(|i| x[&format!("r{i}")] == x["r0"]), "one group");
    assert_chain(&s).await;
}

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim_end().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The writers run on a thread of their own, not on the caller's runtime:
/// an append sent from a single-threaded runtime commits while that
/// runtime's one thread is blocked. Another thread, with its own runtime
/// and connection, holds the head lock while the append is sent (so it
/// cannot finish yet), then releases it while this runtime's thread is
/// blocked and sees the entry committed; the answer is ready once the
/// runtime runs again. On the caller's runtime, nothing could run until the
/// thread was free. The record-reads task has a thread of its own too.
#[tokio::test(flavor = "current_thread")]
async fn the_writers_commit_while_the_callers_runtime_is_blocked() {
    let scratch = scratch_or_skip!();
    let store = store(&scratch, 1).await;
    if std::path::Path::new("/proc/self/task").exists() {
        // A new thread names itself once it runs: give it a moment.
        for thread in ["warden-writer", "warden-reads"] {
            let mut names = thread_names();
            for _ in 0..100 {
                if names.iter().any(|n| n == thread) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
                names = thread_names();
            }
            assert!(
                names.iter().any(|n| n == thread),
                "no thread `{thread}` among {names:?}"
            );
        }
    }
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let url = scratch.url.clone();
    let schema = scratch.schema.clone();
    let other = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let client = raw_client(&url).await;
            client
                .batch_execute(&format!(
                    "BEGIN; SELECT seq FROM \"{schema}\".audit_head FOR UPDATE"
                ))
                .await
                .unwrap();
            locked_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            client.batch_execute("ROLLBACK").await.unwrap();
            let count = format!("SELECT count(*) FROM \"{schema}\".audit_log");
            for _ in 0..400 {
                let n: i64 = client.query_one(&count, &[]).await.unwrap().get(0);
                if n == 1 {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            false
        })
    });
    locked.recv().unwrap();
    let mut append = Box::pin(store.append_audit(vec![numbered(1)]));
    // Sent, and waiting for the head lock the other thread holds.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut append)
            .await
            .is_err(),
        "the append finished while the head lock was held by another transaction"
    );
    // Block this runtime's only thread while the other releases the lock
    // and waits for the entry.
    go.send(()).unwrap();
    let seen = other.join().unwrap();
    assert!(
        seen,
        "the entry was not committed while the caller's runtime was blocked"
    );
    let head = append.await.unwrap();
    assert_eq!(head.seq, 1);
    assert_chain(&store).await;
}
