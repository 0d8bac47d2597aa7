//! Request-rate buckets in SQL (`take_request_tokens`, schema version 8)
//! held to the shared Rust rule (`warden_store::rates::take_tokens`):
//! random sequences of charges, rates, bursts and clocks (forward, still
//! and backward) give the same outcome at every step and the same stored
//! states; and stores of two "servers" charging concurrently take exactly
//! one bucket's burst.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use warden_core::time::Timestamp;
use warden_store::rates::{BucketState, take_tokens};
use warden_store::{RateCharge, Store, TakeTokens};

use crate::support::Scratch;

/// One request: which of the case's buckets it is charged to (distinct, in
/// any order) and how far the clock moved before it.
#[derive(Debug, Clone)]
struct Request {
    buckets: Vec<usize>,
    dt: i64,
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    let one = (
        prop::sample::subsequence((0..5).collect::<Vec<usize>>(), 1..=3).prop_shuffle(),
        prop_oneof![Just(0i64), -400i64..0, 0i64..1_500],
    )
        .prop_map(|(buckets, dt)| Request { buckets, dt });
    prop::collection::vec(one, 1..40)
}

fn limits() -> impl Strategy<Value = Vec<(u32, u32)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u32), 1u32..5, 5u32..2_000, Just(u32::MAX)],
            prop_oneof![Just(0u32), 1u32..10, Just(u32::MAX)],
        ),
        5,
    )
}

#[test]
fn sql_buckets_follow_the_shared_rule() {
    let Some(url) = crate::support::database_url() else {
        eprintln!("skipped: WARDEN_TEST_DATABASE_URL is not set");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (scratch, store, client) = rt.block_on(async {
        let scratch = Scratch::new(url).await;
        let store = scratch.store().await;
        let client = scratch.client().await;
        (scratch, store, client)
    });
    static CASE: AtomicU64 = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    proptest!(config, |(limits in limits(), requests in requests())| {
        // Each case has buckets of its own.
        let case = CASE.fetch_add(1, Ordering::Relaxed);
        let charge = |i: usize| RateCharge {
            bucket: format!("c{case}:b{i}"),
            rate: limits[i].0,
            burst: limits[i].1,
        };
        let mut model: HashMap<String, BucketState> = HashMap::new();
        let mut now: i64 = 1_700_000_000_000;
        for (step, r) in requests.iter().enumerate() {
            now += r.dt;
            let charges: Vec<RateCharge> = r.buckets.iter().map(|&i| charge(i)).collect();
            let found: Vec<Option<BucketState>> =
                charges.iter().map(|c| model.get(&c.bucket).copied()).collect();
            let (states, expected) = take_tokens(&found, &charges, now);
            for (c, s) in charges.iter().zip(states) {
                model.insert(c.bucket.clone(), s);
            }
            let got = rt
                .block_on(store.take_request_tokens(charges.clone(), Timestamp(now)))
                .unwrap();
            prop_assert_eq!(got, expected, "step {} at {}: {:?}", step, now, charges);
        }
        let rows = rt
            .block_on(client.query(
                "SELECT bucket, milli_tokens, updated_ms FROM request_buckets WHERE bucket LIKE $1",
                &[&format!("c{case}:%")],
            ))
            .unwrap();
        let stored: HashMap<String, BucketState> = rows
            .iter()
            .map(|row| {
                (
                    row.get::<_, String>(0),
                    BucketState {
                        milli_tokens: row.get(1),
                        updated_ms: row.get(2),
                    },
                )
            })
            .collect();
        prop_assert_eq!(stored, model);
    });
    rt.block_on(async move {
        drop(client);
        drop(store);
        drop(scratch);
    });
}

/// Two stores on one schema ("two servers") charging one bucket
/// concurrently take its burst exactly, not once per server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_take_one_bucket_burst_in_all() {
    let scratch = scratch_or_skip!();
    let servers = [
        Arc::new(scratch.store().await),
        Arc::new(scratch.store().await),
    ];
    let mut tasks = Vec::new();
    for i in 0..64 {
        let store = Arc::clone(&servers[i % 2]);
        tasks.push(tokio::spawn(async move {
            let charges = vec![
                RateCharge {
                    bucket: format!("agent:c{i}"),
                    rate: 1_000,
                    burst: 1_000,
                },
                RateCharge {
                    bucket: "tree:parent".to_owned(),
                    rate: 1,
                    burst: 7,
                },
            ];
            store
                .take_request_tokens(charges, Timestamp(1_000))
                .await
                .unwrap()
        }));
    }
    let mut taken = 0;
    for t in tasks {
        match t.await.unwrap() {
            TakeTokens::Taken => taken += 1,
            TakeTokens::Refused { index: 1, .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(taken, 7);
}
