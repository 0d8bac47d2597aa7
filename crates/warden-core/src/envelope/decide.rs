//! Context-aware decisions for the next action or delegation.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use super::bits::{LabelBits, RestrictionBits};
use super::policy::{
    BackstopVerdict, ContextPolicy, NameSet, Sensitivity, TAG_EXPORT, TAG_EXTERNAL, TrustZone,
    Vocab,
};
use super::reasons;
use super::state::Envelope;
use crate::decision::{Decision, Obligation, Reason, Verdict};
use crate::ids::{ActionName, Label};
use crate::provenance::OriginSet;
use crate::time::Timestamp;

/// An action as the catalogue describes it: its name and its tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionRef<'a> {
    /// The action name (`external.upload`).
    pub name: &'a str,
    /// Its catalogue tags (`external`, `export`, ...).
    pub tags: &'a [Label],
}

/// What is being asked of the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextRequest<'a> {
    /// Run an action next, its arguments' origins unknown: a restriction
    /// applied by origin covers it (fails closed).
    Action(ActionRef<'a>),
    /// Run a call of an action whose argument values' origins are known:
    /// one set per argument value (leaf). A restriction applied by origin
    /// covers the call when some value's origins all lie in the origins it
    /// names.
    Call {
        /// The action.
        action: ActionRef<'a>,
        /// The origins of each argument value.
        arguments: &'a [OriginSet],
    },
    /// Delegate work to another agent.
    Delegation {
        /// Where the delegatee runs.
        target: TrustZone,
        /// The actions the delegatee can perform (name and tags each).
        delegatee_authority: &'a [ActionRef<'a>],
    },
}

/// A set of restrictions held by a decision (owned; names via
/// [`RestrictionSet::names`]).
#[derive(Clone, PartialEq, Eq)]
pub struct RestrictionSet {
    vocab: Arc<Vocab>,
    bits: RestrictionBits,
}

impl RestrictionSet {
    /// The restriction names, sorted.
    pub fn names(&self) -> NameSet<'_> {
        self.vocab.restriction_names(self.bits)
    }

    /// Whether `name` is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.vocab
            .restriction_index(name)
            .is_some_and(|i| self.bits.contains(i))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }
}

impl fmt::Debug for RestrictionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.names().fmt(f)
    }
}

impl Serialize for RestrictionSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(serializer)
    }
}

/// The obligations of a decision, kept compact until the engine needs them
/// as [`Obligation`]s ([`ContextObligations::to_vec`]).
#[derive(Clone, PartialEq, Eq)]
pub struct ContextObligations {
    vocab: Arc<Vocab>,
    result_labels: Option<LabelBits>,
    inherit: RestrictionBits,
}

impl ContextObligations {
    fn none(vocab: Arc<Vocab>) -> Self {
        Self {
            vocab,
            result_labels: None,
            inherit: RestrictionBits::EMPTY,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.result_labels.is_none() && self.inherit.is_empty()
    }

    /// Labels the step's result must carry, if the envelope is at or above
    /// `inherit_threshold`: every label of the projected envelope, observed
    /// and derived (folded anywhere under the same policy they reproduce at
    /// least the envelope's level).
    pub fn result_labels(&self) -> Option<NameSet<'_>> {
        self.result_labels.map(|b| self.vocab.label_names(b))
    }

    /// Restrictions every child delegated from here inherits.
    pub fn inherited_restrictions(&self) -> NameSet<'_> {
        self.vocab.restriction_names(self.inherit)
    }

    /// The obligations as [`Obligation`] values (result labels first).
    pub fn to_vec(&self) -> Vec<Obligation> {
        let mut out = Vec::with_capacity(2);
        if let Some(labels) = self.result_labels() {
            out.push(Obligation::ResultLabels {
                labels: labels.to_vec(),
            });
        }
        if !self.inherit.is_empty() {
            out.push(Obligation::InheritRestrictions {
                restrictions: self.inherited_restrictions().to_vec(),
            });
        }
        out
    }
}

impl fmt::Debug for ContextObligations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextObligations")
            .field("result_labels", &self.result_labels())
            .field("inherit_restrictions", &self.inherited_restrictions())
            .finish()
    }
}

impl Serialize for ContextObligations {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_vec().serialize(serializer)
    }
}

