//! Capability sets as bitsets over the action catalogue's dense indices.
//!
//! Effective capabilities are on every hot path, so they are computed once
//! when an agent is registered and stored as a [`CapSet`]: a membership test
//! is one word load and a shift. A catalogue of up to 64 actions keeps the
//! word inside the set (no allocation, and no second cache miss after the
//! agent's node on a hierarchy too large for the cache).

use serde::{Deserialize, Serialize};

/// A set of action indices (see the catalogue's `ActionIndex`).
///
/// Sixteen bytes: the first 64 indices in a word held inline, larger sets
/// in a boxed slice of words. The form is canonical (no trailing zero
/// word; a set that fits one word is always held inline), so the derived
/// equality and hash compare sets, not representations. It serialises as
/// `{"words": [...]}`, the trailing zero words left out.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "Wire", from = "Wire")]
pub struct CapSet {
    words: Words,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Words {
    /// Indices 0..64 (0 for the empty set).
    One(u64),
    /// Two or more words, the last non-zero.
    Many(Box<[u64]>),
}

/// The serialised form.
#[derive(Serialize, Deserialize)]
struct Wire {
    words: Vec<u64>,
}

impl From<CapSet> for Wire {
    fn from(set: CapSet) -> Self {
        let words = match set.words {
            Words::One(0) => Vec::new(),
            Words::One(w) => vec![w],
            Words::Many(ws) => ws.into_vec(),
        };
        Wire { words }
    }
}

impl From<Wire> for CapSet {
    fn from(w: Wire) -> Self {
        CapSet::from_words(w.words)
    }
}

impl Default for CapSet {
    fn default() -> Self {
        Self::new()
    }
}

impl CapSet {
    /// The empty set.
    pub const fn new() -> Self {
        CapSet {
            words: Words::One(0),
        }
    }

    /// The canonical set of these words (trailing zeros dropped).
    fn from_words(mut words: Vec<u64>) -> Self {
        while words.last() == Some(&0) {
            words.pop();
        }
        let words = match words.as_slice() {
            [] => Words::One(0),
            [w] => Words::One(*w),
            _ => Words::Many(words.into_boxed_slice()),
        };
        CapSet { words }
    }

    #[inline]
    fn words(&self) -> &[u64] {
        match &self.words {
            Words::One(w) => std::slice::from_ref(w),
            Words::Many(ws) => ws,
        }
    }

    /// A set holding every index in `indices`.
    pub fn from_indices(indices: impl IntoIterator<Item = u16>) -> Self {
        // The first word (every index of a catalogue of up to 64 actions)
        // is gathered in a register; only higher indices touch the set.
        let mut first = 0u64;
        let mut set = Self::new();
        for i in indices {
            if i < 64 {
                first |= 1u64 << i;
            } else {
                set.insert(i);
            }
        }
        match &mut set.words {
            Words::One(w) => *w |= first,
            Words::Many(ws) => {
                if let Some(w) = ws.first_mut() {
                    *w |= first;
                }
            }
        }
        set
    }

    /// Add `index`.
    pub fn insert(&mut self, index: u16) {
        let word = usize::from(index / 64);
        let bit = 1u64 << (index % 64);
        match &mut self.words {
            Words::One(w) if word == 0 => *w |= bit,
            Words::Many(ws) if word < ws.len() => {
                if let Some(w) = ws.get_mut(word) {
                    *w |= bit;
                }
            }
            _ => {
                let mut ws = self.words().to_vec();
                ws.resize(word + 1, 0);
                if let Some(w) = ws.get_mut(word) {
                    *w |= bit;
                }
                *self = CapSet::from_words(ws);
            }
        }
    }

    /// Remove `index`.
    pub fn remove(&mut self, index: u16) {
        let word = usize::from(index / 64);
        let bit = 1u64 << (index % 64);
        match &mut self.words {
            Words::One(w) => {
                if word == 0 {
                    *w &= !bit;
                }
            }
            Words::Many(ws) => {
                if word < ws.len() {
                    let mut ws = ws.to_vec();
                    if let Some(w) = ws.get_mut(word) {
                        *w &= !bit;
                    }
                    *self = CapSet::from_words(ws);
                }
            }
        }
    }

    /// Whether `index` is in the set.
    #[inline]
    pub fn contains(&self, index: u16) -> bool {
        match &self.words {
            Words::One(w) => index < 64 && (w >> index) & 1 == 1,
            Words::Many(ws) => ws
                .get(usize::from(index / 64))
                .is_some_and(|w| (w >> (index % 64)) & 1 == 1),
        }
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CapSet) -> CapSet {
        if let (Words::One(a), Words::One(b)) = (&self.words, &other.words) {
            return CapSet {
                words: Words::One(a & b),
            };
        }
        CapSet::from_words(
            self.words()
                .iter()
                .zip(other.words())
                .map(|(a, b)| a & b)
                .collect(),
        )
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &CapSet) -> CapSet {
        if let (Words::One(a), Words::One(b)) = (&self.words, &other.words) {
            return CapSet {
                words: Words::One(a | b),
            };
        }
        let (long, short) = if self.words().len() >= other.words().len() {
            (self.words(), other.words())
        } else {
            (other.words(), self.words())
        };
        let mut words = long.to_vec();
        for (w, o) in words.iter_mut().zip(short) {
            *w |= o;
        }
        CapSet::from_words(words)
    }

