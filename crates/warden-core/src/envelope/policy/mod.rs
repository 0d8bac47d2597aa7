//! The `context:` section of the policy bundle and its compiled form.
//!
//! [`ContextPolicySpec`] is the raw section as authored (serde + JSON Schema,
//! unknown fields rejected). [`ContextPolicy::compile`] checks every reference
//! and interns labels, restrictions and rules to small indices so that
//! accumulation and decisions run on bitsets (see the module docs of
//! [`crate::envelope`] for the semantics).

mod compile;
mod error;
mod sensitivity;
mod spec;
mod vocab;

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;

pub use error::ContextPolicyError;
pub use sensitivity::Sensitivity;
pub use spec::{
    AggregationRuleSpec, BackstopSpec, BackstopVerdict, ContextPolicySpec, DelegationScope,
    NO_EXTERNAL_DELEGATION, NO_EXTERNAL_EXPORT, NO_MEMORY_WRITE, RestrictionSpec,
    RestrictionVerdict, TAG_EXPORT, TAG_EXTERNAL, TrustZone,
};
pub use vocab::NameSet;
pub(crate) use vocab::Vocab;

use super::bits::{LabelBits, RestrictionBits, RuleBits};
use super::names::NameIndex;
use crate::ids::{AgentId, Label};
use crate::provenance::OriginSet;

#[derive(Debug, Clone)]
struct CompiledRule {
    need: LabelBits,
    sensitivity: Sensitivity,
    derived: LabelBits,
    restrict: RestrictionBits,
}

#[derive(Debug, Clone, Copy)]
struct CompiledBackstop {
    min_labels: usize,
    counted: LabelBits,
    verdict: BackstopVerdict,
}

/// The result of applying every rule the labels trigger (to a fixpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closure {
    pub(crate) labels: LabelBits,
    pub(crate) derived: LabelBits,
    pub(crate) sensitivity: Sensitivity,
    pub(crate) restrictions: RestrictionBits,
    pub(crate) rules: RuleBits,
}

/// A compiled, validated `context:` section. Cheap to share (`Arc` it);
/// every envelope operation takes it by reference.
#[derive(Debug, Clone)]
pub struct ContextPolicy {
    vocab: Arc<Vocab>,
    /// Identifies the policy's whole content (not just its vocabulary): an
    /// envelope built by this policy's closure records it, so decisions can
    /// skip re-projecting it. 0 means "never cache".
    closure_id: u64,
    /// Labels by exact base sensitivity, lowest level first.
    level_masks: [LabelBits; 5],
    rules: Vec<CompiledRule>,
    /// Whether some rule needs a label another rule derives (then the
    /// closure iterates to a fixpoint; otherwise one pass suffices).
    chaining: bool,
    backstop: Option<CompiledBackstop>,
    inherit_threshold: Sensitivity,
    restricted_floor: Sensitivity,
    /// Tag -> restrictions denying it.
    by_tag: NameIndex<RestrictionBits>,
    /// Action name -> restrictions denying it.
    by_action: NameIndex<RestrictionBits>,
    /// Restrictions whose verdict is `escalate`.
    escalating: RestrictionBits,
    /// Restrictions applied by origin, with the origins they name.
    conditional: Vec<(usize, OriginSet)>,
    /// The restrictions of `conditional`.
    conditional_bits: RestrictionBits,
    /// Restrictions denying external delegation (`external` or `all`).
    deny_external_delegation: RestrictionBits,
    /// Restrictions denying every delegation (`all`).
    deny_all_delegation: RestrictionBits,
    declassifiers: BTreeSet<AgentId>,
}

impl ContextPolicy {
    /// The most labels (declared and derived) a policy may have.
    pub const MAX_LABELS: usize = LabelBits::CAPACITY;
    /// The most restrictions (built-in and declared) a policy may have.
    pub const MAX_RESTRICTIONS: usize = RestrictionBits::CAPACITY;
    /// The most aggregation rules a policy may have.
    pub const MAX_RULES: usize = RuleBits::CAPACITY;

