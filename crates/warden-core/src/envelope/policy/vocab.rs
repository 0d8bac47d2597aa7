//! The names behind a compiled policy's indices, and sets of them.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::super::bits::{AnyBits, LabelBits, RestrictionBits, RuleBits};
use super::super::names::NameIndex;
use crate::ids::Label;

/// The names behind a compiled policy's indices. Envelopes, transitions and
/// decisions share it (behind an `Arc`) so they can name their bitsets
/// without copying strings; two vocabularies with the same fingerprint
/// assign the same meaning to every index.
#[derive(Debug)]
pub(crate) struct Vocab {
    /// Every label (declared and derived), sorted: index = position.
    pub(crate) labels: Vec<Label>,
    /// Every restriction (built-in and declared), sorted.
    pub(crate) restrictions: Vec<Label>,
    /// Rule names in declaration order.
    pub(crate) rules: Vec<Label>,
    /// sha256 over the three lists.
    pub(crate) fingerprint: [u8; 32],
    label_index: NameIndex<usize>,
    restriction_index: NameIndex<usize>,
}

impl Vocab {
    pub(super) fn new(labels: Vec<Label>, restrictions: Vec<Label>, rules: Vec<Label>) -> Self {
        let mut h = Sha256::new();
        h.update(b"warden.context-vocabulary.v1");
        for (tag, list) in [(b'L', &labels), (b'R', &restrictions), (b'A', &rules)] {
            h.update([tag]);
            h.update((list.len() as u64).to_be_bytes());
            for name in list {
                h.update((name.as_str().len() as u64).to_be_bytes());
                h.update(name.as_str().as_bytes());
            }
        }
        Self {
            label_index: NameIndex::new(labels.iter().enumerate().map(|(i, l)| (l.as_str(), i))),
            restriction_index: NameIndex::new(
                restrictions
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.as_str(), i)),
            ),
            labels,
            restrictions,
            rules,
            fingerprint: h.finalize().into(),
        }
    }

    /// Whether two vocabularies give every index the same meaning.
    pub(crate) fn same(a: &Arc<Vocab>, b: &Arc<Vocab>) -> bool {
        Arc::ptr_eq(a, b) || a.fingerprint == b.fingerprint
    }

    pub(crate) fn label_index(&self, name: &str) -> Option<usize> {
        self.label_index.get(name)
    }

    pub(crate) fn restriction_index(&self, name: &str) -> Option<usize> {
        self.restriction_index.get(name)
    }

    pub(crate) fn label_names(&self, bits: LabelBits) -> NameSet<'_> {
        NameSet::new(&self.labels, bits)
    }

    pub(crate) fn restriction_names(&self, bits: RestrictionBits) -> NameSet<'_> {
        NameSet::new(&self.restrictions, bits.widen())
    }

    pub(crate) fn rule_names(&self, bits: RuleBits) -> NameSet<'_> {
        NameSet::new(&self.rules, bits.widen())
    }
}

impl PartialEq for Vocab {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl Eq for Vocab {}

/// A borrowed, ordered view of a set of names (labels, restrictions or rule
/// names) held by an envelope, transition or decision. Labels and
/// restrictions iterate in name order, rules in declaration order.
#[derive(Clone, Copy)]
pub struct NameSet<'a> {
    names: &'a [Label],
    bits: AnyBits,
}

impl<'a> NameSet<'a> {
    fn new(names: &'a [Label], bits: AnyBits) -> Self {
        Self { names, bits }
    }

    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a Label> + 'a {
        let names = self.names;
        self.bits.iter().filter_map(move |i| names.get(i))
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.bits.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    /// Whether `name` is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.names
            .iter()
            .position(|n| n.as_str() == name)
            .is_some_and(|i| self.bits.contains(i))
    }

    /// The names as an owned vector.
    pub fn to_vec(&self) -> Vec<Label> {
        self.iter().cloned().collect()
    }
}

impl fmt::Debug for NameSet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(Label::as_str))
            .finish()
    }
}

impl PartialEq for NameSet<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Serialize for NameSet<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}
