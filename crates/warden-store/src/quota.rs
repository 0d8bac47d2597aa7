//! Storage and run quotas, decided inside the write transaction, and the
//! one put decision every backend makes ([`decide_put`]).
//!
//! A backend computes what the decision needs (the current record, and the
//! owner's [`Usage`] when a [`StorageQuota`] is set) in the same
//! transaction as the write, serialised against the owner's other
//! quota-checked writes, so a limit is exact however many servers share the
//! database: N concurrent creates by one owner never store more than
//! `max_records`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_core::memory::{MemoryRecord, Put, PutRejection, apply_put, check_result};
use warden_core::time::Timestamp;

use crate::{PutOutcome, RunState, StepStatus, Usage};

/// What one owner may hold, checked by [`Store::put_record`] inside its
/// transaction. The default is no limit.
///
/// [`Store::put_record`]: crate::Store::put_record
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StorageQuota {
    /// Most records the owner may hold: a create counts one more.
    #[serde(default)]
    pub max_records: Option<u64>,
    /// Most bytes of JSON-encoded values the owner may hold: a write that
    /// grows a value must keep `used - old + new <= max_bytes`; a write
    /// that does not grow one is always allowed.
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl StorageQuota {
    /// No limit at all (the backend then skips computing usage).
    pub fn is_unlimited(&self) -> bool {
        self.max_records.is_none() && self.max_bytes.is_none()
    }
}

/// Which storage limit a write hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaKind {
    /// `max_records`.
    Records,
    /// `max_bytes`.
    Bytes,
}

impl QuotaKind {
    /// Its snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Records => "records",
            QuotaKind::Bytes => "bytes",
        }
    }
}

/// A limit on the runs one agent has in flight, checked by
/// [`Store::create_run`] inside its transaction.
///
/// In flight: runs of the same agent that are not finished and were
/// created at or after `since`. A run is finished once a step is recorded
/// with a status other than `completed`, or once every step has an
/// outcome. The caller encodes the TTL after which an abandoned run stops
/// counting in `since` (now minus the TTL).
///
/// [`Store::create_run`]: crate::Store::create_run
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunsInFlight {
    /// Most runs in flight; a create that would make `max + 1` is refused.
    pub max: u32,
    /// Runs created before this no longer count.
    pub since: Timestamp,
}

/// The length of a value as the quotas count it: its JSON encoding
/// (`serde_json`'s compact form, as every backend stores it).
pub fn encoded_len(value: &Value) -> u64 {
    serde_json::to_vec(value).map_or(u64::MAX, |b| b.len() as u64)
}

/// Decide a put against the current record (`None`: none exists): the
/// compare-and-set of `warden_core::memory::apply_put`, the class check of
/// `check_result`, then `quota` against `usage` (the owner's usage before
/// the write, including `current`; ignored when the quota is unlimited).
///
/// A `Written` outcome carries the record to store; the backend stores it
/// (and, if a conditional statement finds the row changed meanwhile,
/// decides again).
pub fn decide_put(
    current: Option<&MemoryRecord>,
    put: &Put,
    now: Timestamp,
    quota: StorageQuota,
    usage: Usage,
) -> PutOutcome {
    let record = match apply_put(current, put, now) {
        Err(PutRejection::Conflict { current }) => return PutOutcome::Conflict { current },
        Ok(record) => record,
    };
    if let Err(reason) = check_result(&record) {
        return PutOutcome::Rejected {
            reason: reason.to_string(),
        };
    }
    if let Some(over) = over_quota(current, &record.value, quota, usage) {
        return over;
    }
    PutOutcome::Written {
        created: current.is_none(),
        record,
    }
}

fn over_quota(
    current: Option<&MemoryRecord>,
    new_value: &Value,
    quota: StorageQuota,
    usage: Usage,
) -> Option<PutOutcome> {
    if let (None, Some(max)) = (current, quota.max_records)
        && usage.records.saturating_add(1) > max
    {
        return Some(PutOutcome::OverQuota {
            quota: QuotaKind::Records,
            limit: max,
            used: usage.records,
        });
    }
    if let Some(max) = quota.max_bytes {
        let old = current.map_or(0, |c| encoded_len(&c.value));
        let new = encoded_len(new_value);
        if new > old && usage.bytes.saturating_sub(old).saturating_add(new) > max {
            return Some(PutOutcome::OverQuota {
                quota: QuotaKind::Bytes,
                limit: max,
                used: usage.bytes,
            });
        }
    }
    None
}

/// Whether a run is finished (see [`RunsInFlight`]).
pub fn run_finished(state: &RunState) -> bool {
    state
        .outcomes
        .values()
        .any(|o| o.status != StepStatus::Completed)
        || state
            .run
            .steps
            .iter()
            .all(|s| state.outcomes.contains_key(&s.step_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use warden_core::ids::{AgentId, Key, Namespace};

    fn put(value: Value) -> Put {
        Put {
            owner: AgentId::parse("o").unwrap(),
            namespace: Namespace::parse("ns").unwrap(),
            key: Key::parse("k").unwrap(),
            value,
            expected_revision: None,
            visibility: None,
            class: None,
        }
    }

    fn existing(value: Value) -> MemoryRecord {
        apply_put(None, &put(value), Timestamp(0)).unwrap()
    }

    #[test]
    fn a_create_counts_one_more_record() {
        let q = StorageQuota {
            max_records: Some(2),
            max_bytes: None,
        };
        let used = |records| Usage { records, bytes: 0 };
        assert!(matches!(
            decide_put(None, &put(json!(1)), Timestamp(1), q, used(1)),
            PutOutcome::Written { created: true, .. }
        ));
        assert_eq!(
            decide_put(None, &put(json!(1)), Timestamp(1), q, used(2)),
            PutOutcome::OverQuota {
                quota: QuotaKind::Records,
                limit: 2,
                used: 2
            }
        );
        // An update is not a create.
        let cur = existing(json!(1));
        assert!(matches!(
            decide_put(Some(&cur), &put(json!(2)), Timestamp(1), q, used(5)),
            PutOutcome::Written { created: false, .. }
        ));
    }

    #[test]
    fn conflicts_and_rejections_come_before_quotas() {
        let q = StorageQuota {
            max_records: Some(0),
            max_bytes: Some(0),
        };
        let mut p = put(json!(1));
        p.expected_revision = Some(3);
        assert_eq!(
            decide_put(None, &p, Timestamp(1), q, Usage::default()),
            PutOutcome::Conflict { current: None }
        );
    }

    proptest! {
        /// The byte rule: growth must fit, shrinking or equal always does.
        #[test]
        fn bytes_rule(old in 0usize..40, new in 0usize..40, others in 0u64..100, max in 0u64..150) {
            let cur = existing(json!("x".repeat(old)));
            let old_len = encoded_len(&cur.value);
            let usage = Usage { records: 1, bytes: others + old_len };
            let q = StorageQuota { max_records: None, max_bytes: Some(max) };
            let value = json!("x".repeat(new));
            let new_len = encoded_len(&value);
            let outcome = decide_put(Some(&cur), &put(value), Timestamp(1), q, usage);
            let allowed = new_len <= old_len || others + new_len <= max;
            prop_assert_eq!(matches!(outcome, PutOutcome::Written { .. }), allowed);
            if !allowed {
                prop_assert_eq!(outcome, PutOutcome::OverQuota { quota: QuotaKind::Bytes, limit: max, used: usage.bytes });
            }
        }
    }
}