    /// Hex sha256 of the policy's vocabulary (labels, restrictions, rule
    /// names). Envelopes built under one vocabulary are only used with a
    /// policy of the same fingerprint; [`Envelope::restore`] rebinds them.
    ///
    /// [`Envelope::restore`]: super::Envelope::restore
    pub fn vocabulary_fingerprint(&self) -> String {
        hex::encode(self.vocab.fingerprint)
    }

    /// The base sensitivity of a label (declared or derived), if known.
    pub fn base_sensitivity(&self, label: &str) -> Option<Sensitivity> {
        let i = self.vocab.label_index(label)?;
        Sensitivity::ALL
            .iter()
            .zip(self.level_masks.iter())
            .find(|(_, m)| m.contains(i))
            .map(|(s, _)| *s)
    }

    /// Every known label (declared and derived), in name order.
    pub fn labels(&self) -> impl Iterator<Item = &Label> {
        self.vocab.labels.iter()
    }

    /// Every known restriction (built-in and declared), in name order.
    pub fn restrictions(&self) -> impl Iterator<Item = &Label> {
        self.vocab.restrictions.iter()
    }

    /// Rule names, in declaration order.
    pub fn rules(&self) -> impl Iterator<Item = &Label> {
        self.vocab.rules.iter()
    }

    /// The conservative-inference threshold.
    pub fn inherit_threshold(&self) -> Sensitivity {
        self.inherit_threshold
    }

    /// The floor for `export`/`external` flows.
    pub fn restricted_floor(&self) -> Sensitivity {
        self.restricted_floor
    }

    /// Whether `agent` may declassify.
    pub fn is_declassifier(&self, agent: &AgentId) -> bool {
        self.declassifiers.contains(agent)
    }

    // -- crate-internal hot path -------------------------------------------

    pub(crate) fn vocab(&self) -> &Arc<Vocab> {
        &self.vocab
    }

    /// See the field; 0 is never a valid cache key.
    pub(crate) fn closure_id(&self) -> u64 {
        self.closure_id
    }

    /// The highest base sensitivity among `labels`.
    #[inline]
    pub(crate) fn max_base(&self, labels: LabelBits) -> Sensitivity {
        Sensitivity::ALL
            .iter()
            .zip(self.level_masks.iter())
            .rev()
            .find(|(_, m)| !labels.intersect(**m).is_empty())
            .map_or(Sensitivity::Public, |(s, _)| *s)
    }

    /// Apply every rule the labels trigger, to a fixpoint. Monotone: the
    /// result is never below the inputs.
    #[inline]
    pub(crate) fn close(
        &self,
        labels: LabelBits,
        derived: LabelBits,
        sensitivity: Sensitivity,
        restrictions: RestrictionBits,
    ) -> Closure {
        let mut derived = derived;
        let mut sensitivity = sensitivity;
        let mut restrictions = restrictions;
        let mut applied = RuleBits::EMPTY;
        loop {
            let present = labels.union(derived);
            let mut grew = false;
            for (i, rule) in self.rules.iter().enumerate() {
                if applied.contains(i) || !rule.need.is_subset(&present) {
                    continue;
                }
                applied.insert(i);
                sensitivity = sensitivity.max(rule.sensitivity);
                restrictions = restrictions.union(rule.restrict);
                let next = derived.union(rule.derived);
                grew |= next != derived;
                derived = next;
            }
            if !(self.chaining && grew) {
                break;
            }
        }
        Closure {
            labels,
            derived,
            sensitivity: sensitivity.max(self.max_base(labels.union(derived))),
            restrictions,
            rules: applied,
        }
    }

