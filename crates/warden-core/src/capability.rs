//! Capability sets as bitsets over the action catalogue's dense indices.
//!
//! Effective capabilities are on every hot path, so they are computed once
//! when an agent is registered and stored as a [`CapSet`]: a membership test
//! is one word load and a shift. A catalogue of up to 64 actions keeps the
//! word inside the set (no allocation, and no second cache miss after the
//! agent's node on a hierarchy too large for the cache).

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// A set of action indices (see the catalogue's `ActionIndex`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CapSet {
    words: SmallVec<[u64; 1]>,
}

impl CapSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A set holding every index in `indices`.
    pub fn from_indices(indices: impl IntoIterator<Item = u16>) -> Self {
        let mut set = Self::new();
        for i in indices {
            set.insert(i);
        }
        set
    }

    /// Add `index`.
    pub fn insert(&mut self, index: u16) {
        let word = usize::from(index / 64);
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        if let Some(w) = self.words.get_mut(word) {
            *w |= 1u64 << (index % 64);
        }
    }

    /// Remove `index`.
    pub fn remove(&mut self, index: u16) {
        if let Some(w) = self.words.get_mut(usize::from(index / 64)) {
            *w &= !(1u64 << (index % 64));
        }
    }

    /// Whether `index` is in the set.
    #[inline]
    pub fn contains(&self, index: u16) -> bool {
        self.words
            .get(usize::from(index / 64))
            .is_some_and(|w| (w >> (index % 64)) & 1 == 1)
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CapSet) -> CapSet {
        let words = self
            .words
            .iter()
            .zip(other.words.iter())
            .map(|(a, b)| a & b)
            .collect();
        let mut set = CapSet { words };
        set.trim();
        set
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &CapSet) -> CapSet {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, o) in words.iter_mut().zip(short.words.iter()) {
            *w |= o;
        }
        CapSet { words }
    }

    /// `self \ other`.
    pub fn difference(&self, other: &CapSet) -> CapSet {
        let words = self
            .words
            .iter()
            .enumerate()
            .map(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0))
            .collect();
        let mut set = CapSet { words };
        set.trim();
        set
    }

    /// Whether every member of `self` is in `other`.
    pub fn is_subset(&self, other: &CapSet) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// The members, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, w)| {
            (0..64u16).filter_map(move |b| {
                if (w >> b) & 1 == 1 {
                    u16::try_from(wi * 64).ok().map(|base| base + b)
                } else {
                    None
                }
            })
        })
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn basic_operations() {
        let a = CapSet::from_indices([0, 3, 64, 200]);
        let b = CapSet::from_indices([3, 200, 7]);
        assert!(a.contains(64));
        assert!(!a.contains(65));
        assert!(!a.contains(u16::MAX));
        assert_eq!(a.intersection(&b), CapSet::from_indices([3, 200]));
        assert_eq!(a.difference(&b), CapSet::from_indices([0, 64]));
        assert!(a.intersection(&b).is_subset(&a));
        assert_eq!(a.union(&b), CapSet::from_indices([0, 3, 7, 64, 200]));
        assert_eq!(CapSet::new().union(&b), b);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 3, 64, 200]);
    }

    proptest! {
        #[test]
        fn intersection_is_subset_of_both(
            a in proptest::collection::vec(0u16..300, 0..40),
            b in proptest::collection::vec(0u16..300, 0..40),
        ) {
            let (a, b) = (CapSet::from_indices(a), CapSet::from_indices(b));
            let i = a.intersection(&b);
            prop_assert!(i.is_subset(&a));
            prop_assert!(i.is_subset(&b));
            for x in i.iter() {
                prop_assert!(a.contains(x) && b.contains(x));
            }
        }
    }
}
