//! PostgreSQL backend benchmarks: durable compare-and-set puts with their
//! audit append (1 and 8 concurrent clients) and `get_records` latency.
//!
//! Needs `WARDEN_TEST_DATABASE_URL`; without it the benchmarks are skipped.
//! Each run works in a fresh schema, dropped at the end:
//!
//! ```text
//! WARDEN_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo bench -p warden-postgres --bench postgres
//! ```
//!
//! Throughput is reported per put (criterion's `elem/s`); with 8 clients a
//! measured iteration is one put by whichever client, so `elem/s` is the
//! total rate across clients.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use serde_json::json;
use tokio::runtime::Runtime;
use warden_core::audit::AuditDraft;
use warden_core::decision::Verdict;
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::Put;
use warden_core::time::Timestamp;
use warden_postgres::{PgOptions, PgStore};
use warden_store::{PutAuditFn, PutOutcome, Store};

const ENV: &str = "WARDEN_TEST_DATABASE_URL";

fn audit(resource: String) -> PutAuditFn {
    Box::new(move |outcome: &PutOutcome| {
        let (verdict, reason) = match outcome {
            PutOutcome::Written { .. } => (Verdict::Allow, "owner_write"),
            _ => (Verdict::Deny, "revision_conflict"),
        };
        vec![AuditDraft {
            time: Timestamp(1),
            subject: "bench".into(),
            operation: "memory.write".into(),
            resource: resource.clone(),
            verdict,
            reason: reason.into(),
            policy_version: "bench-1".into(),
            details: serde_json::Value::Null,
        }]
    })
}

fn put(owner: &str, k: &str, value: u64, expected: Option<u64>) -> Put {
    Put {
        owner: AgentId::parse(owner).unwrap(),
        namespace: Namespace::parse("bench").unwrap(),
        key: Key::parse(k).unwrap(),
        value: json!({"n": value, "pad": "0123456789abcdef"}),
        expected_revision: expected,
        visibility: None,
        class: None,
    }
}

/// One client's compare-and-set loop on its own key: `n` puts, each
/// expecting the revision the previous one wrote.
async fn cas_puts(store: &PgStore, client: usize, revision: &mut u64, n: u64) {
    let k = format!("k{client}");
    for _ in 0..n {
        let outcome = store
            .put_record(
                put("bench", &k, *revision, Some(*revision)),
                Timestamp(1),
                warden_store::StorageQuota::default(),
                audit(format!("bench.{k}")),
            )
            .await
            .unwrap();
        match outcome {
            PutOutcome::Written { record, .. } => *revision = record.revision,
            other => panic!("{other:?}"),
        }
    }
}

fn bench_puts(c: &mut Criterion, rt: &Runtime, store: &PgStore) {
    let mut group = c.benchmark_group("put_cas_with_audit");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for clients in [1usize, 8] {
        // Each client's key starts at revision 1.
        let revisions: Vec<u64> = rt.block_on(async {
            let mut out = Vec::new();
            for i in 0..clients {
                let k = format!("k{i}");
                let r = store
                    .put_record(
                        put("bench", &k, 0, None),
                        Timestamp(1),
                        warden_store::StorageQuota::default(),
                        audit(k.clone()),
                    )
                    .await
                    .unwrap();
                match r {
                    PutOutcome::Written { record, .. } => out.push(record.revision),
                    other => panic!("{other:?}"),
                }
            }
            out
        });
        let revisions = Arc::new(std::sync::Mutex::new(revisions));
        group.bench_function(format!("{clients}_clients"), |b| {
            b.iter_custom(|iters| {
                let per_client = iters.div_ceil(clients as u64).max(1);
                let revisions = Arc::clone(&revisions);
                rt.block_on(async {
                    let start = Instant::now();
                    let mut tasks = Vec::new();
                    for client in 0..clients {
                        let store = store.clone();
                        let mut revision = revisions.lock().unwrap()[client];
                        let revisions = Arc::clone(&revisions);
                        tasks.push(tokio::spawn(async move {
                            cas_puts(&store, client, &mut revision, per_client).await;
                            revisions.lock().unwrap()[client] = revision;
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap();
                    }
                    // Time per put: total puts made, not `iters`.
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_client * clients as u64) as f64)
                })
            });
        });
    }
    group.finish();
}

fn bench_reads(c: &mut Criterion, rt: &Runtime, store: &PgStore) {
    // A lineage of 8 owners, 4 of which hold the key.
    let owners: Vec<AgentId> = (0..8)
        .map(|i| AgentId::parse(&format!("owner{i}")).unwrap())
        .collect();
    rt.block_on(async {
        for (i, o) in owners.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            store
                .put_record(
                    put(o.as_str(), "read", i as u64, None),
                    Timestamp(1),
                    warden_store::StorageQuota::default(),
                    audit("read".into()),
                )
                .await
                .unwrap();
        }
    });
    let mut group = c.benchmark_group("get_records");
    group.sample_size(30);
    for depth in [1usize, 8] {
        let lineage = owners[..depth].to_vec();
        group.bench_function(format!("lineage_{depth}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let got = store
                            .get_records(
                                Namespace::parse("bench").unwrap(),
                                Key::parse("read").unwrap(),
                                lineage.clone(),
                            )
                            .await
                            .unwrap();
                        std::hint::black_box(got);
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
}

fn main() {
    let Some(url) = std::env::var(ENV).ok().filter(|s| !s.is_empty()) else {
        eprintln!("skipped: {ENV} is not set");
        return;
    };
    let rt = Runtime::new().unwrap();
    let schema = format!("wbench_{}", std::process::id());
    let store = rt
        .block_on(PgStore::connect_with(
            &url,
            PgOptions {
                schema: Some(schema.clone()),
                pool_size: 8,
                ..PgOptions::default()
            },
        ))
        .unwrap();
    let mut c = Criterion::default().configure_from_args();
    bench_puts(&mut c, &rt, &store);
    bench_reads(&mut c, &rt, &store);
    c.final_summary();
    drop(store);
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .unwrap();
    });
}
