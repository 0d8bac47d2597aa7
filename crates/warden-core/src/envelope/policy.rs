//! The `context:` section of the policy bundle and its compiled form.
//!
//! [`ContextPolicySpec`] is the raw section as authored (serde + JSON Schema,
//! unknown fields rejected). [`ContextPolicy::compile`] checks every reference
//! and interns labels, restrictions and rules to small indices so that
//! accumulation and decisions run on bitsets (see the module docs of
//! [`crate::envelope`] for the semantics).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::bits::{AnyBits, LabelBits, RestrictionBits, RuleBits};
use super::names::NameIndex;
use crate::ids::{ActionName, AgentId, Label};

// ---------------------------------------------------------------------------
// Sensitivity ladder
// ---------------------------------------------------------------------------

/// The sensitivity ladder, lowest first: `public < internal < confidential <
/// restricted < top_secret` (ranks 0 to 4).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Sensitivity {
    /// Rank 0: anyone may see it.
    #[default]
    Public = 0,
    /// Rank 1: inside the organisation.
    Internal = 1,
    /// Rank 2: need to know.
    Confidential = 2,
    /// Rank 3: tightly controlled; the default floor for flows out.
    Restricted = 3,
    /// Rank 4: the top of the ladder.
    TopSecret = 4,
}

impl Sensitivity {
    /// Every level, lowest first.
    pub const ALL: [Sensitivity; 5] = [
        Sensitivity::Public,
        Sensitivity::Internal,
        Sensitivity::Confidential,
        Sensitivity::Restricted,
        Sensitivity::TopSecret,
    ];

    /// The level's rank, `public` = 0 to `top_secret` = 4.
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// The level of a rank, if it is one.
    pub fn from_rank(rank: u8) -> Option<Self> {
        Self::ALL.get(usize::from(rank)).copied()
    }

    /// The level's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Sensitivity::Public => "public",
            Sensitivity::Internal => "internal",
            Sensitivity::Confidential => "confidential",
            Sensitivity::Restricted => "restricted",
            Sensitivity::TopSecret => "top_secret",
        }
    }

    fn restricted() -> Self {
        Sensitivity::Restricted
    }
}

impl fmt::Display for Sensitivity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------
// Raw bundle section
// ---------------------------------------------------------------------------

/// Built-in restriction: denies actions tagged `export`.
pub const NO_EXTERNAL_EXPORT: &str = "no_external_export";
/// Built-in restriction: denies delegation to an external trust zone.
pub const NO_EXTERNAL_DELEGATION: &str = "no_external_delegation";
/// Built-in restriction: denies the `memory.write` action.
pub const NO_MEMORY_WRITE: &str = "no_memory_write";
/// The action tag of flows out of the organisation (`external.upload`).
pub const TAG_EXPORT: &str = "export";
/// The action tag of actions that reach outside the organisation.
pub const TAG_EXTERNAL: &str = "external";

/// The `context:` section of a policy bundle, as authored.
///
/// ```yaml
/// context:
///   labels: {pii: confidential, financial: confidential, behavioral: internal}
///   aggregation_rules:
///     - {name: customer_risk, all_labels: [pii, financial, behavioral],
///        sensitivity: restricted, derived: [customer-risk-profile],
///        restrict: [no_external_export]}
///   backstop: {min_labels: 4, at_or_above: internal, verdict: escalate}
///   inherit_threshold: restricted
///   restricted_floor: restricted
///   restrictions:
///     no_external_export: {denies_tags: [export]}
///   declassifiers: [compliance_officer]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextPolicySpec {
    /// Every label results may carry, with its base sensitivity. A result
    /// label missing here (and not derived by a rule) is an error when it is
    /// folded: unknown labels never pass silently.
    #[serde(default)]
    pub labels: BTreeMap<Label, Sensitivity>,
    /// Organisation-authored rules over label combinations.
    #[serde(default)]
    pub aggregation_rules: Vec<AggregationRuleSpec>,
    /// What happens when many labels accumulate and no rule covers them;
    /// absent means no backstop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backstop: Option<BackstopSpec>,
    /// At or above this, whatever a step produces must carry the envelope's
    /// classification (conservative inference).
    #[serde(default = "Sensitivity::restricted")]
    pub inherit_threshold: Sensitivity,
    /// At or above this, `export`/`external`-tagged actions and external
    /// delegations escalate unless a restriction already denies them.
    #[serde(default = "Sensitivity::restricted")]
    pub restricted_floor: Sensitivity,
    /// Restriction definitions. `no_external_export`, `no_external_delegation`
    /// and `no_memory_write` exist even if not declared; declaring one of them
    /// adds to its built-in meaning, never replaces it.
    #[serde(default)]
    pub restrictions: BTreeMap<Label, RestrictionSpec>,
    /// Agents allowed to declassify an envelope.
    #[serde(default)]
    pub declassifiers: Vec<AgentId>,
}

