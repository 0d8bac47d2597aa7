//! Request-rate token buckets: the one arithmetic every backend applies
//! ([`take_tokens`]), the charges of one request ([`RateCharge`]), and
//! [`RateBuckets`], the in-process table the in-memory and SQLite stores
//! keep.
//!
//! A bucket holds up to `burst` tokens and refills at `rate` tokens a
//! second. Its state is an integer count of **milli-tokens** and the time
//! (ms) it was last charged, so the arithmetic is exact and the same in
//! Rust and in SQL (PostgreSQL's `take_request_tokens` function, schema
//! version 8, computes it in `BIGINT` step for step; a property test holds
//! the two together):
//!
//! - a bucket not seen before is full (`burst * 1000`, stamped `now`);
//! - refill: `elapsed = max(now - stamp, 0)`, capped at the time the bucket
//!   needs to fill (`ceil((cap - tokens) / rate)`, so nothing overflows);
//!   `tokens = min(tokens + elapsed * rate, cap)`; `stamp = max(stamp, now)`
//!   (a clock behind the stamp refills nothing and never moves it back);
//! - a request is taken when every bucket it is charged to holds at least
//!   one token (1000 milli-tokens), and then takes one from each; otherwise
//!   none is charged, and the refusal names the empty bucket with the
//!   longest wait (the first of equal waits), `ceil((1000 - tokens) / rate)`
//!   milliseconds. Either way every bucket keeps its refilled state.
//!
//! A rate or burst of 0 counts as 1.

use std::collections::HashMap;
use std::sync::Mutex;

use warden_core::time::Timestamp;

use crate::{Entity, StoreError};

/// Milli-tokens in one token (one request).
pub const MILLI_TOKENS: i64 = 1_000;

/// One bucket a request is charged to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateCharge {
    /// The bucket's key (the engine's: `agent:ID` or `tree:ID`), at most
    /// [`MAX_BUCKET_KEY_BYTES`] bytes.
    pub bucket: String,
    /// Tokens added per second.
    pub rate: u32,
    /// Most tokens the bucket holds (the burst a full bucket allows).
    pub burst: u32,
}

/// Longest bucket key, in bytes.
pub const MAX_BUCKET_KEY_BYTES: usize = 300;

/// A bucket's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Tokens held, in milli-tokens.
    pub milli_tokens: i64,
    /// When it was last charged (ms since the epoch).
    pub updated_ms: i64,
}

/// What [`Store::take_request_tokens`](crate::Store::take_request_tokens)
/// decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeTokens {
    /// One token was taken from every bucket.
    Taken,
    /// Nothing was taken: the bucket at `index` of the charges is empty.
    Refused {
        /// Index of the refusing bucket in the charges.
        index: usize,
        /// Milliseconds until it holds a token again.
        retry_after_ms: u64,
    },
}

fn rate_of(charge: &RateCharge) -> i64 {
    i64::from(charge.rate.max(1))
}

fn cap_of(charge: &RateCharge) -> i64 {
    i64::from(charge.burst.max(1)) * MILLI_TOKENS
}

/// The bucket `found` (`None`: never charged) refilled for `charge` at
/// `now_ms`.
pub fn refill(found: Option<BucketState>, charge: &RateCharge, now_ms: i64) -> BucketState {
    let (rate, cap) = (rate_of(charge), cap_of(charge));
    let Some(b) = found else {
        return BucketState {
            milli_tokens: cap,
            updated_ms: now_ms,
        };
    };
    let mut tokens = b.milli_tokens;
    if tokens < cap {
        let needed = (cap - tokens + rate - 1) / rate;
        let elapsed = now_ms.saturating_sub(b.updated_ms).max(0).min(needed);
        tokens = (tokens + elapsed * rate).min(cap);
    }
    BucketState {
        milli_tokens: tokens.min(cap),
        updated_ms: b.updated_ms.max(now_ms),
    }
}

/// Charge one request to `charges` whose stored states are `found` (one per
/// charge, in order) at `now_ms`: the states to store (one per charge) and
/// the outcome. See the [module docs](self) for the rule.
pub fn take_tokens(
    found: &[Option<BucketState>],
    charges: &[RateCharge],
    now_ms: i64,
) -> (Vec<BucketState>, TakeTokens) {
    let mut states = Vec::with_capacity(charges.len());
    let mut refused: Option<(usize, u64)> = None;
    for (i, charge) in charges.iter().enumerate() {
        let state = refill(found.get(i).copied().flatten(), charge, now_ms);
        if state.milli_tokens < MILLI_TOKENS {
            let rate = rate_of(charge);
            let wait = (MILLI_TOKENS - state.milli_tokens + rate - 1) / rate;
            let wait = u64::try_from(wait).unwrap_or(0);
            if refused.is_none_or(|(_, w)| wait > w) {
                refused = Some((i, wait));
            }
        }
        states.push(state);
    }
    let outcome = match refused {
        None => {
            for s in &mut states {
                s.milli_tokens -= MILLI_TOKENS;
            }
            TakeTokens::Taken
        }
        Some((index, retry_after_ms)) => TakeTokens::Refused {
            index,
            retry_after_ms,
        },
    };
    (states, outcome)
}

