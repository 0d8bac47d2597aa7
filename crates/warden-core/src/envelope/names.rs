//! A small open-addressing index from names to values.
//!
//! Policies have at most a few hundred labels, restrictions, tags and action
//! names; looking one up must cost a hash and one comparison, not a binary
//! search of string comparisons, because every fold and decision does it
//! once per label or tag.

/// A fast hash for short names: eight bytes at a time (FxHash-style
/// multiply-rotate), seeded with the length. Not DoS-resistant, and it need
/// not be: the keys are the policy's own names, fixed at compile time, and a
/// lookup probes at most the table's size.
fn hash(s: &str) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = (s.len() as u64).wrapping_mul(K);
    for chunk in s.as_bytes().chunks(8) {
        // Whole chunks in one load; the tail assembled in a register (byte
        // stores to a buffer followed by a word load would stall on
        // store forwarding).
        let word = match <[u8; 8]>::try_from(chunk) {
            Ok(bytes) => u64::from_le_bytes(bytes),
            Err(_) => chunk
                .iter()
                .enumerate()
                .fold(0u64, |w, (i, b)| w | (u64::from(*b) << (8 * i))),
        };
        h = (h.rotate_left(5) ^ word).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

#[derive(Debug, Clone)]
struct Slot<V> {
    hash: u64,
    key: Box<str>,
    value: V,
}

/// Name → value, built once, read on the hot path.
#[derive(Debug, Clone)]
pub(crate) struct NameIndex<V> {
    slots: Vec<Option<Slot<V>>>,
    mask: usize,
}

impl<V: Copy> NameIndex<V> {
    /// An index over `entries` (later duplicates are ignored).
    pub(crate) fn new<'a>(entries: impl IntoIterator<Item = (&'a str, V)>) -> Self {
        let entries: Vec<(&str, V)> = entries.into_iter().collect();
        // At most half full, so probes stay short and an empty slot exists.
        let size = (entries.len() * 2).max(4).next_power_of_two();
        let mut index = Self {
            slots: (0..size).map(|_| None).collect(),
            mask: size - 1,
        };
        for (key, value) in entries {
            index.insert(key, value);
        }
        index
    }

    fn insert(&mut self, key: &str, value: V) {
        let hash = hash(key);
        let mut i = (hash as usize) & self.mask;
        for _ in 0..self.slots.len() {
            match self.slots.get_mut(i) {
                Some(slot @ None) => {
                    *slot = Some(Slot {
                        hash,
                        key: key.into(),
                        value,
                    });
                    return;
                }
                Some(Some(s)) if s.hash == hash && *s.key == *key => return,
                _ => i = (i + 1) & self.mask,
            }
        }
    }

    /// The value of `key`.
    #[inline]
    pub(crate) fn get(&self, key: &str) -> Option<V> {
        let hash = hash(key);
        let mut i = (hash as usize) & self.mask;
        for _ in 0..self.slots.len() {
            match self.slots.get(i)? {
                None => return None,
                Some(s) if s.hash == hash && *s.key == *key => return Some(s.value),
                Some(_) => i = (i + 1) & self.mask,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_key_and_nothing_else() {
        let keys: Vec<String> = (0..300).map(|i| format!("label-{i}")).collect();
        let idx = NameIndex::new(keys.iter().enumerate().map(|(i, k)| (k.as_str(), i)));
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(idx.get(k), Some(i));
        }
        assert_eq!(idx.get("label-300"), None);
        assert_eq!(idx.get(""), None);
        let empty = NameIndex::<u8>::new([]);
        assert_eq!(empty.get("x"), None);
        let dup = NameIndex::new([("a", 1), ("a", 2)]);
        assert_eq!(dup.get("a"), Some(1));
    }
}
