//! Action names to catalogue positions, for the lookup every preflight step,
//! every call and every registration's declared capability makes.
//!
//! A name of at most 16 bytes (almost every action name) is held as three
//! words that *are* the name: its length, its first eight bytes and its
//! last eight bytes, zero-padded. Two such names are equal exactly when
//! their words are (the two windows cover every byte, the length tells the
//! padding apart), so a lookup loads the name's words, mixes them into a
//! slot and compares three words: no hashing of the bytes one by one, no
//! call to compare strings. Longer names go through a hash map.

use crate::FastMap as HashMap;

use super::ActionIndex;

/// Longest name held as words.
const SHORT: usize = 16;

/// A name of at most [`SHORT`] bytes, as words equal exactly when the names
/// are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Words {
    len: u64,
    head: u64,
    tail: u64,
}

/// An empty slot's `len` (no name is that long).
const EMPTY: u64 = u64::MAX;

/// Up to eight bytes, little-endian, zero-padded: at most two loads, which
/// overlap for lengths that are not a power of two (an overlapping byte is
/// the same byte in both, so or-ing them changes nothing).
#[inline]
fn word(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    let le4 = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, |b| u64::from(u32::from_le_bytes(b)))
    };
    let byte = |at: usize| bytes.get(at).map_or(0, |b| u64::from(*b));
    match n {
        8.. => bytes
            .get(..8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_le_bytes),
        4..=7 => le4(0) | (le4(n - 4) << (8 * (n - 4))),
        1..=3 => byte(0) | (byte(n / 2) << (8 * (n / 2))) | (byte(n - 1) << (8 * (n - 1))),
        0 => 0,
    }
}

/// The words of `name`, if it is short.
#[inline]
fn words(name: &[u8]) -> Option<Words> {
    let len = name.len();
    if len > SHORT {
        return None;
    }
    let (head, tail) = if len <= 8 {
        (word(name), 0)
    } else {
        (word(name.get(..8)?), word(name.get(len - 8..)?))
    };
    Some(Words {
        len: len as u64,
        head,
        tail,
    })
}

/// A slot for `w` in a table of `mask + 1` slots.
#[inline]
fn slot_of(w: &Words, mask: usize) -> usize {
    let mixed = (w.head ^ w.tail.rotate_left(29) ^ w.len.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    // The high bits are the best mixed.
    (mixed >> 32) as usize & mask
}

/// The lookup from an action's name to its position.
#[derive(Debug, Clone)]
pub(super) struct NameTable {
    /// Open addressing, linear probing, at most half full (so a lookup
    /// that misses meets an empty slot soon).
    slots: Box<[(Words, ActionIndex)]>,
    mask: usize,
    /// Names longer than [`SHORT`] bytes.
    long: HashMap<Box<str>, ActionIndex>,
}

impl NameTable {
    /// The table of `names` (distinct).
    pub(super) fn new<'a>(names: impl ExactSizeIterator<Item = (&'a str, ActionIndex)>) -> Self {
        let size = (2 * names.len()).next_power_of_two().max(8);
        let empty = Words {
            len: EMPTY,
            head: 0,
            tail: 0,
        };
        let mut slots = vec![(empty, ActionIndex(0)); size].into_boxed_slice();
        let mask = size - 1;
        let mut long = HashMap::default();
        for (name, idx) in names {
            let Some(w) = words(name.as_bytes()) else {
                long.insert(Box::from(name), idx);
                continue;
            };
            let mut at = slot_of(&w, mask);
            while let Some(slot) = slots.get_mut(at) {
                if slot.0.len == EMPTY || slot.0 == w {
                    *slot = (w, idx);
                    break;
                }
                at = (at + 1) & mask;
            }
        }
        Self { slots, mask, long }
    }

    /// The position of the action called `name`.
    #[inline]
    pub(super) fn get(&self, name: &str) -> Option<ActionIndex> {
        let Some(w) = words(name.as_bytes()) else {
            return self.long.get(name).copied();
        };
        let mut at = slot_of(&w, self.mask);
        loop {
            let (key, idx) = self.slots.get(at)?;
            if *key == w {
                return Some(*idx);
            }
            if key.len == EMPTY {
                return None;
            }
            at = (at + 1) & self.mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn table(names: &[String]) -> (NameTable, BTreeMap<String, ActionIndex>) {
        let model: BTreeMap<String, ActionIndex> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), ActionIndex(u16::try_from(i).unwrap())))
            .collect();
        let t = NameTable::new(model.iter().map(|(n, i)| (n.as_str(), *i)));
        (t, model)
    }

    #[test]
    fn names_that_share_windows_stay_apart() {
        // Same first and last eight bytes, other lengths or middles; the
        // padding of short names; 16 and 17 bytes either side of the cut.
        let names: Vec<String> = [
            "abcdefgh.ijklmnop",
            "abcdefghijklmnop",
            "abcdefgh",
            "abcdefg",
            "abcdefghXbcdefgh",
            "abcdefghabcdefgh",
            "abcdefgh1abcdefgh",
            "a",
            "",
            "memory.read",
            "memory.write",
            "crm.lookup",
        ]
        .map(String::from)
        .to_vec();
        let (t, model) = table(&names);
        for (n, i) in &model {
            assert_eq!(t.get(n), Some(*i), "{n}");
        }
        for absent in [
            "abcdefgh.ijklmno",
            "abcdefghi",
            "b",
            "memory.reae",
            "abcdefghXbcdefgi",
        ] {
            assert_eq!(t.get(absent), None, "{absent}");
        }
    }

    proptest! {
        /// A word is the bytes zero-padded, whatever the length.
        #[test]
        fn a_word_is_its_bytes_zero_padded(bytes in proptest::collection::vec(any::<u8>(), 0..=8)) {
            let mut padded = [0u8; 8];
            padded[..bytes.len()].copy_from_slice(&bytes);
            prop_assert_eq!(word(&bytes), u64::from_le_bytes(padded));
        }

        /// The table answers like a map of the names, for the names, their
        /// cuts and variants, and arbitrary other names.
        #[test]
        fn the_table_answers_like_a_map(
            names in proptest::collection::btree_set("[a-c.]{0,20}", 0..60),
            others in proptest::collection::vec("[a-c.]{0,20}", 0..60),
        ) {
            let names: Vec<String> = names.into_iter().collect();
            let (t, model) = table(&names);
            let mut queries = others;
            for n in &names {
                queries.push(n.clone());
                queries.push(format!("{n}a"));
                if let Some((_, rest)) = n.split_at_checked(1) {
                    queries.push(rest.to_owned());
                }
            }
            for q in &queries {
                prop_assert_eq!(t.get(q), model.get(q).copied(), "{}", q);
            }
        }
    }
}
