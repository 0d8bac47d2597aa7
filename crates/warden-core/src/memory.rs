//! Memory records with provenance, and the rules that read and write them.
//!
//! Reading and writing use different addressing on purpose (the lab
//! document's central rule):
//!
//! - a **read** walks from the reader toward the root and resolves the key
//!   along that lineage ([`resolve`]);
//! - a **write** names an exact owner scope and is permitted only to that
//!   owner ([`check_write`]), optionally as a compare-and-set on the revision
//!   ([`apply_put`], which a store runs inside its transaction).
//!
//! Record classes change how a key resolves:
//!
//! - `preference`: the nearest record on the lineage wins (shadowing allowed);
//!   if it is not visible to the reader the read is denied, it does not skip
//!   to a farther record.
//! - `policy`: mandatory. If any visible record on the lineage is of class
//!   `policy`, every visible `policy` record is combined with the combinator
//!   of the root-most one, and records of other classes at that key are
//!   ignored, so a descendant can neither shadow nor loosen the value.
//! - `secret`: never resolved through the hierarchy: visible only to its
//!   owner and to agents named in its grants.
//! - `task`: private temporary state with an optional expiry.

use crate::FastMap as HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{Reason, reasons};
use crate::ids::{AgentId, Key, Namespace};
use crate::time::Timestamp;

/// Who besides the owner may read a record.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    /// The owner only.
    #[default]
    Private,
    /// The owner and its direct children.
    Children,
    /// The owner and all its descendants.
    Descendants,
}

impl Visibility {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::Private => "private",
            Visibility::Children => "children",
            Visibility::Descendants => "descendants",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "private" => Some(Self::Private),
            "children" => Some(Self::Children),
            "descendants" => Some(Self::Descendants),
            _ => None,
        }
    }
}

impl std::str::FromStr for Visibility {
    type Err = String;

    /// Parse the snake_case name ([`Visibility::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Visibility::parse(s).ok_or_else(|| format!("unknown visibility `{s}`"))
    }
}

/// How `policy` records along a lineage combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Combinator {
    /// Booleans: true only if every level says true.
    All,
    /// Booleans: true if any level says true.
    Any,
    /// Numbers: the smallest.
    Min,
    /// Numbers: the largest.
    Max,
    /// Arrays: the elements every level lists.
    Intersection,
}

impl Combinator {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Combinator::All => "all",
            Combinator::Any => "any",
            Combinator::Min => "min",
            Combinator::Max => "max",
            Combinator::Intersection => "intersection",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Self::All),
            "any" => Some(Self::Any),
            "min" => Some(Self::Min),
            "max" => Some(Self::Max),
            "intersection" => Some(Self::Intersection),
            _ => None,
        }
    }

    /// Whether `value` has the type this combinator combines.
    pub fn accepts(self, value: &Value) -> bool {
        match self {
            Combinator::All | Combinator::Any => value.is_boolean(),
            Combinator::Min | Combinator::Max => value.is_number(),
            Combinator::Intersection => value.is_array(),
        }
    }
}

/// A record's class and the data only that class has.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum RecordClass {
    /// Nearest-visible resolution.
    #[default]
    Preference,
    /// Mandatory, combined along the lineage.
    Policy {
        /// How the levels combine.
        combine: Combinator,
    },
    /// Never resolved through the hierarchy.
    Secret {
        /// Agents besides the owner that may read it.
        #[serde(default)]
        grants: Vec<AgentId>,
    },
    /// Private temporary state.
    Task {
        /// When it stops resolving.
        #[serde(default)]
        expires_at: Option<Timestamp>,
    },
}

impl RecordClass {
    /// The class name.
    pub fn name(&self) -> &'static str {
        match self {
            RecordClass::Preference => "preference",
            RecordClass::Policy { .. } => "policy",
            RecordClass::Secret { .. } => "secret",
            RecordClass::Task { .. } => "task",
        }
    }
}

