//! Compiling the `context:` section: every reference checked, names
//! interned to indices, restrictions indexed by tag, action and trust zone.
//!
//! [`ContextPolicy::compile`] runs the steps below in order; the first
//! problem is reported, naming the rule (or restriction) it is in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::super::bits::{LabelBits, RestrictionBits};
use super::super::names::NameIndex;
use super::{
    AggregationRuleSpec, CompiledBackstop, CompiledRule, ContextPolicy, ContextPolicyError,
    ContextPolicySpec, DelegationScope, NO_EXTERNAL_DELEGATION, NO_EXTERNAL_EXPORT,
    NO_MEMORY_WRITE, Sensitivity, TAG_EXPORT, Vocab,
};
use crate::ids::{ActionName, Label};
use crate::provenance::OriginSet;

#[derive(Default)]
struct RestrictionDraft {
    tags: BTreeSet<Label>,
    actions: BTreeSet<ActionName>,
    delegation: Option<DelegationScope>,
    escalate: bool,
    when_from: Option<OriginSet>,
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
    /// Validate `spec` and compile it.
    ///
    /// Rules are checked in declaration order; the first problem is reported,
    /// naming the rule (or restriction) it is in.
    pub fn compile(spec: &ContextPolicySpec) -> Result<Self, ContextPolicyError> {
        let drafts = restriction_drafts(spec)?;
        let derived_base = derived_bases(spec);
        let names = checked_rule_names(spec, &drafts, &derived_base)?;
        let universe = label_universe(spec, &derived_base)?;
        let vocab = Vocab::new(
            universe.keys().cloned().collect(),
            drafts.keys().cloned().collect(),
            names,
        );
        let rules = compile_rules(spec, &vocab);
        let all_derived = rules
            .iter()
            .fold(LabelBits::EMPTY, |acc, r| acc.union(r.derived));
        let chaining = rules
            .iter()
            .any(|r| !r.need.intersect(all_derived).is_empty());
        let index = RestrictionIndex::of(&drafts);
        Ok(Self {
            closure_id: closure_id(spec, &vocab),
            vocab: Arc::new(vocab),
            level_masks: level_masks(&universe),
            rules,
            chaining,
            backstop: compile_backstop(spec, &universe),
            inherit_threshold: spec.inherit_threshold,
            restricted_floor: spec.restricted_floor,
            by_tag: NameIndex::new(index.by_tag.iter().map(|(t, b)| (t.as_str(), *b))),
            by_action: NameIndex::new(index.by_action.iter().map(|(a, b)| (a.as_str(), *b))),
            deny_external_delegation: index.deny_external_delegation,
            deny_all_delegation: index.deny_all_delegation,
            escalating: index.escalating,
            conditional_bits: index.conditional.iter().fold(
                RestrictionBits::EMPTY,
                |mut b, (i, _)| {
                    b.insert(*i);
                    b
                },
            ),
            conditional: index.conditional,
            declassifiers: spec.declassifiers.iter().cloned().collect(),
        })
    }
}

/// Restrictions: built-ins, extended (never replaced) by declarations.
fn restriction_drafts(
    spec: &ContextPolicySpec,
) -> Result<BTreeMap<Label, RestrictionDraft>, ContextPolicyError> {
    let mut drafts = builtin_restrictions();
    let builtin: BTreeSet<Label> = drafts.keys().cloned().collect();
    for (name, rs) in &spec.restrictions {
        let weakens = !rs.verdict.is_deny() || !rs.when_arguments_from.is_empty();
        if weakens && builtin.contains(name) {
            return Err(ContextPolicyError::BuiltinWeakened {
                restriction: name.clone(),
            });
        }
        if !rs.when_arguments_from.is_empty() && rs.denies_delegation.is_some() {
            return Err(ContextPolicyError::ConditionalDelegation {
                restriction: name.clone(),
            });
        }
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
        d.escalate = !rs.verdict.is_deny();
        d.when_from =
            (!rs.when_arguments_from.is_empty()).then(|| OriginSet::of(&rs.when_arguments_from));
    }
    if drafts.len() > ContextPolicy::MAX_RESTRICTIONS {
        return Err(ContextPolicyError::TooManyRestrictions {
            count: drafts.len(),
            max: ContextPolicy::MAX_RESTRICTIONS,
        });
    }
    Ok(drafts)
}