impl Default for ContextPolicySpec {
    fn default() -> Self {
        Self {
            labels: BTreeMap::new(),
            aggregation_rules: Vec::new(),
            backstop: None,
            inherit_threshold: Sensitivity::Restricted,
            restricted_floor: Sensitivity::Restricted,
            restrictions: BTreeMap::new(),
            declassifiers: Vec::new(),
        }
    }
}

/// One aggregation rule: when every label of `all_labels` is present, the
/// envelope rises to at least `sensitivity`, gains the `derived` labels and
/// the `restrict` restrictions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AggregationRuleSpec {
    /// The rule's name in errors and audit entries; defaults to
    /// `aggregation_rules.<index>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Label>,
    /// The combination (declared labels, or labels another rule derives).
    pub all_labels: Vec<Label>,
    /// The level the combination implies.
    pub sensitivity: Sensitivity,
    /// Derived labels the combination produces (`customer-risk-profile`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub derived: Vec<Label>,
    /// Restrictions the combination adds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restrict: Vec<Label>,
}

/// The aggregation backstop: `min_labels` or more distinct labels at or above
/// `at_or_above`, with no rule covering the combination, get `verdict`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackstopSpec {
    /// How many distinct labels trigger it (at least 1).
    pub min_labels: u32,
    /// Only labels whose base sensitivity is at least this count.
    #[serde(default)]
    pub at_or_above: Sensitivity,
    /// What the backstop answers.
    #[serde(default)]
    pub verdict: BackstopVerdict,
}

/// What a triggered backstop answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackstopVerdict {
    /// Human review.
    #[default]
    Escalate,
    /// Refuse outright.
    Deny,
}

/// What a restriction denies. At least one field must be given.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestrictionSpec {
    /// Actions carrying any of these catalogue tags are denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denies_tags: Vec<Label>,
    /// These actions are denied by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denies_actions: Vec<ActionName>,
    /// Delegations this restriction denies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denies_delegation: Option<DelegationScope>,
}

/// Which delegations a restriction denies.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum DelegationScope {
    /// Delegation to an external trust zone.
    External,
    /// Every delegation, internal or external.
    All,
}

