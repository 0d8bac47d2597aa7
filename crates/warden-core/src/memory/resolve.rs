//! Reading: resolution along the reader's lineage.

use serde_json::Value;

use super::index::SLOT_SCAN_LIMIT;
use super::{Combinator, Contributor, KeyView, MemoryRecord, RecordClass, Visibility};
use crate::decision::{Reason, reasons};
use crate::hierarchy::{AgentIdx, Hierarchy, Placement};
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
/// (`records_at_key`, e.g. [`KeyView::len`]): once the walk has met that
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
    let mut scan = Scan::default();
    let mut seen = 0usize;
    let mut walked = 0usize;
    for (position, owner) in lineage.clone().enumerate() {
        if seen >= records_at_key {
            break;
        }
        walked = position + 1;
        if let Some(record) = lookup(owner) {
            seen += 1;
            scan.add(reader, now, position, record);
        }
    }
    let lookup = &mut lookup;
    scan.decide(reader, now, move || {
        lineage
            .take(walked)
            .enumerate()
            .filter_map(move |(pos, owner)| lookup(owner).map(|r| (pos, r)))
    })
}

/// Resolve the key of `view` for the agent at `reader` in `hierarchy`: the
/// same answer as [`resolve_bounded`] along
/// [`hierarchy.lineage(reader)`](Hierarchy::lineage), without walking it
/// when the key holds few records.
///
/// While the key holds at most [`FEW_RECORDS`] records, or no more than the
/// reader's lineage has levels, it visits the key's records instead of the
/// lineage: per record one lookup of where its owner sits
/// ([`Hierarchy::placement_of`], from the id table) and a
/// constant-time ancestor test ([`Hierarchy::is_ancestor_of`], one entry
/// of the lineage arena); a record whose owner is the reader or one
/// of its ancestors sits at position `reader depth - owner depth`. The cost
/// is then linear in the number of records at the key and independent of
/// the depth. A key holding more records than both is resolved by the
/// lineage walk of [`resolve_bounded`] (one owner lookup per level). Either
/// way the only allocations are the answer's own (a `visible_from:<owner>`
/// style reason; the contributors of a combined `policy` value). A `reader`
/// the hierarchy does not hold resolves to [`Resolution::NotFound`] (its
/// lineage is empty).
pub fn resolve_in<'r>(
    hierarchy: &Hierarchy,
    reader: AgentIdx,
    view: KeyView<'r>,
    now: Timestamp,
) -> Resolution<'r> {
    let (Some(node), Some(place)) = (hierarchy.node(reader), hierarchy.placement(reader)) else {
        return Resolution::NotFound;
    };
    resolve_placed(hierarchy, place, node.id(), view, now)
}

/// [`resolve_in`] for the agent whose id is `reader`: the same answer as
/// `resolve_in(hierarchy, hierarchy.index_of(reader)?, view, now)`, with
/// the reader found by [`Hierarchy::placement_of`], which for a short id
/// reads the id table and not the reader's node (one cache line instead
/// of two for a reader not in cache). A reader the hierarchy does
/// not hold resolves to [`Resolution::NotFound`].
pub fn resolve_for<'r>(
    hierarchy: &Hierarchy,
    reader: &AgentId,
    view: KeyView<'r>,
    now: Timestamp,
) -> Resolution<'r> {
    match hierarchy.placement_of(reader.as_str()) {
        Some(place) => resolve_placed(hierarchy, place, reader, view, now),
        None => Resolution::NotFound,
    }
}

/// [`resolve_in`] for the agent `reader_id` placed at `place`.
#[inline]
fn resolve_placed<'r>(
    hierarchy: &Hierarchy,
    place: Placement,
    reader_id: &AgentId,
    view: KeyView<'r>,
    now: Timestamp,
) -> Resolution<'r> {
    let reader = place.idx();
    let depth = usize::from(place.depth());
    let records = view.len();
    if records > FEW_RECORDS && records > depth + 1 {
        let lineage = hierarchy.lineage(reader).map(|(_, n)| n.id());
        return resolve_bounded(reader_id, lineage, |o| view.get(o.as_str()), now, records);
    }
    // A record's position on the reader's lineage, if its owner is on it.
    let on_lineage = |record: &'r MemoryRecord| -> Option<(usize, &'r MemoryRecord)> {
        let owner = hierarchy.placement_of(record.owner.as_str())?;
        if owner.idx() == reader {
            return Some((0, record));
        }
        if !hierarchy.is_ancestor_of(owner, place) {
            return None;
        }
        Some((depth.checked_sub(usize::from(owner.depth()))?, record))
    };
    let mut scan = Scan::default();
    for (position, record) in view.iter().filter_map(on_lineage) {
        scan.add(reader_id, now, position, record);
    }
    scan.decide(reader_id, now, || view.iter().filter_map(on_lineage))
}

/// How many records a key may hold for [`resolve_in`] to visit them rather
/// than walk the reader's lineage, whatever the reader's depth (the
/// [`MemoryIndex`](super::MemoryIndex)'s short-vector size).
pub const FEW_RECORDS: usize = SLOT_SCAN_LIMIT;

/// Whether a record counts in a `policy` combination for `reader`, seen at
/// `position` on its lineage: live, of class `policy` and visible.
fn contributes(record: &MemoryRecord, reader: &AgentId, position: usize, now: Timestamp) -> bool {
    !record.expired(now)
        && matches!(record.class, RecordClass::Policy { .. })
        && visible(record, reader, position)
}

/// What one pass over the records on a reader's lineage found, each record
/// given with its position (0 for the reader's own), in any order. The one
/// place a read is decided, whichever way the records were found.
#[derive(Default)]
struct Scan<'r> {
    /// The live record at the smallest position.
    nearest: Option<(usize, &'r MemoryRecord)>,
    /// Whether a live, visible `policy` record was seen.
    has_policy: bool,
    /// Whether the reader's own record is expired.
    expired_own: bool,
}

impl<'r> Scan<'r> {
    #[inline]
    fn add(&mut self, reader: &AgentId, now: Timestamp, position: usize, record: &'r MemoryRecord) {
        if record.expired(now) {
            self.expired_own |= position == 0;
            return;
        }
        if self.nearest.is_none_or(|(p, _)| position < p) {
            self.nearest = Some((position, record));
        }
        self.has_policy |= contributes(record, reader, position, now);
    }

    /// The answer. `levels` yields the same (position, record) pairs again,
    /// in any order; it is called only in the (rare) policy case, which
    /// combines every contributing record nearest first.
    fn decide<I>(
        self,
        reader: &AgentId,
        now: Timestamp,
        levels: impl FnOnce() -> I,
    ) -> Resolution<'r>
    where
        I: Iterator<Item = (usize, &'r MemoryRecord)>,
    {
        if self.has_policy {
            let mut levels: Vec<(usize, &'r MemoryRecord)> = levels()
                .filter(|(pos, r)| contributes(r, reader, *pos, now))
                .collect();
            levels.sort_by_key(|(pos, _)| *pos);
            return combine(levels);
        }
        match self.nearest {
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
            None if self.expired_own => Resolution::Denied {
                reason: reasons::RECORD_EXPIRED,
            },
            None => Resolution::NotFound,
        }
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