    /// `self \ other`.
    pub fn difference(&self, other: &CapSet) -> CapSet {
        if let (Words::One(a), Words::One(b)) = (&self.words, &other.words) {
            return CapSet {
                words: Words::One(a & !b),
            };
        }
        let theirs = other.words();
        CapSet::from_words(
            self.words()
                .iter()
                .enumerate()
                .map(|(i, a)| a & !theirs.get(i).copied().unwrap_or(0))
                .collect(),
        )
    }

    /// Whether every member of `self` is in `other`.
    pub fn is_subset(&self, other: &CapSet) -> bool {
        let theirs = other.words();
        self.words()
            .iter()
            .enumerate()
            .all(|(i, a)| a & !theirs.get(i).copied().unwrap_or(0) == 0)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words == Words::One(0)
    }

    /// The members, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.words().iter().enumerate().flat_map(|(wi, w)| {
            (0..64u16).filter_map(move |b| {
                if (w >> b) & 1 == 1 {
                    u16::try_from(wi * 64).ok().map(|base| base + b)
                } else {
                    None
                }
            })
        })
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

    #[test]
    fn a_set_is_sixteen_bytes_and_serialises_as_its_words() {
        assert_eq!(std::mem::size_of::<CapSet>(), 16);
        let big = CapSet::from_indices([1, 130]);
        assert_eq!(serde_json::to_string(&big).unwrap(), r#"{"words":[2,0,4]}"#);
        assert_eq!(
            serde_json::to_string(&CapSet::from_indices([3])).unwrap(),
            r#"{"words":[8]}"#
        );
        assert_eq!(
            serde_json::to_string(&CapSet::new()).unwrap(),
            r#"{"words":[]}"#
        );
        // Trailing zero words in the input are dropped: one set, one form.
        let read: CapSet = serde_json::from_str(r#"{"words":[8,0,0]}"#).unwrap();
        assert_eq!(read, CapSet::from_indices([3]));
        let read: CapSet = serde_json::from_str(r#"{"words":[2,0,4]}"#).unwrap();
        assert_eq!(read, big);
    }

    #[test]
    fn removing_the_high_members_gives_the_one_word_form_back() {
        let mut a = CapSet::from_indices([5, 100]);
        a.remove(100);
        assert_eq!(a, CapSet::from_indices([5]));
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut g = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&a, &mut h);
        std::hash::Hash::hash(&CapSet::from_indices([5]), &mut g);
        assert_eq!(std::hash::Hasher::finish(&h), std::hash::Hasher::finish(&g));
        a.remove(5);
        assert!(a.is_empty());
        assert_eq!(a, CapSet::new());
    }

    fn model(v: &[u16]) -> std::collections::BTreeSet<u16> {
        v.iter().copied().collect()
    }

    proptest! {
        #[test]
        fn set_operations_agree_with_a_set_of_indices(
            a in proptest::collection::vec(0u16..300, 0..40),
            b in proptest::collection::vec(0u16..300, 0..40),
            gone in proptest::collection::vec(0u16..300, 0..10),
        ) {
            let (ma, mb) = (model(&a), model(&b));
            let (sa, sb) = (CapSet::from_indices(a.iter().copied()), CapSet::from_indices(b.iter().copied()));
            let as_model = |s: &CapSet| s.iter().collect::<std::collections::BTreeSet<u16>>();
            prop_assert_eq!(as_model(&sa), ma.clone());
            prop_assert_eq!(as_model(&sa.union(&sb)), ma.union(&mb).copied().collect());
            prop_assert_eq!(as_model(&sa.intersection(&sb)), ma.intersection(&mb).copied().collect());
            prop_assert_eq!(as_model(&sa.difference(&sb)), ma.difference(&mb).copied().collect());
            prop_assert_eq!(sa.is_subset(&sb), ma.is_subset(&mb));
            prop_assert_eq!(sa.is_empty(), ma.is_empty());
            for x in 0u16..320 {
                prop_assert_eq!(sa.contains(x), ma.contains(&x));
            }
            // Equal sets are equal values, however they were built.
            let mut removed = sa.clone();
            let mut mr = ma.clone();
            for g in &gone {
                removed.remove(*g);
                mr.remove(g);
            }
            prop_assert_eq!(&removed, &CapSet::from_indices(mr.iter().copied()));
            let back: CapSet = serde_json::from_str(&serde_json::to_string(&removed).unwrap()).unwrap();
            prop_assert_eq!(back, removed);
        }

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