/// Charges a store accepts: at least one, keys non-empty, at most
/// [`MAX_BUCKET_KEY_BYTES`] and distinct. Otherwise
/// [`StoreError::Invalid`], and nothing is charged.
pub fn check_charges(charges: &[RateCharge]) -> Result<(), StoreError> {
    if charges.is_empty() {
        return Err(StoreError::invalid(
            Entity::RateBucket,
            "",
            "a request is charged to no bucket",
        ));
    }
    for (i, c) in charges.iter().enumerate() {
        if c.bucket.is_empty() || c.bucket.len() > MAX_BUCKET_KEY_BYTES {
            return Err(StoreError::invalid(
                Entity::RateBucket,
                &c.bucket,
                format!(
                    "a bucket key of {} bytes (1 to {MAX_BUCKET_KEY_BYTES})",
                    c.bucket.len()
                ),
            ));
        }
        if charges.iter().take(i).any(|d| d.bucket == c.bucket) {
            return Err(StoreError::invalid(
                Entity::RateBucket,
                &c.bucket,
                "charged twice in one request",
            ));
        }
    }
    Ok(())
}

/// Buckets kept in this process's memory, charged under one lock: what the
/// in-memory store keeps, and SQLite's (one writing process per file, so
/// the process is the whole deployment; a restart refills every bucket).
#[derive(Debug, Default)]
pub struct RateBuckets {
    buckets: Mutex<HashMap<String, BucketState>>,
}

impl RateBuckets {
    /// [`take_tokens`] over this table, atomically.
    pub fn take(&self, charges: &[RateCharge], now: Timestamp) -> Result<TakeTokens, StoreError> {
        check_charges(charges)?;
        let mut map = self
            .buckets
            .lock()
            .map_err(|_| StoreError::backend("request bucket lock poisoned"))?;
        let found: Vec<Option<BucketState>> = charges
            .iter()
            .map(|c| map.get(&c.bucket).copied())
            .collect();
        let (states, outcome) = take_tokens(&found, charges, now.0);
        for (charge, state) in charges.iter().zip(states) {
            map.insert(charge.bucket.clone(), state);
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(bucket: &str, rate: u32) -> RateCharge {
        RateCharge {
            bucket: bucket.into(),
            rate,
            burst: rate,
        }
    }

    fn take(b: &RateBuckets, c: &[RateCharge], t: i64) -> TakeTokens {
        b.take(c, Timestamp(t)).unwrap()
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refills_at_its_rate() {
        let b = RateBuckets::default();
        let c = [charge("a", 2)];
        assert_eq!(take(&b, &c, 0), TakeTokens::Taken);
        assert_eq!(take(&b, &c, 0), TakeTokens::Taken);
        let refused = |wait| TakeTokens::Refused {
            index: 0,
            retry_after_ms: wait,
        };
        assert_eq!(take(&b, &c, 0), refused(500));
        assert_eq!(take(&b, &c, 250), refused(250));
        assert_eq!(take(&b, &c, 500), TakeTokens::Taken);
        assert_eq!(take(&b, &c, 10_000), TakeTokens::Taken);
        assert_eq!(take(&b, &c, 10_000), TakeTokens::Taken);
        assert_eq!(take(&b, &c, 10_000), refused(500));
        // A clock that went back refills nothing and moves nothing back.
        assert_eq!(take(&b, &c, 9_000), refused(500));
    }

    #[test]
    fn a_request_takes_from_every_bucket_or_from_none() {
        let b = RateBuckets::default();
        let for_c1 = [charge("agent:c1", 2), charge("tree:p", 3)];
        let for_c2 = [charge("agent:c2", 2), charge("tree:p", 3)];
        assert_eq!(take(&b, &for_c1, 0), TakeTokens::Taken);
        assert_eq!(take(&b, &for_c1, 0), TakeTokens::Taken);
        assert!(matches!(
            take(&b, &for_c1, 0),
            TakeTokens::Refused { index: 0, .. }
        ));
        assert_eq!(take(&b, &for_c2, 0), TakeTokens::Taken);
        assert_eq!(
            take(&b, &for_c2, 0),
            TakeTokens::Refused {
                index: 1,
                retry_after_ms: 334
            }
        );
    }

    #[test]
    fn huge_rates_and_gaps_do_not_overflow() {
        let c = RateCharge {
            bucket: "x".into(),
            rate: u32::MAX,
            burst: u32::MAX,
        };
        let empty = BucketState {
            milli_tokens: 0,
            updated_ms: i64::MIN,
        };
        let full = refill(Some(empty), &c, i64::MAX);
        assert_eq!(full.milli_tokens, i64::from(u32::MAX) * MILLI_TOKENS);
        assert_eq!(full.updated_ms, i64::MAX);
    }

    #[test]
    fn bad_charges_are_refused_and_charge_nothing() {
        let b = RateBuckets::default();
        assert!(matches!(
            b.take(&[], Timestamp(0)),
            Err(StoreError::Invalid { .. })
        ));
        let twice = [charge("a", 1), charge("a", 1)];
        assert!(matches!(
            b.take(&twice, Timestamp(0)),
            Err(StoreError::Invalid { .. })
        ));
        assert_eq!(take(&b, &[charge("a", 1)], 0), TakeTokens::Taken);
    }
}