impl std::str::FromStr for Combinator {
    type Err = String;

    /// Parse the snake_case name ([`Combinator::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Combinator::parse(s).ok_or_else(|| format!("unknown combinator `{s}`"))
    }
}

/// One stored memory record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Namespace.
    pub namespace: Namespace,
    /// Key within the namespace.
    pub key: Key,
    /// The value.
    pub value: Value,
    /// The only agent that may write or delete it.
    pub owner: AgentId,
    /// Who else may read it.
    pub visibility: Visibility,
    /// Its class.
    #[serde(flatten)]
    pub class: RecordClass,
    /// 1 on create, +1 per write.
    pub revision: u64,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
}

impl MemoryRecord {
    /// The resource name used in decisions: `namespace.key`.
    pub fn resource(&self) -> String {
        format!("{}.{}", self.namespace, self.key)
    }

    fn expired(&self, now: Timestamp) -> bool {
        matches!(self.class, RecordClass::Task { expires_at: Some(t) } if t <= now)
    }
}

/// One record that contributed to a combined `policy` value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contributor {
    /// Its owner.
    pub owner_agent_id: AgentId,
    /// Its revision.
    pub revision: u64,
    /// Its own value.
    pub value: Value,
}

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

/// An in-memory index of records: `namespace → key → records by owner`.
///
/// Lookups borrow `&str`, so resolving allocates nothing. The owners of one
/// key are kept in a short vector while there are few of them and in a hash
/// map once there are many, so a resolve costs one lookup of the namespace
/// and key plus one cheap owner lookup per lineage level, whatever the total
/// number of records.
#[derive(Debug, Clone, Default)]
pub struct MemoryIndex {
    by_key: HashMap<Namespace, HashMap<Key, Slot>>,
    len: usize,
}

/// Owners of one key: a vector up to [`SLOT_SCAN_LIMIT`] entries, a map above.
#[derive(Debug, Clone)]
enum Slot {
    Few(Vec<MemoryRecord>),
    Many(HashMap<AgentId, MemoryRecord>),
}

/// How many owners of one key are scanned linearly before switching to a map.
const SLOT_SCAN_LIMIT: usize = 16;

impl Slot {
    #[inline]
    fn get(&self, owner: &str) -> Option<&MemoryRecord> {
        match self {
            Slot::Few(v) => v.iter().find(|r| r.owner.as_str() == owner),
            Slot::Many(m) => m.get(owner),
        }
    }
}

impl MemoryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A lookup for one `namespace.key`: `owner → record`. Resolve with
    /// `resolve_bounded(reader, lineage, |o| view.get(o.as_str()), now, view.len())`.
    #[inline]
    pub fn view(&self, namespace: &str, key: &str) -> KeyView<'_> {
        KeyView(self.by_key.get(namespace).and_then(|m| m.get(key)))
    }

    /// The record `owner` holds at `namespace.key`.
    pub fn get(&self, owner: &str, namespace: &str, key: &str) -> Option<&MemoryRecord> {
        self.view(namespace, key).get(owner)
    }

    /// Insert or replace `record` (by owner, namespace and key).
    pub fn insert(&mut self, record: MemoryRecord) {
        let slot = self
            .by_key
            .entry(record.namespace.clone())
            .or_default()
            .entry(record.key.clone())
            .or_insert_with(|| Slot::Few(Vec::new()));
        let added = match slot {
            Slot::Few(v) => {
                if let Some(existing) = v.iter_mut().find(|r| r.owner == record.owner) {
                    *existing = record;
                    false
                } else if v.len() < SLOT_SCAN_LIMIT {
                    v.push(record);
                    true
                } else {
                    let mut m: HashMap<AgentId, MemoryRecord> =
                        v.drain(..).map(|r| (r.owner.clone(), r)).collect();
                    m.insert(record.owner.clone(), record);
                    *slot = Slot::Many(m);
                    true
                }
            }
            Slot::Many(m) => m.insert(record.owner.clone(), record).is_none(),
        };
        if added {
            self.len += 1;
        }
    }

    /// Remove the record `owner` holds at `namespace.key`.
    pub fn remove(&mut self, owner: &str, namespace: &str, key: &str) -> Option<MemoryRecord> {
        let slot = self.by_key.get_mut(namespace)?.get_mut(key)?;
        let removed = match slot {
            Slot::Few(v) => {
                let at = v.iter().position(|r| r.owner.as_str() == owner)?;
                Some(v.swap_remove(at))
            }
            Slot::Many(m) => m.remove(owner),
        };
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Every record, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &MemoryRecord> {
        self.by_key.values().flat_map(|m| m.values()).flat_map(
            |slot| -> Box<dyn Iterator<Item = &MemoryRecord> + '_> {
                match slot {
                    Slot::Few(v) => Box::new(v.iter()),
                    Slot::Many(m) => Box::new(m.values()),
                }
            },
        )
    }
}