/// The trust zone of a delegation target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrustZone {
    /// Inside this Warden deployment: the child envelope is enforced here.
    Internal,
    /// Across a trust boundary: the envelope travels as a signed token.
    External,
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a `context:` section does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextPolicyError {
    /// A rule names a label that is neither declared nor derived.
    #[error("aggregation rule `{rule}` names undeclared label `{label}`")]
    UndeclaredLabel {
        /// The rule.
        rule: Label,
        /// The label.
        label: Label,
    },
    /// A rule names a restriction that is neither declared nor built in.
    #[error("aggregation rule `{rule}` names undeclared restriction `{restriction}`")]
    UndeclaredRestriction {
        /// The rule.
        rule: Label,
        /// The restriction.
        restriction: Label,
    },
    /// A rule with no labels would fire on every envelope.
    #[error("aggregation rule `{rule}` has no `all_labels`")]
    EmptyRule {
        /// The rule.
        rule: Label,
    },
    /// Two rules share a name.
    #[error("aggregation rule `{rule}` is declared twice")]
    DuplicateRule {
        /// The rule.
        rule: Label,
    },
    /// A derived label declared below the rule that derives it would let the
    /// derived artifact travel below the combination's level.
    #[error(
        "label `{label}` is declared `{declared}` but aggregation rule `{rule}` derives it at `{derived}`"
    )]
    DerivedBelowRule {
        /// The label.
        label: Label,
        /// Its declared base sensitivity.
        declared: Sensitivity,
        /// The rule deriving it.
        rule: Label,
        /// The rule's sensitivity.
        derived: Sensitivity,
    },
    /// A declared restriction that denies nothing.
    #[error(
        "restriction `{restriction}` denies nothing; give `denies_tags`, `denies_actions` or `denies_delegation`"
    )]
    EmptyRestriction {
        /// The restriction.
        restriction: Label,
    },
    /// `backstop.min_labels` is 0.
    #[error("backstop `min_labels` must be at least 1")]
    BackstopMinLabels,
    /// More labels (declared and derived) than the compiled form holds.
    #[error("the context policy has {count} labels, the limit is {max}")]
    TooManyLabels {
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More restrictions (with the built-in ones) than the compiled form holds.
    #[error("the context policy has {count} restrictions, the limit is {max}")]
    TooManyRestrictions {
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More rules than the compiled form holds.
    #[error("the context policy has {count} aggregation rules, the limit is {max}")]
    TooManyRules {
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
}

// ---------------------------------------------------------------------------
// Compiled policy
// ---------------------------------------------------------------------------

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
    fn new(labels: Vec<Label>, restrictions: Vec<Label>, rules: Vec<Label>) -> Self {
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
    /// Restrictions denying external delegation (`external` or `all`).
    deny_external_delegation: RestrictionBits,
    /// Restrictions denying every delegation (`all`).
    deny_all_delegation: RestrictionBits,
    declassifiers: BTreeSet<AgentId>,
}

#[derive(Default)]
struct RestrictionDraft {
    tags: BTreeSet<Label>,
    actions: BTreeSet<ActionName>,
    delegation: Option<DelegationScope>,
}

/// A label from a literal that is a valid identifier.
#[expect(
    clippy::expect_used,
    reason = "only called with literals that satisfy the identifier rules (covered by tests)"
)]
fn literal_label(s: &str) -> Label {
    Label::parse(s).expect("literal is a valid identifier")
}

fn builtin_restrictions() -> BTreeMap<Label, RestrictionDraft> {
    #[expect(
        clippy::expect_used,
        reason = "`memory.write` is a valid identifier literal (covered by tests)"
    )]
    let memory_write = ActionName::parse("memory.write").expect("literal is a valid identifier");
    BTreeMap::from([
        (
            literal_label(NO_EXTERNAL_EXPORT),
            RestrictionDraft {
                tags: BTreeSet::from([literal_label(TAG_EXPORT)]),
                ..RestrictionDraft::default()
            },
        ),
        (
            literal_label(NO_EXTERNAL_DELEGATION),
            RestrictionDraft {
                delegation: Some(DelegationScope::External),
                ..RestrictionDraft::default()
            },
        ),
        (
            literal_label(NO_MEMORY_WRITE),
            RestrictionDraft {
                actions: BTreeSet::from([memory_write]),
                ..RestrictionDraft::default()
            },
        ),
    ])
}

/// The rule's name, or `aggregation_rules.<index>` (at most 21 bytes, so
/// always a valid identifier).
fn rule_name(spec: &AggregationRuleSpec, index: usize) -> Label {
    match &spec.name {
        Some(name) => name.clone(),
        None => literal_label(&format!("aggregation_rules.{index}")),
    }
}

impl ContextPolicy {
    /// The most labels (declared and derived) a policy may have.
    pub const MAX_LABELS: usize = LabelBits::CAPACITY;
    /// The most restrictions (built-in and declared) a policy may have.
    pub const MAX_RESTRICTIONS: usize = RestrictionBits::CAPACITY;
    /// The most aggregation rules a policy may have.
    pub const MAX_RULES: usize = RuleBits::CAPACITY;

