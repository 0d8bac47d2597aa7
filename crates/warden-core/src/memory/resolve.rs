//! Reading: resolution along the reader's lineage.

use serde_json::Value;

use super::{Combinator, Contributor, MemoryRecord, RecordClass, Visibility};
use crate::decision::{Reason, reasons};
use crate::ids::AgentId;
use crate::time::Timestamp;

/// The outcome of a read.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution<'r> {
    /// A single record was resolved; it keeps its owner.
    Found {
        /// The record.
        record: &'r MemoryRecord,
        /// `visible_from:<owner>` or `secret_granted`.
        reason: Reason,
    },
    /// A `policy` value combined from every visible level.
    Combined {
        /// The combined value.
        value: Value,
        /// The governing combinator (the root-most record's).
        combinator: Combinator,
        /// Every contributing record, nearest first.
        contributors: Vec<Contributor>,
        /// `combined_from:<owners joined by +>`.
        reason: Reason,
    },
    /// A record exists but the reader may not see it, or it cannot be used.
    Denied {
        /// Why.
        reason: Reason,
    },
    /// No record on the lineage.
    NotFound,
}

fn visible(record: &MemoryRecord, reader: &AgentId, position: usize) -> bool {
    if position == 0 || &record.owner == reader {
        return true;
    }
    match &record.class {
        RecordClass::Secret { grants } => grants.iter().any(|g| g == reader),
        RecordClass::Task { .. } => false,
        RecordClass::Preference | RecordClass::Policy { .. } => match record.visibility {
            Visibility::Private => false,
            Visibility::Children => position == 1,
            Visibility::Descendants => true,
        },
    }
}

/// Resolve a key for `reader`.
///
/// `lineage` yields the reader and its ancestors, nearest first (the reader
/// itself at position 0). `lookup(owner)` returns that owner's record for the
/// key being read, if any. Cost is one lookup per lineage level: linear in
/// depth, independent of how many agents or records exist.
pub fn resolve<'a, 'r, L>(
    reader: &AgentId,
    lineage: L,
    lookup: impl FnMut(&AgentId) -> Option<&'r MemoryRecord>,
    now: Timestamp,
) -> Resolution<'r>
where
    L: IntoIterator<Item = &'a AgentId>,
    L::IntoIter: Clone,
{
    resolve_bounded(reader, lineage, lookup, now, usize::MAX)
}

/// [`resolve`], for a caller that knows how many records exist at the key
/// (`records_at_key`, e.g. [`KeyView::len`](super::KeyView::len)): once the walk has met that
/// many, no level above can hold another, so it stops there. Same answer as
/// [`resolve`]; the walk goes only as far as the farthest record on the
/// lineage instead of always to the root (a policy record could otherwise
/// be waiting further up).
pub fn resolve_bounded<'a, 'r, L>(
    reader: &AgentId,
    lineage: L,
    mut lookup: impl FnMut(&AgentId) -> Option<&'r MemoryRecord>,
    now: Timestamp,
    records_at_key: usize,
) -> Resolution<'r>
where
    L: IntoIterator<Item = &'a AgentId>,
    L::IntoIter: Clone,
{
    let lineage = lineage.into_iter();
    // One pass finds the nearest live record and whether any visible
    // `policy` record exists; the (rare) policy case takes a second pass.
    let mut nearest: Option<(usize, &'r MemoryRecord)> = None;
    let mut has_policy = false;
    let mut expired_own = false;
    let mut seen = 0usize;
    let mut walked = 0usize;
    for (position, owner) in lineage.clone().enumerate() {
        if seen >= records_at_key {
            break;
        }
        walked = position + 1;
        if let Some(record) = lookup(owner) {
            seen += 1;
            if record.expired(now) {
                expired_own |= position == 0;
                continue;
            }
            if nearest.is_none() {
                nearest = Some((position, record));
            }
            if matches!(record.class, RecordClass::Policy { .. })
                && visible(record, reader, position)
            {
                has_policy = true;
            }
        }
    }

    if has_policy {
        let levels: Vec<(usize, &'r MemoryRecord)> = lineage
            .take(walked)
            .enumerate()
            .filter_map(|(pos, owner)| lookup(owner).map(|r| (pos, r)))
            .filter(|(pos, r)| {
                !r.expired(now)
                    && matches!(r.class, RecordClass::Policy { .. })
                    && visible(r, reader, *pos)
            })
            .collect();
        return combine(levels);
    }

    match nearest {
        Some((pos, record)) if visible(record, reader, pos) => {
            let reason = match record.class {
                RecordClass::Secret { .. } if pos > 0 => reasons::SECRET_GRANTED,
                _ => Reason::with_param(reasons::VISIBLE_FROM, record.owner.as_str()),
            };
            Resolution::Found { record, reason }
        }
        Some((_, record)) => Resolution::Denied {
            reason: Reason::with_param(reasons::NOT_VISIBLE_FROM, record.owner.as_str()),
        },
        None if expired_own => Resolution::Denied {
            reason: reasons::RECORD_EXPIRED,
        },
        None => Resolution::NotFound,
    }
}

/// Reason for a `policy` record whose value does not fit the governing
/// combinator; the read fails closed.
pub const POLICY_TYPE_MISMATCH: &str = "policy_type_mismatch";

fn combine<'r>(levels: Vec<(usize, &'r MemoryRecord)>) -> Resolution<'r> {
    let Some(governing) = levels.last().and_then(|(_, r)| match r.class {
        RecordClass::Policy { combine } => Some(combine),
        _ => None,
    }) else {
        return Resolution::NotFound;
    };
    // Root-most first, so `intersection` keeps the root's element order.
    let mut acc: Option<Value> = None;
    for (_, record) in levels.iter().rev() {
        let v = &record.value;
        if !governing.accepts(v) {
            return Resolution::Denied {
                reason: Reason::with_param(POLICY_TYPE_MISMATCH, record.owner.as_str()),
            };
        }
        acc = Some(match acc {
            None => v.clone(),
            Some(a) => combine_two(governing, a, v),
        });
    }
    let value = acc.unwrap_or(Value::Null);
    let owners: Vec<&str> = levels.iter().map(|(_, r)| r.owner.as_str()).collect();
    let contributors = levels
        .iter()
        .map(|(_, r)| Contributor {
            owner_agent_id: r.owner.clone(),
            revision: r.revision,
            value: r.value.clone(),
        })
        .collect();
    Resolution::Combined {
        value,
        combinator: governing,
        contributors,
        reason: Reason::with_param(reasons::COMBINED_FROM, &owners.join("+")),
    }
}

fn combine_two(c: Combinator, a: Value, b: &Value) -> Value {
    match c {
        Combinator::All => Value::Bool(a.as_bool() == Some(true) && b.as_bool() == Some(true)),
        Combinator::Any => Value::Bool(a.as_bool() == Some(true) || b.as_bool() == Some(true)),
        Combinator::Min | Combinator::Max => {
            let keep_b = match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => match (a.as_i64(), b.as_i64()) {
                    (Some(i), Some(j)) => {
                        if c == Combinator::Min {
                            j < i
                        } else {
                            j > i
                        }
                    }
                    _ => {
                        if c == Combinator::Min {
                            y < x
                        } else {
                            y > x
                        }
                    }
                },
                _ => false,
            };
            if keep_b { b.clone() } else { a }
        }
        Combinator::Intersection => match (a, b.as_array()) {
            (Value::Array(xs), Some(ys)) => {
                Value::Array(xs.into_iter().filter(|x| ys.contains(x)).collect())
            }
            (other, _) => other,
        },
    }
}