/// The records of one `namespace.key`, by owner.
#[derive(Debug, Clone, Copy)]
pub struct KeyView<'a>(Option<&'a Slot>);

impl<'a> KeyView<'a> {
    /// The record `owner` holds.
    #[inline]
    pub fn get(&self, owner: &str) -> Option<&'a MemoryRecord> {
        self.0.and_then(|s| s.get(owner))
    }

    /// How many records (of any owner) the key holds: the bound for
    /// [`resolve_bounded`].
    #[inline]
    pub fn len(&self) -> usize {
        match self.0 {
            None => 0,
            Some(Slot::Few(v)) => v.len(),
            Some(Slot::Many(m)) => m.len(),
        }
    }

    /// Whether the key holds no record.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A write (create or update) of one record, as an owner asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Put {
    /// The owner scope the write names (must be the actor).
    pub owner: AgentId,
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// New value.
    pub value: Value,
    /// Compare-and-set: `Some(0)` means "must not exist yet", `Some(n)` means
    /// "must be at revision n", `None` writes unconditionally.
    pub expected_revision: Option<u64>,
    /// New visibility; `None` keeps the current one (private on create).
    pub visibility: Option<Visibility>,
    /// New class; `None` keeps the current one (preference on create).
    pub class: Option<RecordClass>,
}

/// Why a put could not be applied to the current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutRejection {
    /// The revision did not match (`current` is `None` if there is no record).
    Conflict {
        /// The stored revision, if a record exists.
        current: Option<u64>,
    },
}

/// Reason for a record that is invalid for its class.
pub const INVALID_RECORD: &str = "invalid_record";

/// Check a write's authorisation and shape before touching storage.
///
/// Only the owner writes its records; the value must fit the class (a
/// `policy` value must fit its combinator; secrets and task state are
/// private). Returns the denial reason, if any.
pub fn check_write(actor: &AgentId, put: &Put) -> Result<(), Reason> {
    if &put.owner != actor {
        return Err(reasons::ACTOR_IS_NOT_OWNER);
    }
    if let Some(class) = &put.class {
        check_class(class, put.visibility, &put.value)?;
    }
    Ok(())
}

fn check_class(
    class: &RecordClass,
    visibility: Option<Visibility>,
    value: &Value,
) -> Result<(), Reason> {
    match class {
        RecordClass::Policy { combine } if !combine.accepts(value) => Err(Reason::with_param(
            INVALID_RECORD,
            "policy_value_does_not_fit_combinator",
        )),
        RecordClass::Secret { .. } | RecordClass::Task { .. }
            if visibility.is_some_and(|v| v != Visibility::Private) =>
        {
            Err(Reason::with_param(INVALID_RECORD, "class_is_private_only"))
        }
        _ => Ok(()),
    }
}

