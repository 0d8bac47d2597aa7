//! Per-agent quotas from the policy bundle (`quotas:`).
//!
//! - `requests_per_second`: decided by the engine on every agent request
//!   (`warden::Engine::authenticate`: a token bucket per agent, burst = the
//!   rate, refilled from the engine's clock, kept per process).
//! - `max_records` / `max_bytes`: checked before a write that creates a
//!   record or makes one larger, against the store's `owner_usage`. Such
//!   writes of one agent are serialised (per-agent lock) so two concurrent
//!   writes cannot both slip under the limit within one process.
//! - `max_runs_in_flight`: runs admitted and not yet finished (every step
//!   recorded, or one failed or denied). Counted by this process; a run
//!   abandoned half-way stops counting after `ServerConfig::run_ttl`, and
//!   counts start from zero after a restart.
//!
//! Every refusal is a 429 with the reason as the error code
//! (`quota_requests_per_second`, `quota_max_records`, `quota_max_bytes`,
//! `quota_max_runs_in_flight`) and a deny decision in the audit log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use warden_core::ids::{AgentId, RunId};

/// Reason: the request rate is over `requests_per_second`.
pub const QUOTA_REQUESTS_PER_SECOND: &str = "quota_requests_per_second";
/// Reason: the write would exceed `max_records`.
pub const QUOTA_MAX_RECORDS: &str = "quota_max_records";
/// Reason: the write would exceed `max_bytes`.
pub const QUOTA_MAX_BYTES: &str = "quota_max_bytes";
/// Reason: too many runs in flight.
pub const QUOTA_MAX_RUNS_IN_FLIGHT: &str = "quota_max_runs_in_flight";

#[derive(Debug, Default)]
struct Runs {
    /// agent -> run -> admitted at (ms).
    in_flight: HashMap<AgentId, HashMap<RunId, i64>>,
}

/// Quota bookkeeping shared by all requests.
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    writers: Mutex<HashMap<AgentId, Arc<tokio::sync::Mutex<()>>>>,
    runs: Mutex<Runs>,
}

impl Quotas {
    /// The lock serialising `agent`'s quota-checked writes and admissions.
    pub(crate) fn writer(&self, agent: &AgentId) -> Arc<tokio::sync::Mutex<()>> {
        match self.writers.lock() {
            Ok(mut map) => Arc::clone(map.entry(agent.clone()).or_default()),
            Err(_) => Arc::default(),
        }
    }

    /// How many of `agent`'s runs are in flight (dropping expired ones).
    pub(crate) fn runs_in_flight(&self, agent: &AgentId, now_ms: i64, ttl_ms: i64) -> usize {
        let Ok(mut runs) = self.runs.lock() else {
            return 0;
        };
        match runs.in_flight.get_mut(agent) {
            Some(set) => {
                set.retain(|_, at| now_ms.saturating_sub(*at) < ttl_ms);
                set.len()
            }
            None => 0,
        }
    }

    /// A run was admitted.
    pub(crate) fn run_admitted(&self, agent: &AgentId, run: &RunId, now_ms: i64) {
        if let Ok(mut runs) = self.runs.lock() {
            runs.in_flight
                .entry(agent.clone())
                .or_default()
                .insert(run.clone(), now_ms);
        }
    }

    /// A run finished.
    pub(crate) fn run_finished(&self, agent: &AgentId, run: &RunId) {
        if let Ok(mut runs) = self.runs.lock() {
            if let Some(set) = runs.in_flight.get_mut(agent) {
                set.remove(run);
                if set.is_empty() {
                    runs.in_flight.remove(agent);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_in_flight_expire_after_the_ttl() {
        let q = Quotas::default();
        let a = AgentId::parse("a").unwrap();
        let r = RunId::parse("r").unwrap();
        q.run_admitted(&a, &r, 0);
        assert_eq!(q.runs_in_flight(&a, 10, 100), 1);
        assert_eq!(q.runs_in_flight(&a, 100, 100), 0);
        q.run_admitted(&a, &r, 200);
        q.run_finished(&a, &r);
        assert_eq!(q.runs_in_flight(&a, 200, 100), 0);
    }
}
