//! Request-rate buckets and envelope signing keys: state servers sharing a
//! store share.

use std::collections::HashMap;

use super::*;
use crate::rates::{BucketState, take_tokens};
use crate::{RateCharge, SigningKeyRecord, TakeTokens};

fn charge(bucket: &str, rate: u32, burst: u32) -> RateCharge {
    RateCharge {
        bucket: bucket.to_string(),
        rate,
        burst,
    }
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }
}

/// Drive `store` with `steps` pseudo-random requests (seeded by `seed`)
/// over a few buckets of different rates and bursts, with a clock that
/// mostly moves forward, sometimes stands still and sometimes goes back,
/// and check every outcome against [`take_tokens`] over a plain map.
pub async fn rates_follow_shared_rule_seeded<S: Store>(store: &S, seed: u64, steps: usize) {
    let buckets = [
        charge("agent:a", 2, 2),
        charge("agent:b", 5, 1),
        charge("tree:p", 3, 6),
        charge("tree:q", 1000, 3),
        charge("agent:c", 0, 0),
    ];
    let mut rng = Xorshift(seed | 1);
    let mut model: HashMap<String, BucketState> = HashMap::new();
    let mut now: i64 = 1_700_000_000_000;
    for step in 0..steps {
        now += match rng.next(10) {
            0..=2 => 0,
            3 => -(rng.next(400) as i64),
            _ => rng.next(900) as i64,
        };
        let n = 1 + rng.next(3) as usize;
        let first = rng.next(buckets.len() as u64) as usize;
        let charges: Vec<RateCharge> = (0..n)
            .map(|k| buckets[(first + k * 2) % buckets.len()].clone())
            .collect();
        let found: Vec<Option<BucketState>> = charges
            .iter()
            .map(|c| model.get(&c.bucket).copied())
            .collect();
        let (states, expected) = take_tokens(&found, &charges, now);
        for (c, s) in charges.iter().zip(states) {
            model.insert(c.bucket.clone(), s);
        }
        let got = store
            .take_request_tokens(charges.clone(), Timestamp(now))
            .await
            .unwrap();
        assert_eq!(got, expected, "step {step} at {now}: {charges:?}");
    }
}

/// The store's buckets follow [`take_tokens`] step for step.
pub async fn rates_follow_shared_rule<S: Store>(store: S) {
    rates_follow_shared_rule_seeded(&store, 0x5eed, 400).await;
    // Nothing is recorded.
    assert_eq!(head_count(&store).await, 0);
}

/// A request takes from every bucket or from none, and the refusal names
/// the bucket and its wait.
pub async fn rates_all_or_none<S: Store>(store: S) {
    let t = Timestamp(10_000);
    let for_c1 = vec![charge("agent:c1", 2, 2), charge("tree:p", 3, 3)];
    let for_c2 = vec![charge("agent:c2", 2, 2), charge("tree:p", 3, 3)];
    for _ in 0..2 {
        let got = store.take_request_tokens(for_c1.clone(), t).await.unwrap();
        assert_eq!(got, TakeTokens::Taken);
    }
    let got = store.take_request_tokens(for_c1.clone(), t).await.unwrap();
    assert_eq!(
        got,
        TakeTokens::Refused {
            index: 0,
            retry_after_ms: 500
        }
    );
    // c1's refusal took nothing from p's tree: c2 gets its last token.
    let got = store.take_request_tokens(for_c2.clone(), t).await.unwrap();
    assert_eq!(got, TakeTokens::Taken);
    let got = store.take_request_tokens(for_c2, t).await.unwrap();
    assert_eq!(
        got,
        TakeTokens::Refused {
            index: 1,
            retry_after_ms: 334
        }
    );
}