    /// Validate `spec` and compile it.
    ///
    /// Rules are checked in declaration order; the first problem is reported,
    /// naming the rule (or restriction) it is in.
    pub fn compile(spec: &ContextPolicySpec) -> Result<Self, ContextPolicyError> {
        // Restrictions: built-ins, extended (never replaced) by declarations.
        let mut drafts = builtin_restrictions();
        for (name, rs) in &spec.restrictions {
            if rs.denies_tags.is_empty()
                && rs.denies_actions.is_empty()
                && rs.denies_delegation.is_none()
            {
                return Err(ContextPolicyError::EmptyRestriction {
                    restriction: name.clone(),
                });
            }
            let d = drafts.entry(name.clone()).or_default();
            d.tags.extend(rs.denies_tags.iter().cloned());
            d.actions.extend(rs.denies_actions.iter().cloned());
            d.delegation = d.delegation.max(rs.denies_delegation);
        }
        if drafts.len() > Self::MAX_RESTRICTIONS {
            return Err(ContextPolicyError::TooManyRestrictions {
                count: drafts.len(),
                max: Self::MAX_RESTRICTIONS,
            });
        }
        if spec.aggregation_rules.len() > Self::MAX_RULES {
            return Err(ContextPolicyError::TooManyRules {
                count: spec.aggregation_rules.len(),
                max: Self::MAX_RULES,
            });
        }

        // Derived labels: base = the highest rule deriving them (a declared
        // base may be higher, never lower).
        let mut derived_base: BTreeMap<Label, Sensitivity> = BTreeMap::new();
        for rule in &spec.aggregation_rules {
            for d in &rule.derived {
                let e = derived_base.entry(d.clone()).or_insert(rule.sensitivity);
                *e = (*e).max(rule.sensitivity);
            }
        }

        // Rules, in order.
        let mut names = Vec::with_capacity(spec.aggregation_rules.len());
        let mut seen = BTreeSet::new();
        for (i, rule) in spec.aggregation_rules.iter().enumerate() {
            let name = rule_name(rule, i);
            if !seen.insert(name.clone()) {
                return Err(ContextPolicyError::DuplicateRule { rule: name });
            }
            if rule.all_labels.is_empty() {
                return Err(ContextPolicyError::EmptyRule { rule: name });
            }
            for l in &rule.all_labels {
                if !spec.labels.contains_key(l) && !derived_base.contains_key(l) {
                    return Err(ContextPolicyError::UndeclaredLabel {
                        rule: name,
                        label: l.clone(),
                    });
                }
            }
            for r in &rule.restrict {
                if !drafts.contains_key(r) {
                    return Err(ContextPolicyError::UndeclaredRestriction {
                        rule: name,
                        restriction: r.clone(),
                    });
                }
            }
            for d in &rule.derived {
                if let Some(&declared) = spec.labels.get(d)
                    && declared < rule.sensitivity
                {
                    return Err(ContextPolicyError::DerivedBelowRule {
                        label: d.clone(),
                        declared,
                        rule: name,
                        derived: rule.sensitivity,
                    });
                }
            }
            names.push(name);
        }

        // The label universe: declared labels keep their declared base.
        let mut universe = spec.labels.clone();
        for (d, s) in derived_base.iter() {
            universe.entry(d.clone()).or_insert(*s);
        }
        if universe.len() > Self::MAX_LABELS {
            return Err(ContextPolicyError::TooManyLabels {
                count: universe.len(),
                max: Self::MAX_LABELS,
            });
        }
        if spec.backstop.is_some_and(|b| b.min_labels == 0) {
            return Err(ContextPolicyError::BackstopMinLabels);
        }

        let vocab = Vocab::new(
            universe.keys().cloned().collect(),
            drafts.keys().cloned().collect(),
            names,
        );
        let label_bits = |labels: &[Label]| -> LabelBits {
            let mut b = LabelBits::EMPTY;
            for l in labels {
                if let Some(i) = vocab.label_index(l.as_str()) {
                    b.insert(i);
                }
            }
            b
        };
        let restriction_bits = |rs: &[Label]| -> RestrictionBits {
            let mut b = RestrictionBits::EMPTY;
            for r in rs {
                if let Some(i) = vocab.restriction_index(r.as_str()) {
                    b.insert(i);
                }
            }
            b
        };

        let mut level_masks = [LabelBits::EMPTY; 5];
        for (i, base) in universe.values().enumerate() {
            if let Some(mask) = level_masks.get_mut(usize::from(base.rank())) {
                mask.insert(i);
            }
        }

        let rules: Vec<CompiledRule> = spec
            .aggregation_rules
            .iter()
            .map(|r| CompiledRule {
                need: label_bits(&r.all_labels),
                sensitivity: r.sensitivity,
                derived: label_bits(&r.derived),
                restrict: restriction_bits(&r.restrict),
            })
            .collect();
        let all_derived = rules
            .iter()
            .fold(LabelBits::EMPTY, |acc, r| acc.union(r.derived));
        let chaining = rules
            .iter()
            .any(|r| !r.need.intersect(all_derived).is_empty());

        let backstop = spec.backstop.map(|b| {
            let mut counted = LabelBits::EMPTY;
            for (i, base) in universe.values().enumerate() {
                if *base >= b.at_or_above {
                    counted.insert(i);
                }
            }
            CompiledBackstop {
                min_labels: b.min_labels as usize,
                counted,
                verdict: b.verdict,
            }
        });

        let mut by_tag: BTreeMap<Label, RestrictionBits> = BTreeMap::new();
        let mut by_action: BTreeMap<ActionName, RestrictionBits> = BTreeMap::new();
        let mut deny_external_delegation = RestrictionBits::EMPTY;
        let mut deny_all_delegation = RestrictionBits::EMPTY;
        for (i, draft) in drafts.values().enumerate() {
            for t in &draft.tags {
                by_tag.entry(t.clone()).or_default().insert(i);
            }
            for a in &draft.actions {
                by_action.entry(a.clone()).or_default().insert(i);
            }
            match draft.delegation {
                Some(DelegationScope::External) => deny_external_delegation.insert(i),
                Some(DelegationScope::All) => {
                    deny_external_delegation.insert(i);
                    deny_all_delegation.insert(i);
                }
                None => {}
            }
        }

        let closure_id = {
            let mut h = Sha256::new();
            h.update(b"warden.context-closure.v1");
            h.update(vocab.fingerprint);
            match serde_json::to_vec(spec) {
                Ok(bytes) => {
                    h.update(bytes);
                    let d: [u8; 32] = h.finalize().into();
                    let mut id = [0u8; 8];
                    for (a, b) in id.iter_mut().zip(d) {
                        *a = b;
                    }
                    u64::from_le_bytes(id)
                }
                Err(_) => 0,
            }
        };

        Ok(Self {
            vocab: Arc::new(vocab),
            closure_id,
            level_masks,
            rules,
            chaining,
            backstop,
            inherit_threshold: spec.inherit_threshold,
            restricted_floor: spec.restricted_floor,
            by_tag: NameIndex::new(by_tag.iter().map(|(t, b)| (t.as_str(), *b))),
            by_action: NameIndex::new(by_action.iter().map(|(a, b)| (a.as_str(), *b))),
            deny_external_delegation,
            deny_all_delegation,
            declassifiers: spec.declassifiers.iter().cloned().collect(),
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml_json: serde_json::Value) -> ContextPolicySpec {
        serde_json::from_value(yaml_json).unwrap()
    }

    #[test]
    fn ladder_is_ordered_and_ranked() {
        assert!(Sensitivity::Public < Sensitivity::Internal);
        assert!(Sensitivity::Restricted < Sensitivity::TopSecret);
        for (i, s) in Sensitivity::ALL.iter().enumerate() {
            assert_eq!(usize::from(s.rank()), i);
            assert_eq!(Sensitivity::from_rank(s.rank()), Some(*s));
        }
        assert_eq!(Sensitivity::from_rank(5), None);
        assert_eq!(
            serde_json::to_string(&Sensitivity::TopSecret).unwrap(),
            "\"top_secret\""
        );
    }

    #[test]
    fn the_brief_example_compiles() {
        let s = spec(serde_json::json!({
            "labels": {"pii": "confidential", "financial": "confidential",
                       "behavioral": "internal", "name": "internal", "public_sku": "public"},
            "aggregation_rules": [{"name": "customer_risk",
                "all_labels": ["pii", "financial", "behavioral"], "sensitivity": "restricted",
                "derived": ["customer-risk-profile"], "restrict": ["no_external_export"]}],
            "backstop": {"min_labels": 4, "at_or_above": "internal", "verdict": "escalate"},
            "inherit_threshold": "restricted",
            "restricted_floor": "restricted",
            "restrictions": {
                "no_external_export": {"denies_tags": ["export"]},
                "no_external_delegation": {"denies_delegation": "external"},
                "no_memory_write": {"denies_actions": ["memory.write"]}
            },
            "declassifiers": ["compliance_officer"]
        }));
        let p = ContextPolicy::compile(&s).unwrap();
        assert_eq!(
            p.base_sensitivity("customer-risk-profile"),
            Some(Sensitivity::Restricted)
        );
        assert_eq!(p.base_sensitivity("name"), Some(Sensitivity::Internal));
        assert_eq!(p.base_sensitivity("nope"), None);
        assert_eq!(
            p.rules().map(Label::as_str).collect::<Vec<_>>(),
            ["customer_risk"]
        );
        assert_eq!(
            p.restrictions().map(Label::as_str).collect::<Vec<_>>(),
            [NO_EXTERNAL_DELEGATION, NO_EXTERNAL_EXPORT, NO_MEMORY_WRITE]
        );
        assert!(p.is_declassifier(&AgentId::parse("compliance_officer").unwrap()));
        assert_eq!(p.vocabulary_fingerprint().len(), 64);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let r: Result<ContextPolicySpec, _> =
            serde_json::from_value(serde_json::json!({"lables": {}}));
        assert!(r.is_err());
        let r: Result<ContextPolicySpec, _> = serde_json::from_value(serde_json::json!({
            "aggregation_rules": [{"all_labels": ["a"], "sensitivity": "public", "extra": 1}]
        }));
        assert!(r.is_err());
        let r: Result<ContextPolicySpec, _> =
            serde_json::from_value(serde_json::json!({"labels": {"a": "secret"}}));
        assert!(r.is_err());
    }

    #[test]
    fn references_are_checked_and_located() {
        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "labels": {"pii": "confidential"},
            "aggregation_rules": [{"name": "r1", "all_labels": ["pii", "health"], "sensitivity": "restricted"}]
        })))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "aggregation rule `r1` names undeclared label `health`"
        );

        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "labels": {"pii": "confidential"},
            "aggregation_rules": [{"all_labels": ["pii"], "sensitivity": "restricted", "restrict": ["no_print"]}]
        })))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "aggregation rule `aggregation_rules.0` names undeclared restriction `no_print`"
        );

        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "aggregation_rules": [{"name": "r", "all_labels": [], "sensitivity": "restricted"}]
        })))
        .unwrap_err();
        assert_eq!(
            e,
            ContextPolicyError::EmptyRule {
                rule: Label::parse("r").unwrap()
            }
        );

        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "labels": {"a": "public"},
            "aggregation_rules": [
                {"name": "r", "all_labels": ["a"], "sensitivity": "internal"},
                {"name": "r", "all_labels": ["a"], "sensitivity": "internal"}]
        })))
        .unwrap_err();
        assert!(matches!(e, ContextPolicyError::DuplicateRule { .. }));

        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "labels": {"a": "public", "profile": "internal"},
            "aggregation_rules": [{"name": "r", "all_labels": ["a"], "sensitivity": "restricted", "derived": ["profile"]}]
        })))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "label `profile` is declared `internal` but aggregation rule `r` derives it at `restricted`"
        );

        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "restrictions": {"no_print": {}}
        })))
        .unwrap_err();
        assert!(matches!(e, ContextPolicyError::EmptyRestriction { .. }));

        let e = ContextPolicy::compile(&spec(serde_json::json!({
            "backstop": {"min_labels": 0}
        })))
        .unwrap_err();
        assert_eq!(e, ContextPolicyError::BackstopMinLabels);
    }

    #[test]
    fn builtins_cannot_be_weakened() {
        let p = ContextPolicy::compile(&spec(serde_json::json!({
            "restrictions": {"no_external_export": {"denies_tags": ["print"]}}
        })))
        .unwrap();
        let export = Label::parse("export").unwrap();
        let print = Label::parse("print").unwrap();
        let i = p.vocab.restriction_index(NO_EXTERNAL_EXPORT).unwrap();
        assert!(
            p.denying_action("x", std::slice::from_ref(&export))
                .contains(i)
        );
        assert!(
            p.denying_action("x", std::slice::from_ref(&print))
                .contains(i)
        );
        assert!(p.denying_action("x", &[]).is_empty());
        let m = p.vocab.restriction_index(NO_MEMORY_WRITE).unwrap();
        assert!(p.denying_action("memory.write", &[]).contains(m));
    }

    #[test]
    fn too_many_labels_is_an_error() {
        let mut s = ContextPolicySpec::default();
        for i in 0..=ContextPolicy::MAX_LABELS {
            s.labels
                .insert(Label::parse(&format!("l{i}")).unwrap(), Sensitivity::Public);
        }
        assert!(matches!(
            ContextPolicy::compile(&s),
            Err(ContextPolicyError::TooManyLabels {
                count: 129,
                max: 128
            })
        ));
    }

    #[test]
    fn schema_is_generated() {
        let schema = schemars::schema_for!(ContextPolicySpec);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("aggregation_rules"));
        assert!(text.contains("top_secret"));
    }
}