/// The envelope's answer to a request; the engine turns it into a
/// [`Decision`] ([`ContextDecision::into_decision`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContextDecision {
    /// The verdict.
    pub verdict: Verdict,
    /// The stable reason code.
    pub reason: Reason,
    /// The envelope's sensitivity once every triggered rule is applied.
    pub projected_sensitivity: Sensitivity,
    /// The envelope's restrictions once every triggered rule is applied.
    pub projected_restrictions: RestrictionSet,
    /// Obligations: on `constrain`, and on `escalate` (they bind if a
    /// reviewer approves). Empty on `allow` and `deny`.
    pub obligations: ContextObligations,
}

impl ContextDecision {
    /// Whether the request may proceed now.
    pub fn permits(&self) -> bool {
        self.verdict.permits()
    }

    /// The full decision record.
    pub fn into_decision(
        self,
        subject: impl Into<crate::decision::Subject>,
        operation: impl Into<crate::decision::SmolStr>,
        resource: impl Into<crate::decision::SmolStr>,
        policy_version: impl Into<crate::decision::SmolStr>,
        time: Timestamp,
    ) -> Decision {
        Decision {
            obligations: self.obligations.to_vec(),
            verdict: self.verdict,
            reason: self.reason,
            subject: subject.into(),
            operation: operation.into(),
            resource: resource.into(),
            policy_version: policy_version.into(),
            time,
        }
    }
}

fn is_flow(tags: &[Label]) -> bool {
    tags.iter()
        .any(|t| t.as_str() == TAG_EXPORT || t.as_str() == TAG_EXTERNAL)
}

/// Decide `request` against `envelope` as it would be after applying every
/// rule its labels trigger (so a restriction a rule implies binds the very
/// next request, even if the stored envelope predates the rule).
///
/// Checked in this order; the first that applies wins:
///
/// 1. a projected restriction whose verdict is `deny` covers the action
///    (by name or tag; one applied by origin only when a value of the
///    call's arguments comes from nothing but the origins it names, or
///    when the origins are unknown) or the delegation (by trust zone) →
///    `deny`, `restricted_by:<restriction>` (the first such restriction by
///    name);
/// 2. an external delegation whose delegatee can perform an action a
///    projected restriction covers → `deny`, `delegation_denied:<action>`
///    (outside this deployment nothing enforces the child envelope);
/// 3. a projected restriction whose verdict is `escalate` covers the
///    action (as in 1) → `escalate`, `restricted_by:<restriction>`;
/// 4. the backstop fires → its verdict (`escalate` by default),
///    `aggregation_backstop`;
/// 5. an `export`/`external`-tagged action, or an external delegation, at or
///    above `restricted_floor` → `escalate`, `sensitivity_floor`;
/// 6. otherwise `constrain` (`context_constrained`) if there are obligations
///    (result labels at or above `inherit_threshold`; restrictions children
///    inherit), else `allow` (`context_allowed`).
///
/// Never fails: an envelope from another policy vocabulary is denied with
/// `envelope_policy_mismatch`. A pure function of its inputs.
#[inline]
pub fn decide(
    envelope: &Envelope,
    policy: &ContextPolicy,
    request: &ContextRequest<'_>,
) -> ContextDecision {
    let vocab = policy.vocab();
    if !Vocab::same(&envelope.ident.vocab, vocab) {
        return ContextDecision {
            verdict: Verdict::Deny,
            reason: reasons::ENVELOPE_POLICY_MISMATCH,
            projected_sensitivity: envelope.sensitivity,
            projected_restrictions: RestrictionSet {
                vocab: Arc::clone(&envelope.ident.vocab),
                bits: envelope.restrictions,
            },
            obligations: ContextObligations::none(Arc::clone(&envelope.ident.vocab)),
        };
    }
    let c = envelope.closure(policy);
    let decision = |verdict, reason, obligations| ContextDecision {
        verdict,
        reason,
        projected_sensitivity: c.sensitivity,
        projected_restrictions: RestrictionSet {
            vocab: Arc::clone(vocab),
            bits: c.restrictions,
        },
        obligations,
    };
    let none = || ContextObligations::none(Arc::clone(vocab));

    let (denying, flow) = match request {
        ContextRequest::Action(a) => (policy.denying_action(a.name, a.tags), is_flow(a.tags)),
        ContextRequest::Call {
            action: a,
            arguments,
        } => {
            let mut covering = policy.denying_action(a.name, a.tags);
            for (i, from) in policy.conditional() {
                if covering.contains(*i) && !arguments.iter().any(|o| o.is_subset(*from)) {
                    let mut off = RestrictionBits::EMPTY;
                    off.insert(*i);
                    covering = covering.minus(off);
                }
            }
            (covering, is_flow(a.tags))
        }
        ContextRequest::Delegation { target, .. } => (
            policy.denying_delegation(*target),
            *target == TrustZone::External,
        ),
    };
    let covering = denying.intersect(c.restrictions);

    // 1. explicit restrictions are hard gates.
    if let Some(name) = covering
        .minus(policy.escalating())
        .first()
        .and_then(|i| vocab.restrictions.get(i))
    {
        return decision(
            Verdict::Deny,
            Reason::with_param(reasons::RESTRICTED_BY, name.as_str()),
            none(),
        );
    }

    // 2. no restricted authority leaves the enforcement boundary.
    if let Some(a) = restricted_authority_leaving(policy, request, c.restrictions) {
        return decision(
            Verdict::Deny,
            Reason::with_param(reasons::DELEGATION_DENIED, a.name),
            none(),
        );
    }

    let obligations = ContextObligations {
        vocab: Arc::clone(vocab),
        result_labels: (c.sensitivity >= policy.inherit_threshold())
            .then(|| c.labels.union(c.derived)),
        inherit: c.restrictions,
    };

    // 3. restrictions that ask a human.
    if let Some(name) = covering
        .intersect(policy.escalating())
        .first()
        .and_then(|i| vocab.restrictions.get(i))
    {
        return decision(
            Verdict::Escalate,
            Reason::with_param(reasons::RESTRICTED_BY, name.as_str()),
            obligations,
        );
    }

    // 4. combinations no rule covers.
    if let Some(v) = policy.backstop(&c) {
        return match v {
            BackstopVerdict::Escalate => decision(
                Verdict::Escalate,
                reasons::AGGREGATION_BACKSTOP,
                obligations,
            ),
            BackstopVerdict::Deny => decision(Verdict::Deny, reasons::AGGREGATION_BACKSTOP, none()),
        };
    }

    // 5. flows out at or above the floor that no restriction covers.
    if flow && c.sensitivity >= policy.restricted_floor() {
        return decision(Verdict::Escalate, reasons::SENSITIVITY_FLOOR, obligations);
    }

    // 6.
    if obligations.is_empty() {
        decision(Verdict::Allow, reasons::CONTEXT_ALLOWED, obligations)
    } else {
        decision(
            Verdict::Constrain,
            reasons::CONTEXT_CONSTRAINED,
            obligations,
        )
    }
}