/// Concurrent requests on one bucket take exactly its burst.
pub async fn rates_concurrent_takers_exact<S: Store>(store: S) {
    const BURST: u32 = 5;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            // Each request also charges a bucket of its own, so requests
            // lock different sets of rows.
            let charges = vec![
                charge(&format!("agent:c{i}"), 100, 100),
                charge("tree:shared", 1, BURST),
            ];
            store.take_request_tokens(charges, Timestamp(0)).await
        }));
    }
    let mut taken = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            TakeTokens::Taken => taken += 1,
            TakeTokens::Refused {
                index: 1,
                retry_after_ms: 1000,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(taken, BURST);
}

/// Empty charges and a bucket charged twice are refused and charge nothing.
pub async fn rates_refuse_bad_charges<S: Store>(store: S) {
    let t = Timestamp(0);
    let err = store.take_request_tokens(Vec::new(), t).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    let twice = vec![charge("agent:x", 1, 1), charge("agent:x", 1, 1)];
    let err = store.take_request_tokens(twice, t).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    let long = vec![charge(&"k".repeat(301), 1, 1)];
    let err = store.take_request_tokens(long, t).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    // Nothing was charged: the bucket still holds its one token.
    let one = vec![charge("agent:x", 1, 1)];
    assert_eq!(
        store.take_request_tokens(one.clone(), t).await.unwrap(),
        TakeTokens::Taken
    );
    assert!(matches!(
        store.take_request_tokens(one, t).await.unwrap(),
        TakeTokens::Refused { .. }
    ));
}

fn key(generation: u64, fill: u8) -> SigningKeyRecord {
    SigningKeyRecord {
        generation,
        seed: [fill; 32],
        public_key: [fill.wrapping_add(1); 32],
        created_at: Timestamp(1_000 + generation as i64),
    }
}

fn key_audit(tag: &str) -> Vec<AuditDraft> {
    vec![draft(
        "operator",
        "envelope_key.create",
        tag,
        Verdict::Allow,
        "created",
    )]
}

/// Signing keys: create-only per generation, listed by generation, every
/// field round-trips; a taken generation stores and appends nothing.
pub async fn signing_keys_create_only<S: Store>(store: S) {
    assert!(store.signing_keys().await.unwrap().is_empty());
    assert!(
        store
            .insert_signing_key(key(1, 7), key_audit("g1"))
            .await
            .unwrap()
    );
    assert_eq!(head_count(&store).await, 1);
    // Another key at generation 1 loses and changes nothing.
    assert!(
        !store
            .insert_signing_key(key(1, 9), key_audit("lost"))
            .await
            .unwrap()
    );
    assert_eq!(head_count(&store).await, 1);
    assert!(
        store
            .insert_signing_key(key(3, 3), key_audit("g3"))
            .await
            .unwrap()
    );
    assert!(
        store
            .insert_signing_key(key(2, 2), key_audit("g2"))
            .await
            .unwrap()
    );
    assert_eq!(
        store.signing_keys().await.unwrap(),
        vec![key(1, 7), key(2, 2), key(3, 3)]
    );
    // Generation 0 is refused and changes nothing.
    let err = store
        .insert_signing_key(key(0, 5), key_audit("zero"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert_eq!(store.signing_keys().await.unwrap().len(), 3);
    assert_eq!(head_count(&store).await, 3);
    assert_chain(&store).await;
    // The seed never shows in `Debug`.
    let debug = format!("{:?}", key(1, 0xab));
    assert!(!debug.contains("abab"), "{debug}");
}

/// Servers starting together: of concurrent creates of generation 1
/// exactly one is stored, and every creator then reads that one.
pub async fn signing_keys_race<S: Store>(store: S) {
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let k = key(1, 10 + i as u8);
            let won = store
                .insert_signing_key(k.clone(), key_audit(&format!("w{i}")))
                .await
                .unwrap();
            (won, k)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (won, k) = t.await.unwrap();
        if won {
            winners.push(k);
        }
    }
    assert_eq!(winners.len(), 1);
    assert_eq!(store.signing_keys().await.unwrap(), winners);
    assert_eq!(head_count(&*store).await, 1);
}