    /// The level `labels` imply on their own (their bases and the rules they
    /// trigger alone), given `fired`: the rules that fire on a superset.
    /// Rules are monotone, so only those can fire on the subset.
    #[inline]
    pub(crate) fn own_level(&self, labels: LabelBits, fired: RuleBits) -> Sensitivity {
        if fired.is_empty() {
            return self.max_base(labels);
        }
        if self.chaining {
            return self
                .close(
                    labels,
                    LabelBits::EMPTY,
                    Sensitivity::Public,
                    RestrictionBits::EMPTY,
                )
                .sensitivity;
        }
        fired
            .iter()
            .filter_map(|i| self.rules.get(i))
            .filter(|r| r.need.is_subset(&labels))
            .fold(self.max_base(labels), |acc, r| {
                acc.max(r.sensitivity).max(self.max_base(r.derived))
            })
    }

    /// The backstop's verdict if it fires on `c`.
    #[inline]
    pub(crate) fn backstop(&self, c: &Closure) -> Option<BackstopVerdict> {
        let b = self.backstop?;
        let counted = c.labels.union(c.derived).intersect(b.counted).len();
        (c.rules.is_empty() && counted >= b.min_labels).then_some(b.verdict)
    }

    /// Restrictions that deny an action with this name and these tags.
    #[inline]
    pub(crate) fn denying_action(&self, name: &str, tags: &[Label]) -> RestrictionBits {
        tags.iter()
            .fold(self.by_action.get(name).unwrap_or_default(), |acc, t| {
                acc.union(self.by_tag.get(t.as_str()).unwrap_or_default())
            })
    }

    /// Restrictions whose verdict is `escalate`.
    pub(crate) fn escalating(&self) -> RestrictionBits {
        self.escalating
    }

    /// Restrictions applied by origin, with the origins each names.
    pub(crate) fn conditional(&self) -> &[(usize, OriginSet)] {
        &self.conditional
    }

    /// Restrictions that do not always deny what they cover: escalating
    /// ones and those applied by origin.
    pub(crate) fn not_always_denying(&self) -> RestrictionBits {
        self.conditional_bits.union(self.escalating)
    }

    /// Whether some restriction is applied by origin (then a call's
    /// argument origins matter to the envelope).
    pub fn has_conditional_restrictions(&self) -> bool {
        !self.conditional.is_empty()
    }

    /// Restrictions that deny a delegation into `zone`.
    pub(crate) fn denying_delegation(&self, zone: TrustZone) -> RestrictionBits {
        match zone {
            TrustZone::Internal => self.deny_all_delegation,
            TrustZone::External => self.deny_external_delegation,
        }
    }

    /// Resolve label names; the unknown ones are returned as the error.
    #[inline]
    pub(crate) fn resolve_labels<'a>(
        &self,
        lists: impl IntoIterator<Item = &'a Label>,
    ) -> Result<LabelBits, Vec<Label>> {
        let mut bits = LabelBits::EMPTY;
        let mut unknown = Vec::new();
        for l in lists {
            match self.vocab.label_index(l.as_str()) {
                Some(i) => bits.insert(i),
                None if !unknown.contains(l) => unknown.push(l.clone()),
                None => {}
            }
        }
        if unknown.is_empty() {
            Ok(bits)
        } else {
            Err(unknown)
        }
    }

    /// Resolve restriction names; the unknown ones are returned as the error.
    pub(crate) fn resolve_restrictions<'a>(
        &self,
        names: impl IntoIterator<Item = &'a Label>,
    ) -> Result<RestrictionBits, Vec<Label>> {
        let mut bits = RestrictionBits::EMPTY;
        let mut unknown = Vec::new();
        for r in names {
            match self.vocab.restriction_index(r.as_str()) {
                Some(i) => bits.insert(i),
                None if !unknown.contains(r) => unknown.push(r.clone()),
                None => {}
            }
        }
        if unknown.is_empty() {
            Ok(bits)
        } else {
            Err(unknown)
        }
    }
}
