//! The group-commit writers: concurrent writes through two stores (two
//! servers) form one chain with no gaps; a job that fails in a group rolls
//! back alone; a group whose connection is killed acknowledges none of its
//! jobs, and the writer carries on.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
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
    let client = scratch.client().await;
    client
        .batch_execute("BEGIN; SELECT seq FROM audit_head FOR UPDATE")
        .await
        .unwrap();
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (client, pid)
}

/// The backends waiting for the lock `blocker` holds.
async fn blocked_by(client: &tokio_postgres::Client, blocker: i32) -> Vec<i32> {
    client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            &[&blocker],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
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