/// Compute the record a put produces from the current one, or reject it.
///
/// Stores call this inside the transaction that holds the current row, so
/// the compare and the mutation are one atomic step.
pub fn apply_put(
    current: Option<&MemoryRecord>,
    put: &Put,
    now: Timestamp,
) -> Result<MemoryRecord, PutRejection> {
    match (current, put.expected_revision) {
        (None, Some(n)) if n != 0 => return Err(PutRejection::Conflict { current: None }),
        (Some(c), Some(n)) if c.revision != n => {
            return Err(PutRejection::Conflict {
                current: Some(c.revision),
            });
        }
        _ => {}
    }
    Ok(match current {
        None => MemoryRecord {
            namespace: put.namespace.clone(),
            key: put.key.clone(),
            value: put.value.clone(),
            owner: put.owner.clone(),
            visibility: put.visibility.unwrap_or_default(),
            class: put.class.clone().unwrap_or_default(),
            revision: 1,
            created_at: now,
            updated_at: now,
        },
        Some(c) => MemoryRecord {
            namespace: c.namespace.clone(),
            key: c.key.clone(),
            value: put.value.clone(),
            owner: c.owner.clone(),
            visibility: put.visibility.unwrap_or(c.visibility),
            class: put.class.clone().unwrap_or_else(|| c.class.clone()),
            revision: c.revision.saturating_add(1),
            created_at: c.created_at,
            updated_at: now,
        },
    })
}

