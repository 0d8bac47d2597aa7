//! Fixed-width bitsets over interned indices.
//!
//! A compiled [`ContextPolicy`](super::ContextPolicy) interns labels,
//! restrictions and rules to small indices, so every set the hot path touches
//! (an envelope's labels, a rule's combination, the restrictions denying an
//! action) is a `Copy` array of words: union, subset and intersection are a
//! few instructions and never allocate.

/// A set of indices below `64 * W`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Bits<const W: usize>([u64; W]);

/// Labels (observed and derived): at most 128 per policy.
pub(crate) type LabelBits = Bits<2>;
/// Restrictions, built-in and declared: at most 64 per policy.
pub(crate) type RestrictionBits = Bits<1>;
/// Aggregation rules: at most 64 per policy.
pub(crate) type RuleBits = Bits<1>;
/// The widest of the above, for views over any of them.
pub(crate) type AnyBits = Bits<2>;

impl<const W: usize> Bits<W> {
    /// How many indices fit.
    pub(crate) const CAPACITY: usize = 64 * W;

    /// The empty set.
    pub(crate) const EMPTY: Self = Self([0; W]);

    /// Add `i`; indices at or above [`Self::CAPACITY`] are ignored (the policy
    /// compiler never hands them out).
    pub(crate) fn insert(&mut self, i: usize) {
        if let Some(word) = self.0.get_mut(i / 64) {
            *word |= 1 << (i % 64);
        }
    }

    /// Whether `i` is in the set.
    pub(crate) fn contains(&self, i: usize) -> bool {
        self.0
            .get(i / 64)
            .is_some_and(|word| word & (1 << (i % 64)) != 0)
    }

    /// `self ∪ other`.
    pub(crate) fn union(mut self, other: Self) -> Self {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
        self
    }

    /// `self ∩ other`.
    pub(crate) fn intersect(mut self, other: Self) -> Self {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a &= b;
        }
        self
    }

    /// `self \ other`.
    pub(crate) fn minus(mut self, other: Self) -> Self {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a &= !b;
        }
        self
    }

    /// `self ⊆ other`.
    pub(crate) fn is_subset(&self, other: &Self) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a & !b == 0)
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// Number of members.
    pub(crate) fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The smallest member.
    pub(crate) fn first(&self) -> Option<usize> {
        self.iter().next()
    }

    /// Members in ascending order.
    pub(crate) fn iter(self) -> BitsIter<W> {
        BitsIter {
            bits: self,
            word: 0,
        }
    }

    /// The same members in a wider (or equal) set.
    pub(crate) fn widen<const V: usize>(self) -> Bits<V> {
        let mut out = Bits::<V>::EMPTY;
        for (a, b) in out.0.iter_mut().zip(self.0) {
            *a = b;
        }
        out
    }
}

impl<const W: usize> Default for Bits<W> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<const W: usize> std::fmt::Debug for Bits<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Ascending iterator over a [`Bits`].
pub(crate) struct BitsIter<const W: usize> {
    bits: Bits<W>,
    word: usize,
}

impl<const W: usize> Iterator for BitsIter<W> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while let Some(w) = self.bits.0.get_mut(self.word) {
            if *w != 0 {
                let bit = w.trailing_zeros() as usize;
                *w &= *w - 1;
                return Some(self.word * 64 + bit);
            }
            self.word += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let mut a = LabelBits::EMPTY;
        a.insert(0);
        a.insert(70);
        a.insert(127);
        a.insert(128); // ignored: out of range
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 70, 127]);
        assert_eq!(a.len(), 3);
        let mut b = LabelBits::EMPTY;
        b.insert(70);
        assert!(b.is_subset(&a));
        assert!(!a.is_subset(&b));
        assert_eq!(a.minus(b).iter().collect::<Vec<_>>(), vec![0, 127]);
        assert_eq!(a.intersect(b), b);
        assert_eq!(b.union(a), a);
        assert_eq!(a.first(), Some(0));
        assert_eq!(b.first(), Some(70));
        assert!(LabelBits::EMPTY.is_empty());
        let r: RestrictionBits = {
            let mut r = RestrictionBits::EMPTY;
            r.insert(63);
            r
        };
        assert_eq!(r.widen::<2>().iter().collect::<Vec<_>>(), vec![63]);
    }
}