/// For an external delegation, the first action the delegatee can perform
/// that `restrictions` deny: beyond the boundary nothing enforces them.
fn restricted_authority_leaving<'r>(
    policy: &ContextPolicy,
    request: &ContextRequest<'r>,
    restrictions: RestrictionBits,
) -> Option<&'r ActionRef<'r>> {
    let ContextRequest::Delegation {
        target: TrustZone::External,
        delegatee_authority,
    } = request
    else {
        return None;
    };
    delegatee_authority.iter().find(|a| {
        !policy
            .denying_action(a.name, a.tags)
            .intersect(restrictions)
            .is_empty()
    })
}

/// The authority a delegatee may exercise on delegated work:
/// `delegator ∩ delegatee ∩ org_policy`, minus every action a restriction of
/// `envelope` (projected) denies. Delegating to a more privileged agent
/// therefore never adds authority (no laundering).
///
/// Pass the child envelope built by [`Envelope::delegate`] (or the parent:
/// the child is at least as restrictive). `tags_of` gives an action's
/// catalogue tags; an action it does not know is dropped (unknown fails
/// closed), as is everything when the envelope belongs to another policy
/// vocabulary. The sensitivity floor does not remove authority: it escalates
/// each flow when it is attempted.
pub fn effective_delegated_authority<'t, F>(
    delegator: &BTreeSet<ActionName>,
    delegatee: &BTreeSet<ActionName>,
    envelope: &Envelope,
    policy: &ContextPolicy,
    tags_of: F,
    org_policy: &BTreeSet<ActionName>,
) -> BTreeSet<ActionName>
where
    F: Fn(&ActionName) -> Option<&'t [Label]>,
{
    if envelope.check_policy(policy).is_err() {
        return BTreeSet::new();
    }
    // Only restrictions that always deny remove authority: an escalating
    // one, or one applied by origin, is decided on each call the child
    // makes (its envelope inherits them).
    let restrictions = envelope
        .closure(policy)
        .restrictions
        .minus(policy.not_always_denying());
    delegator
        .iter()
        .filter(|a| delegatee.contains(*a) && org_policy.contains(*a))
        .filter(|a| {
            tags_of(a).is_some_and(|tags| {
                policy
                    .denying_action(a.as_str(), tags)
                    .intersect(restrictions)
                    .is_empty()
            })
        })
        .cloned()
        .collect()
}
