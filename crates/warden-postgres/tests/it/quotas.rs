//! Quotas across servers: two store instances on one database (two
//! `warden serve` processes) share the limits exactly, because usage is
//! read in the write's transaction under a per-owner advisory lock.

use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;
use warden_core::audit::Digest;
use warden_core::ids::{RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{
    CreateRun, PutOutcome, QuotaKind, RunRecord, RunStep, RunsInFlight, StorageQuota, Store,
    audit_if_created,
};

use crate::support::*;

const WRITERS: usize = 16;

/// 16 creates by one owner, alternating between two servers, under
/// `max_records = 5`: exactly 5 are stored, the rest are `OverQuota`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn record_quota_is_exact_across_two_servers() {
    const MAX: u64 = 5;
    let scratch = scratch_or_skip!();
    let servers = [
        Arc::new(scratch.store_with(4).await),
        Arc::new(scratch.store_with(4).await),
    ];
    let quota = StorageQuota {
        max_records: Some(MAX),
        max_bytes: None,
    };
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let store = Arc::clone(&servers[i % 2]);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .put_record(
                    put("o", "ns", &format!("k{i}"), json!(i), None),
                    Timestamp(1),
                    quota,
                    put_audit("o", "ns", i as u64),
                )
                .await
                .unwrap()
        }));
    }
    let mut written = 0;
    for t in tasks {
        match t.await.unwrap() {
            PutOutcome::Written { .. } => written += 1,
            PutOutcome::OverQuota {
                quota: QuotaKind::Records,
                limit: MAX,
                used: MAX,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(written, MAX);
    assert_eq!(servers[1].owner_usage(id("o")).await.unwrap().records, MAX);
    assert_eq!(head_count(&servers[0]).await, WRITERS as u64);
    assert_chain(&servers[1]).await;
}

/// 16 runs of one agent, alternating between two servers, under a limit of
/// 3 in flight: exactly 3 are created.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_in_flight_are_exact_across_two_servers() {
    const MAX: u32 = 3;
    let scratch = scratch_or_skip!();
    let servers = [
        Arc::new(scratch.store_with(4).await),
        Arc::new(scratch.store_with(4).await),
    ];
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let store = Arc::clone(&servers[i % 2]);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let name = format!("run-{i}");
            let run = RunRecord {
                run_id: RunId::parse(&name).unwrap(),
                agent: id("a"),
                sop_hash: Digest::of(name.as_bytes()),
                sop: json!({}),
                steps: vec![RunStep {
                    step_id: StepId::parse("s1").unwrap(),
                    action: action("artifact.save"),
                    operation_id: format!("{name}:s1"),
                }],
                policy_version: "p".into(),
                created_at: Timestamp(10),
                envelope_id: None,
            };
            let limit = Some(RunsInFlight {
                max: MAX,
                since: Timestamp(0),
            });
            barrier.wait().await;
            store
                .create_run(run, limit, audit_if_created(vec![numbered(i as u64)]))
                .await
                .unwrap()
        }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            CreateRun::Created => created += 1,
            CreateRun::OverQuota {
                limit: MAX,
                in_flight: MAX,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(created, MAX);
    assert_eq!(head_count(&servers[0]).await, u64::from(MAX));
    assert_chain(&servers[1]).await;
}
