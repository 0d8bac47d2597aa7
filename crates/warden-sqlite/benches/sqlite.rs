//! SQLite backend benchmarks.
//!
//! - `put_cas/*`: durable compare-and-set puts, each with its audit entry,
//!   acknowledged after COMMIT (`synchronous=FULL` unless the name says
//!   `normal`), from 1, 8 and 64 concurrent writers. Throughput is puts/s.
//! - `audit_verify/N`: streaming verification of an N-entry chain from the
//!   file (entries/s).
//! - `get_records/*`: one lineage read (latency).
//!
//! Run briefly with
//! `cargo bench -p warden-sqlite --bench sqlite -- --warm-up-time 1 --measurement-time 3`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use warden_core::audit::AuditDraft;
use warden_core::decision::Verdict;
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::Put;
use warden_core::time::Timestamp;
use warden_sqlite::{SqliteOptions, SqliteStore, Synchronous, verify_audit_path};
use warden_store::conformance::{draft, put_audit};
use warden_store::{PutOutcome, Store};

const KEYS_PER_WRITER: usize = 64;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn put(owner: &str, key: &str, value: serde_json::Value, expected: Option<u64>) -> Put {
    Put {
        owner: AgentId::parse(owner).unwrap(),
        namespace: Namespace::parse("bench").unwrap(),
        key: Key::parse(key).unwrap(),
        value,
        expected_revision: expected,
        visibility: None,
        class: None,
    }
}

/// One writer's keys and the revisions it last saw.
struct Writer {
    owner: String,
    keys: Vec<(String, u64)>,
    next: usize,
}

impl Writer {
    async fn new(store: &SqliteStore, w: usize) -> Self {
        let owner = format!("writer-{w}");
        let mut keys = Vec::new();
        for k in 0..KEYS_PER_WRITER {
            let key = format!("k{k}");
            store
                .put_record(
                    put(&owner, &key, json!(0), Some(0)),
                    Timestamp(0),
                    warden_store::StorageQuota::default(),
                    put_audit(&owner, &key, 0),
                )
                .await
                .unwrap();
            keys.push((key, 1));
        }
        Self {
            owner,
            keys,
            next: 0,
        }
    }

    /// One compare-and-set put at the revision last seen.
    async fn step(&mut self, store: &SqliteStore) {
        let at = self.next % self.keys.len();
        self.next += 1;
        let (key, revision) = &mut self.keys[at];
        let outcome = store
            .put_record(
                put(
                    &self.owner,
                    key,
                    json!({"n": *revision, "text": "a value of some size"}),
                    Some(*revision),
                ),
                Timestamp(*revision as i64),
                warden_store::StorageQuota::default(),
                put_audit(&self.owner, key, *revision),
            )
            .await
            .unwrap();
        match outcome {
            PutOutcome::Written { record, .. } => *revision = record.revision,
            other => panic!("{other:?}"),
        }
    }
}

async fn open(sync: Synchronous) -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = SqliteOptions::new(dir.path().join("bench.db"));
    options.synchronous = sync;
    (dir, SqliteStore::open_with(options).await.unwrap())
}

