//! The request-rate quota of the policy bundle (`quotas:`).
//!
//! - `requests_per_second`: a token bucket per agent (burst = the rate),
//!   refilled from the server's clock; checked on every agent request.
//!
//! The storage quotas (`max_records`, `max_bytes`) and `max_runs_in_flight`
//! are the engine's: the store checks them inside the write's transaction,
//! so they hold for an embedding program and across servers sharing a
//! database.
//!
//! Every refusal is a 429 with the reason as the error code
//! (`quota_requests_per_second`, `quota_max_records`, `quota_max_bytes`,
//! `quota_max_runs_in_flight`) and a deny decision in the audit log.

use std::collections::HashMap;
use std::sync::Mutex;

use warden_core::ids::AgentId;

/// Reason: the request rate is over `requests_per_second`.
pub const QUOTA_REQUESTS_PER_SECOND: &str = "quota_requests_per_second";
/// Reason: too many runs in flight.
pub const QUOTA_MAX_RUNS_IN_FLIGHT: &str = "quota_max_runs_in_flight";

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ms: i64,
}

/// Quota bookkeeping shared by all requests.
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    buckets: Mutex<HashMap<AgentId, Bucket>>,
}

impl Quotas {
    /// Take one request from `agent`'s bucket; `Err(retry_after_ms)` when
    /// it is empty.
    pub(crate) fn take_request(&self, agent: &AgentId, rps: u32, now_ms: i64) -> Result<(), u64> {
        let rate = f64::from(rps.max(1));
        let Ok(mut map) = self.buckets.lock() else {
            return Ok(());
        };
        let bucket = match map.get_mut(agent) {
            Some(b) => b,
            None => map.entry(agent.clone()).or_insert(Bucket {
                tokens: rate,
                last_ms: now_ms,
            }),
        };
        let elapsed = (now_ms - bucket.last_ms).max(0) as f64;
        bucket.tokens = (bucket.tokens + elapsed * rate / 1000.0).min(rate);
        bucket.last_ms = bucket.last_ms.max(now_ms);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - bucket.tokens) * 1000.0 / rate).ceil() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_allows_a_burst_then_refills_at_the_rate() {
        let q = Quotas::default();
        let a = AgentId::parse("a").unwrap();
        assert!(q.take_request(&a, 2, 0).is_ok());
        assert!(q.take_request(&a, 2, 0).is_ok());
        assert_eq!(q.take_request(&a, 2, 0), Err(500));
        assert_eq!(q.take_request(&a, 2, 250), Err(250));
        assert!(q.take_request(&a, 2, 500).is_ok());
        assert!(q.take_request(&a, 2, 10_000).is_ok());
        assert!(q.take_request(&a, 2, 10_000).is_ok());
        assert!(q.take_request(&a, 2, 10_000).is_err());
    }
}