/// Derived labels: base = the highest rule deriving them (a declared base
/// may be higher, never lower).
fn derived_bases(spec: &ContextPolicySpec) -> BTreeMap<Label, Sensitivity> {
    let mut derived_base: BTreeMap<Label, Sensitivity> = BTreeMap::new();
    for rule in &spec.aggregation_rules {
        for d in &rule.derived {
            let e = derived_base.entry(d.clone()).or_insert(rule.sensitivity);
            *e = (*e).max(rule.sensitivity);
        }
    }
    derived_base
}

/// The rules' names, in order, once every reference in them is checked.
fn checked_rule_names(
    spec: &ContextPolicySpec,
    drafts: &BTreeMap<Label, RestrictionDraft>,
    derived_base: &BTreeMap<Label, Sensitivity>,
) -> Result<Vec<Label>, ContextPolicyError> {
    if spec.aggregation_rules.len() > ContextPolicy::MAX_RULES {
        return Err(ContextPolicyError::TooManyRules {
            count: spec.aggregation_rules.len(),
            max: ContextPolicy::MAX_RULES,
        });
    }
    let mut names = Vec::with_capacity(spec.aggregation_rules.len());
    let mut seen = BTreeSet::new();
    for (i, rule) in spec.aggregation_rules.iter().enumerate() {
        let name = rule_name(rule, i);
        if !seen.insert(name.clone()) {
            return Err(ContextPolicyError::DuplicateRule { rule: name });
        }
        check_rule(spec, rule, &name, drafts, derived_base)?;
        names.push(name);
    }
    Ok(names)
}

/// One rule's references: its labels declared or derived, its restrictions
/// known, its derived labels declared no lower than the rule's level.
fn check_rule(
    spec: &ContextPolicySpec,
    rule: &AggregationRuleSpec,
    name: &Label,
    drafts: &BTreeMap<Label, RestrictionDraft>,
    derived_base: &BTreeMap<Label, Sensitivity>,
) -> Result<(), ContextPolicyError> {
    if rule.all_labels.is_empty() {
        return Err(ContextPolicyError::EmptyRule { rule: name.clone() });
    }
    if let Some(l) = rule
        .all_labels
        .iter()
        .find(|l| !spec.labels.contains_key(*l) && !derived_base.contains_key(*l))
    {
        return Err(ContextPolicyError::UndeclaredLabel {
            rule: name.clone(),
            label: l.clone(),
        });
    }
    if let Some(r) = rule.restrict.iter().find(|r| !drafts.contains_key(*r)) {
        return Err(ContextPolicyError::UndeclaredRestriction {
            rule: name.clone(),
            restriction: r.clone(),
        });
    }
    for d in &rule.derived {
        if let Some(&declared) = spec.labels.get(d)
            && declared < rule.sensitivity
        {
            return Err(ContextPolicyError::DerivedBelowRule {
                label: d.clone(),
                declared,
                rule: name.clone(),
                derived: rule.sensitivity,
            });
        }
    }
    Ok(())
}