fn put_cas(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("put_cas");
    group.throughput(Throughput::Elements(1));
    for (name, sync) in [("full", Synchronous::Full), ("normal", Synchronous::Normal)] {
        let (_dir, store) = rt.block_on(open(sync));
        let mut writer = rt.block_on(Writer::new(&store, 0));
        group.bench_function(BenchmarkId::new("1_writer", name), |b| {
            b.iter(|| rt.block_on(writer.step(&store)))
        });
    }
    for writers in [8usize, 64] {
        let (_dir, store) = rt.block_on(open(Synchronous::Full));
        let store = Arc::new(store);
        let pool: Vec<Writer> = rt.block_on(async {
            let mut v = Vec::new();
            for w in 0..writers {
                v.push(Writer::new(&store, w).await);
            }
            v
        });
        let pool = Arc::new(tokio::sync::Mutex::new(pool));
        group.bench_function(
            BenchmarkId::new(format!("{writers}_writers"), "full"),
            |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let mut taken = std::mem::take(&mut *pool.lock().await);
                        let per = iters.div_ceil(writers as u64);
                        let start = Instant::now();
                        let tasks: Vec<_> = taken
                            .drain(..)
                            .map(|mut w| {
                                let store = Arc::clone(&store);
                                tokio::spawn(async move {
                                    for _ in 0..per {
                                        w.step(&store).await;
                                    }
                                    w
                                })
                            })
                            .collect();
                        let mut back = Vec::with_capacity(writers);
                        for t in tasks {
                            back.push(t.await.unwrap());
                        }
                        let elapsed = start.elapsed();
                        *pool.lock().await = back;
                        // Normalise to the iterations asked for.
                        elapsed.mul_f64(iters as f64 / (per * writers as u64) as f64)
                    })
                })
            },
        );
    }
    group.finish();
}

async fn build_chain(n: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, store) = open(Synchronous::Normal).await;
    let mut i = 0;
    while i < n {
        let batch: Vec<AuditDraft> = (i..(i + 10_000).min(n))
            .map(|j| AuditDraft {
                time: Timestamp(1_700_000_000_000 + j as i64),
                details: json!({"step": j, "obligations": ["label:pii"]}),
                ..draft(
                    "researcher",
                    "memory.read",
                    "project.client_region",
                    Verdict::Allow,
                    "visible_from:report_manager",
                )
            })
            .collect();
        i += batch.len() as u64;
        store.append_audit(batch).await.unwrap();
    }
    let path = store.path().to_path_buf();
    drop(store);
    (dir, path)
}

fn audit_verify(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("audit_verify");
    group.sample_size(10);
    for n in [100_000u64, 1_000_000] {
        // Built on first use, so a filtered run skips the big one.
        let mut built: Option<(tempfile::TempDir, std::path::PathBuf)> = None;
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            let (_, path) = built.get_or_insert_with(|| rt.block_on(build_chain(n)));
            b.iter(|| {
                let report = verify_audit_path(path, None).unwrap();
                assert_eq!(report.verified.count, n);
                black_box(report)
            })
        });
    }
    group.finish();
}

fn get_records(c: &mut Criterion) {
    let rt = runtime();
    let (_dir, store) = rt.block_on(open(Synchronous::Full));
    rt.block_on(async {
        // 1000 owners with records at other keys, and the key read here at
        // the root of a depth-3 and a depth-16 lineage.
        for o in 0..1000 {
            let owner = format!("agent-{o}");
            store
                .put_record(
                    put(&owner, "other", json!(o), None),
                    Timestamp(0),
                    warden_store::StorageQuota::default(),
                    put_audit(&owner, "x", 0),
                )
                .await
                .unwrap();
        }
        store
            .put_record(
                put("agent-0", "region", json!("EU"), None),
                Timestamp(0),
                warden_store::StorageQuota::default(),
                put_audit("agent-0", "x", 0),
            )
            .await
            .unwrap();
    });
    let lineage = |depth: usize| -> Vec<AgentId> {
        (0..depth)
            .rev()
            .map(|o| AgentId::parse(&format!("agent-{o}")).unwrap())
            .collect()
    };
    let mut group = c.benchmark_group("get_records");
    for depth in [3usize, 16] {
        let owners = lineage(depth);
        group.bench_function(BenchmarkId::new("lineage", depth), |b| {
            b.iter(|| {
                let got = rt
                    .block_on(store.get_records(
                        Namespace::parse("bench").unwrap(),
                        Key::parse("region").unwrap(),
                        owners.clone(),
                    ))
                    .unwrap();
                assert_eq!(got.len(), 1);
                black_box(got)
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = put_cas, audit_verify, get_records
}
criterion_main!(benches);
