//! An in-memory index of records, for allocation-free lookups.

use super::MemoryRecord;
use crate::FastMap as HashMap;
use crate::ids::{AgentId, Key, Namespace};

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
}
