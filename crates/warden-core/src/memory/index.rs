//! An in-memory index of records, for allocation-free lookups.

use super::MemoryRecord;
use std::hash::BuildHasher as _;

use hashbrown::hash_table::{self, HashTable};

use crate::FastMap as HashMap;
use crate::ids::{AgentId, Key, Namespace};

/// An in-memory index of records: `(namespace, key) → records by owner`.
///
/// Lookups borrow `&str`, so resolving allocates nothing. The owners of one
/// key are kept in a short vector while there are few of them and in a hash
/// map once there are many. A resolve ([`resolve_in`](super::resolve_in))
/// costs one lookup of the namespace and key together (one table, so a
/// cold key costs its table slot and its entry, not a namespace's table
/// and then the key's), then, whatever the total number of records, either
/// one hierarchy lookup per record at the key (while there are few) or one
/// cheap owner lookup per lineage level.
#[derive(Clone, Default)]
pub struct MemoryIndex {
    by_key: HashTable<Entry>,
    state: foldhash::fast::RandomState,
    len: usize,
}

/// One `namespace.key` and its records.
#[derive(Debug, Clone)]
struct Entry {
    namespace: Namespace,
    key: Key,
    slot: Slot,
}

impl std::fmt::Debug for MemoryIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryIndex")
            .field("keys", &self.by_key.len())
            .field("len", &self.len)
            .finish()
    }
}

/// The hash of a `namespace.key` pair (each part's length is hashed with
/// it, so `("a", "bc")` and `("ab", "c")` differ).
#[inline]
fn hash_of(state: &foldhash::fast::RandomState, namespace: &str, key: &str) -> u64 {
    state.hash_one((namespace, key))
}

/// Owners of one key: a vector up to [`SLOT_SCAN_LIMIT`] entries, a map above.
#[derive(Debug, Clone)]
enum Slot {
    Few(Vec<MemoryRecord>),
    Many(HashMap<AgentId, MemoryRecord>),
}

/// How many owners of one key are scanned linearly before switching to a map.
pub(super) const SLOT_SCAN_LIMIT: usize = 16;

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
    /// [`resolve_in(hierarchy, reader, view, now)`](super::resolve_in), or
    /// along any lineage with
    /// `resolve_bounded(reader, lineage, |o| view.get(o.as_str()), now, view.len())`.
    #[inline]
    pub fn view(&self, namespace: &str, key: &str) -> KeyView<'_> {
        let hash = hash_of(&self.state, namespace, key);
        KeyView(
            self.by_key
                .find(hash, |e| {
                    e.key.as_str() == key && e.namespace.as_str() == namespace
                })
                .map(|e| &e.slot),
        )
    }

    /// The record `owner` holds at `namespace.key`.
    pub fn get(&self, owner: &str, namespace: &str, key: &str) -> Option<&MemoryRecord> {
        self.view(namespace, key).get(owner)
    }

    /// Insert or replace `record` (by owner, namespace and key).
    pub fn insert(&mut self, record: MemoryRecord) {
        let state = &self.state;
        let (namespace, key) = (record.namespace.as_str(), record.key.as_str());
        let entry = self.by_key.entry(
            hash_of(state, namespace, key),
            |e| e.key.as_str() == key && e.namespace.as_str() == namespace,
            |e| hash_of(state, e.namespace.as_str(), e.key.as_str()),
        );
        let slot = match entry {
            hash_table::Entry::Occupied(o) => &mut o.into_mut().slot,
            hash_table::Entry::Vacant(v) => {
                &mut v
                    .insert(Entry {
                        namespace: record.namespace.clone(),
                        key: record.key.clone(),
                        slot: Slot::Few(Vec::new()),
                    })
                    .into_mut()
                    .slot
            }
        };
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
        let hash = hash_of(&self.state, namespace, key);
        let slot = &mut self
            .by_key
            .find_mut(hash, |e| {
                e.key.as_str() == key && e.namespace.as_str() == namespace
            })?
            .slot;
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
        self.by_key
            .iter()
            .flat_map(|e| KeyView(Some(&e.slot)).iter())
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
    /// [`resolve_bounded`](super::resolve_bounded).
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

    /// Every record the key holds, in no particular order (no allocation).
    #[inline]
    pub fn iter(&self) -> KeyRecords<'a> {
        KeyRecords(match self.0 {
            None => Records::Few([].iter()),
            Some(Slot::Few(v)) => Records::Few(v.iter()),
            Some(Slot::Many(m)) => Records::Many(m.values()),
        })
    }
}

impl<'a> IntoIterator for KeyView<'a> {
    type Item = &'a MemoryRecord;
    type IntoIter = KeyRecords<'a>;

    fn into_iter(self) -> KeyRecords<'a> {
        self.iter()
    }
}

/// The records of one key ([`KeyView::iter`]), in no particular order.
#[derive(Debug, Clone)]
pub struct KeyRecords<'a>(Records<'a>);

#[derive(Debug, Clone)]
enum Records<'a> {
    Few(std::slice::Iter<'a, MemoryRecord>),
    Many(std::collections::hash_map::Values<'a, AgentId, MemoryRecord>),
}

impl<'a> Iterator for KeyRecords<'a> {
    type Item = &'a MemoryRecord;

    #[inline]
    fn next(&mut self) -> Option<&'a MemoryRecord> {
        match &mut self.0 {
            Records::Few(it) => it.next(),
            Records::Many(it) => it.next(),
        }
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            Records::Few(it) => it.size_hint(),
            Records::Many(it) => it.size_hint(),
        }
    }
}

impl ExactSizeIterator for KeyRecords<'_> {}