/// Check the record a put would produce against its class (a put that keeps
/// the class of a `policy` record must still fit its combinator).
pub fn check_result(record: &MemoryRecord) -> Result<(), Reason> {
    check_class(&record.class, Some(record.visibility), &record.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(s: &str) -> AgentId {
        AgentId::parse(s).unwrap()
    }

    fn rec(owner: &str, value: Value, vis: Visibility, class: RecordClass) -> MemoryRecord {
        MemoryRecord {
            namespace: Namespace::parse("ns").unwrap(),
            key: Key::parse("k").unwrap(),
            value,
            owner: id(owner),
            visibility: vis,
            class,
            revision: 1,
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
        }
    }

    fn run<'r>(reader: &str, lineage: &[&str], records: &'r [MemoryRecord]) -> Resolution<'r> {
        let ids: Vec<AgentId> = lineage.iter().map(|s| id(s)).collect();
        resolve(
            &id(reader),
            ids.iter(),
            |owner| records.iter().find(|r| &r.owner == owner),
            Timestamp(100),
        )
    }

    #[test]
    fn nearest_visible_wins_and_keeps_owner() {
        let records = vec![
            rec(
                "root",
                json!("EU"),
                Visibility::Descendants,
                RecordClass::Preference,
            ),
            rec(
                "mid",
                json!("US"),
                Visibility::Children,
                RecordClass::Preference,
            ),
        ];
        match run("leaf", &["leaf", "mid", "root"], &records) {
            Resolution::Found { record, reason } => {
                assert_eq!(record.owner.as_str(), "mid");
                assert_eq!(reason.as_str(), "visible_from:mid");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn children_visibility_is_direct_children_only() {
        let records = vec![rec(
            "root",
            json!(1),
            Visibility::Children,
            RecordClass::Preference,
        )];
        assert!(matches!(
            run("mid", &["mid", "root"], &records),
            Resolution::Found { .. }
        ));
        match run("leaf", &["leaf", "mid", "root"], &records) {
            Resolution::Denied { reason } => assert_eq!(reason.as_str(), "not_visible_from:root"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn policy_cannot_be_shadowed_or_loosened() {
        let records = vec![
            rec(
                "root",
                json!(false),
                Visibility::Descendants,
                RecordClass::Policy {
                    combine: Combinator::All,
                },
            ),
            rec(
                "leaf",
                json!(true),
                Visibility::Private,
                RecordClass::Preference,
            ),
        ];
        match run("leaf", &["leaf", "root"], &records) {
            Resolution::Combined {
                value,
                contributors,
                ..
            } => {
                assert_eq!(value, json!(false));
                assert_eq!(contributors.len(), 1);
                assert_eq!(contributors[0].owner_agent_id.as_str(), "root");
            }
            other => panic!("{other:?}"),
        }
        // A child's own policy record with a looser combinator is combined
        // under the root's combinator.
        let records = vec![
            rec(
                "root",
                json!(false),
                Visibility::Descendants,
                RecordClass::Policy {
                    combine: Combinator::All,
                },
            ),
            rec(
                "leaf",
                json!(true),
                Visibility::Private,
                RecordClass::Policy {
                    combine: Combinator::Any,
                },
            ),
        ];
        match run("leaf", &["leaf", "root"], &records) {
            Resolution::Combined {
                value,
                combinator,
                contributors,
                reason,
            } => {
                assert_eq!(value, json!(false));
                assert_eq!(combinator, Combinator::All);
                assert_eq!(contributors.len(), 2);
                assert_eq!(reason.as_str(), "combined_from:leaf+root");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn combinators() {
        let p = |owner: &str, v: Value, c| {
            rec(
                owner,
                v,
                Visibility::Descendants,
                RecordClass::Policy { combine: c },
            )
        };
        let value = |records: &[MemoryRecord]| match run("b", &["b", "a"], records) {
            Resolution::Combined { value, .. } => value,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            value(&[
                p("a", json!(30), Combinator::Min),
                p("b", json!(7), Combinator::Min)
            ]),
            json!(7)
        );
        assert_eq!(
            value(&[
                p("a", json!(30), Combinator::Min),
                p("b", json!(90), Combinator::Min)
            ]),
            json!(30)
        );
        assert_eq!(
            value(&[
                p("a", json!(3.5), Combinator::Max),
                p("b", json!(2), Combinator::Max)
            ]),
            json!(3.5)
        );
        assert_eq!(
            value(&[
                p("a", json!(["x", "y", "z"]), Combinator::Intersection),
                p("b", json!(["z", "x", "w"]), Combinator::Intersection)
            ]),
            json!(["x", "z"])
        );
        assert_eq!(
            value(&[
                p("a", json!(false), Combinator::Any),
                p("b", json!(true), Combinator::Any)
            ]),
            json!(true)
        );
        match run(
            "b",
            &["b", "a"],
            &[
                p("a", json!(1), Combinator::Min),
                p("b", json!("x"), Combinator::Min),
            ],
        ) {
            Resolution::Denied { reason } => assert_eq!(reason.as_str(), "policy_type_mismatch:b"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn secrets_are_owner_or_grant_only() {
        let records = vec![rec(
            "root",
            json!("token"),
            Visibility::Private,
            RecordClass::Secret {
                grants: vec![id("granted")],
            },
        )];
        match run("mid", &["mid", "root"], &records) {
            Resolution::Denied { reason } => assert_eq!(reason.as_str(), "not_visible_from:root"),
            other => panic!("{other:?}"),
        }
        match run("granted", &["granted", "root"], &records) {
            Resolution::Found { reason, .. } => assert_eq!(reason.as_str(), "secret_granted"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            run("root", &["root"], &records),
            Resolution::Found { .. }
        ));
    }

    #[test]
    fn expired_task_state_does_not_resolve() {
        let records = vec![rec(
            "a",
            json!(1),
            Visibility::Private,
            RecordClass::Task {
                expires_at: Some(Timestamp(50)),
            },
        )];
        match run("a", &["a"], &records) {
            Resolution::Denied { reason } => assert_eq!(reason.as_str(), "record_expired"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn index_switches_to_a_map_and_keeps_counts() {
        let mut idx = MemoryIndex::new();
        for i in 0..40 {
            idx.insert(rec(
                &format!("o{i}"),
                json!(i),
                Visibility::Private,
                RecordClass::Preference,
            ));
        }
        idx.insert(rec(
            "o3",
            json!("again"),
            Visibility::Private,
            RecordClass::Preference,
        ));
        assert_eq!(idx.len(), 40);
        assert_eq!(idx.get("o3", "ns", "k").unwrap().value, json!("again"));
        assert_eq!(idx.get("o39", "ns", "k").unwrap().value, json!(39));
        assert!(idx.remove("o39", "ns", "k").is_some());
        assert!(idx.get("o39", "ns", "k").is_none());
        assert_eq!(idx.len(), 39);
        assert_eq!(idx.iter().count(), 39);
        assert!(idx.view("ns", "other").get("o1").is_none());
    }

    proptest::proptest! {
        /// Stopping once every record of the key has been met never
        /// changes the answer.
        #[test]
        fn bounded_resolve_agrees_with_the_full_walk(
            depth in 1usize..12,
            recs in proptest::collection::vec((0usize..16, 0u8..3, 0u8..4, proptest::bool::ANY), 0..10),
            reader_at in 0usize..12,
        ) {
            let lineage: Vec<AgentId> = (0..depth).map(|i| id(&format!("a{i}"))).collect();
            let mut records: Vec<MemoryRecord> = Vec::new();
            for (owner, vis, class, flag) in recs {
                // Owners 0..depth sit on the lineage, the rest off it.
                let owner = format!("a{owner}");
                if records.iter().any(|r| r.owner.as_str() == owner) {
                    continue;
                }
                let vis = [Visibility::Private, Visibility::Children, Visibility::Descendants][vis as usize];
                let (class, value) = match class {
                    0 => (RecordClass::Preference, json!(1)),
                    1 => (RecordClass::Policy { combine: if flag { Combinator::All } else { Combinator::Any } }, json!(flag)),
                    2 => (RecordClass::Secret { grants: vec![id("a0")] }, json!("s")),
                    _ => (RecordClass::Task { expires_at: Some(Timestamp(if flag { 50 } else { 500 })) }, json!(2)),
                };
                let vis = if matches!(class, RecordClass::Secret { .. } | RecordClass::Task { .. }) { Visibility::Private } else { vis };
                records.push(rec(&owner, value, vis, class));
            }
            let start = reader_at.min(depth - 1);
            let walk = &lineage[start..];
            let reader = &walk[0];
            let lookup = |o: &AgentId| records.iter().find(|r| &r.owner == o);
            let full = resolve(reader, walk.iter(), lookup, Timestamp(100));
            let bounded = resolve_bounded(reader, walk.iter(), lookup, Timestamp(100), records.len());
            proptest::prop_assert_eq!(full, bounded);
        }
    }

    #[test]
    fn puts_check_owner_and_revision() {
        let put = Put {
            owner: id("a"),
            namespace: Namespace::parse("ns").unwrap(),
            key: Key::parse("k").unwrap(),
            value: json!(1),
            expected_revision: None,
            visibility: None,
            class: None,
        };
        assert_eq!(
            check_write(&id("b"), &put),
            Err(reasons::ACTOR_IS_NOT_OWNER)
        );
        assert_eq!(check_write(&id("a"), &put), Ok(()));
        let created = apply_put(None, &put, Timestamp(1)).unwrap();
        assert_eq!(created.revision, 1);
        let stale = Put {
            expected_revision: Some(5),
            ..put.clone()
        };
        assert_eq!(
            apply_put(Some(&created), &stale, Timestamp(2)),
            Err(PutRejection::Conflict { current: Some(1) })
        );
        let create_only = Put {
            expected_revision: Some(0),
            ..put.clone()
        };
        assert!(apply_put(Some(&created), &create_only, Timestamp(2)).is_err());
        let next = apply_put(Some(&created), &put, Timestamp(2)).unwrap();
        assert_eq!(next.revision, 2);
        assert_eq!(next.created_at, Timestamp(1));
    }
}
