//! Races: compare-and-set across connections and across store instances
//! (as several servers would run), and the one audit chain they share.

use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;
use warden_core::audit::AuditDraft;
use warden_core::decision::Verdict;
use warden_core::time::Timestamp;
use warden_postgres::PgStore;
use warden_store::{PutOutcome, Store, StoreError};

use crate::support::*;

const WRITERS: usize = 16;

/// 16 writers, each its own store instance with one connection (16
/// servers, in effect), race with the same expected revision: exactly one
/// writes, 15 conflict, the stored value is the winner's, all 16 attempts
/// are audited and the chain verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_writers_same_revision_exactly_one_wins() {
    let scratch = scratch_or_skip!();
    let setup = scratch.store().await;
    setup
        .put_record(
            put("a", "ns", "k", json!("start"), Some(0)),
            Timestamp(1),
            warden_store::StorageQuota::default(),
            put_audit("a", "ns.k", 1000),
        )
        .await
        .unwrap();
    let mut stores = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        let s = scratch.store_with(1).await;
        // Open the instance's one connection before the race starts.
        s.audit_head().await.unwrap();
        stores.push(s);
    }
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for (i, store) in stores.into_iter().enumerate() {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = store
                .put_record(
                    put("a", "ns", "k", json!({"writer": i}), Some(1)),
                    Timestamp(2),
                    warden_store::StorageQuota::default(),
                    put_audit("a", "ns.k", i as u64),
                )
                .await
                .unwrap();
            (i, outcome)
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            (i, PutOutcome::Written { record, created }) => {
                assert!(!created);
                assert_eq!(record.revision, 2);
                winners.push(i);
            }
            (_, PutOutcome::Conflict { current }) => {
                assert_eq!(current, Some(2));
                conflicts += 1;
            }
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(conflicts, WRITERS - 1);
    let winner = winners[0];
    let stored = get_one(&setup, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision),
        (json!({"writer": winner}), 2)
    );
    let entries = audit_all(&setup).await;
    assert_eq!(entries.len(), WRITERS + 1);
    let allowed: Vec<_> = entries
        .iter()
        .skip(1)
        .filter(|e| e.draft.verdict == Verdict::Allow)
        .collect();
    assert_eq!(allowed.len(), 1);
    assert_eq!(allowed[0].draft.details["tag"], json!(winner));
    let mut tags: Vec<u64> = entries
        .iter()
        .skip(1)
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..WRITERS as u64).collect::<Vec<_>>());
    // Each conflict was decided against the winner's committed revision, so
    // the winner's entry comes first in the chain.
    assert_eq!(
        entries[1].draft.verdict,
        Verdict::Allow,
        "a conflict was logged before the write it lost to"
    );
    assert!(
        entries[2..]
            .iter()
            .all(|e| e.draft.details["current"] == json!(2))
    );
    assert_chain(&setup).await;
}

/// Two store instances (two pools, as two servers) increment one counter
/// with compare-and-set retries, append notes and register agents at the
/// same time: no increment is lost, failures leave no entries, and the
/// entries of both form one chain that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_one_verifiable_chain() {
    let scratch = scratch_or_skip!();
    let a = scratch.store_with(4).await;
    let b = scratch.store_with(4).await;
    a.put_record(
        put("root", "ns", "counter", json!(0), Some(0)),
        Timestamp(1),
        warden_store::StorageQuota::default(),
        put_audit("root", "ns.counter", 0),
    )
    .await
    .unwrap();
    const TASKS: u64 = 3;
    const INCREMENTS: u64 = 10;
    let mut tasks = Vec::new();
    for (n, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        for t in 0..TASKS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut audited = 0u64;
                let name = format!("agent-{n}-{t}");
                store
                    .insert_agent(agent(&name, None), register(&name))
                    .await
                    .unwrap();
                audited += 1;
                let dup = store
                    .insert_agent(agent(&name, None), register("dup"))
                    .await;
                assert!(matches!(dup, Err(StoreError::Duplicate { .. })));
                for i in 0..INCREMENTS {
                    loop {
                        let current = get_one(&store, "root", "ns", "counter").await.unwrap();
                        let next = current.value.as_u64().unwrap() + 1;
                        let outcome = store
                            .put_record(
                                put("root", "ns", "counter", json!(next), Some(current.revision)),
                                Timestamp(2),
                                warden_store::StorageQuota::default(),
                                put_audit("root", "ns.counter", next),
                            )
                            .await
                            .unwrap();
                        audited += 1;
                        match outcome {
                            PutOutcome::Written { .. } => break,
                            PutOutcome::Conflict { .. } => continue,
                            other => panic!("{other:?}"),
                        }
                    }
                    store
                        .append_audit(vec![AuditDraft {
                            details: json!({"instance": n, "task": t, "i": i}),
                            ..draft(&name, "note", "ns.counter", Verdict::Allow, "ok")
                        }])
                        .await
                        .unwrap();
                    audited += 1;
                }
                audited
            }));
        }
    }
    let mut expected = 1;
    for t in tasks {
        expected += t.await.unwrap();
    }
    let total = 2 * TASKS * INCREMENTS;
    let counter = get_one(&a, "root", "ns", "counter").await.unwrap();
    assert_eq!((counter.value, counter.revision), (json!(total), total + 1));
    let entries = audit_all(&b).await;
    assert_eq!(entries.len() as u64, expected);
    assert!(entries.iter().all(|e| e.draft.resource != "dup"));
    // Every successful increment is in the log once, in counter order.
    let writes: Vec<u64> = entries
        .iter()
        .filter(|e| e.draft.operation == "memory.write" && e.draft.verdict == Verdict::Allow)
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    assert_eq!(writes, (0..=total).collect::<Vec<_>>());
    let head_a = assert_chain(&a).await;
    let head_b = assert_chain(&b).await;
    assert_eq!(head_a, head_b);
    assert_eq!(a.load_agents().await.unwrap().len(), 2 * TASKS as usize);
}

/// Concurrent appends from two instances: each append's entries stay
/// adjacent and each appender's appends keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_stay_whole_and_ordered() {
    let scratch = scratch_or_skip!();
    let stores = [scratch.store_with(4).await, scratch.store_with(4).await];
    const TASKS: u64 = 8;
    const APPENDS: u64 = 20;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store: PgStore = stores[(t % 2) as usize].clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..APPENDS {
                let d = |part: u64| AuditDraft {
                    details: json!({"task": t, "i": i, "part": part}),
                    ..draft(
                        &format!("agent-{t}"),
                        "memory.read",
                        "ns.k",
                        Verdict::Allow,
                        "ok",
                    )
                };
                store.append_audit(vec![d(0), d(1), d(2)]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let entries = audit_all(&stores[0]).await;
    assert_eq!(entries.len() as u64, TASKS * APPENDS * 3);
    let mut next = vec![0u64; TASKS as usize];
    for triple in entries.chunks(3) {
        let first = &triple[0].draft.details;
        for (part, e) in triple.iter().enumerate() {
            assert_eq!(
                e.draft.details["task"], first["task"],
                "an append was split"
            );
            assert_eq!(e.draft.details["i"], first["i"], "an append was split");
            assert_eq!(e.draft.details["part"], json!(part));
        }
        let t = first["task"].as_u64().unwrap() as usize;
        assert_eq!(
            first["i"].as_u64(),
            Some(next[t]),
            "task {t}'s appends out of order"
        );
        next[t] += 1;
    }
    assert_chain(&stores[1]).await;
}