/// The label universe: declared labels keep their declared base; derived
/// ones get theirs from the rules. Also checks the backstop.
fn label_universe(
    spec: &ContextPolicySpec,
    derived_base: &BTreeMap<Label, Sensitivity>,
) -> Result<BTreeMap<Label, Sensitivity>, ContextPolicyError> {
    let mut universe = spec.labels.clone();
    for (d, s) in derived_base.iter() {
        universe.entry(d.clone()).or_insert(*s);
    }
    if universe.len() > ContextPolicy::MAX_LABELS {
        return Err(ContextPolicyError::TooManyLabels {
            count: universe.len(),
            max: ContextPolicy::MAX_LABELS,
        });
    }
    if spec.backstop.is_some_and(|b| b.min_labels == 0) {
        return Err(ContextPolicyError::BackstopMinLabels);
    }
    Ok(universe)
}

fn label_bits(vocab: &Vocab, labels: &[Label]) -> LabelBits {
    let mut b = LabelBits::EMPTY;
    for l in labels {
        if let Some(i) = vocab.label_index(l.as_str()) {
            b.insert(i);
        }
    }
    b
}

fn restriction_bits(vocab: &Vocab, rs: &[Label]) -> RestrictionBits {
    let mut b = RestrictionBits::EMPTY;
    for r in rs {
        if let Some(i) = vocab.restriction_index(r.as_str()) {
            b.insert(i);
        }
    }
    b
}

/// The rules as bitsets, in declaration order.
fn compile_rules(spec: &ContextPolicySpec, vocab: &Vocab) -> Vec<CompiledRule> {
    spec.aggregation_rules
        .iter()
        .map(|r| CompiledRule {
            need: label_bits(vocab, &r.all_labels),
            sensitivity: r.sensitivity,
            derived: label_bits(vocab, &r.derived),
            restrict: restriction_bits(vocab, &r.restrict),
        })
        .collect()
}

/// Labels by exact base sensitivity, lowest level first.
fn level_masks(universe: &BTreeMap<Label, Sensitivity>) -> [LabelBits; 5] {
    let mut level_masks = [LabelBits::EMPTY; 5];
    for (i, base) in universe.values().enumerate() {
        if let Some(mask) = level_masks.get_mut(usize::from(base.rank())) {
            mask.insert(i);
        }
    }
    level_masks
}

fn compile_backstop(
    spec: &ContextPolicySpec,
    universe: &BTreeMap<Label, Sensitivity>,
) -> Option<CompiledBackstop> {
    spec.backstop.map(|b| {
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
    })
}

/// The restrictions denying each tag, each action and each trust zone.
struct RestrictionIndex {
    by_tag: BTreeMap<Label, RestrictionBits>,
    by_action: BTreeMap<ActionName, RestrictionBits>,
    deny_external_delegation: RestrictionBits,
    deny_all_delegation: RestrictionBits,
    escalating: RestrictionBits,
    conditional: Vec<(usize, OriginSet)>,
}

impl RestrictionIndex {
    fn of(drafts: &BTreeMap<Label, RestrictionDraft>) -> Self {
        let mut index = Self {
            by_tag: BTreeMap::new(),
            by_action: BTreeMap::new(),
            deny_external_delegation: RestrictionBits::EMPTY,
            deny_all_delegation: RestrictionBits::EMPTY,
            escalating: RestrictionBits::EMPTY,
            conditional: Vec::new(),
        };
        for (i, draft) in drafts.values().enumerate() {
            if draft.escalate {
                index.escalating.insert(i);
            }
            if let Some(from) = draft.when_from {
                index.conditional.push((i, from));
            }
            for t in &draft.tags {
                index.by_tag.entry(t.clone()).or_default().insert(i);
            }
            for a in &draft.actions {
                index.by_action.entry(a.clone()).or_default().insert(i);
            }
            match draft.delegation {
                Some(DelegationScope::External) => index.deny_external_delegation.insert(i),
                Some(DelegationScope::All) => {
                    index.deny_external_delegation.insert(i);
                    index.deny_all_delegation.insert(i);
                }
                None => {}
            }
        }
        index
    }
}

/// Identifies the policy's whole content (0: never cache).
fn closure_id(spec: &ContextPolicySpec, vocab: &Vocab) -> u64 {
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
}
