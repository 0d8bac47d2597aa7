//! The raw `context:` section as authored: serde and JSON Schema, unknown
//! fields rejected.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Sensitivity;
use crate::ids::{ActionName, AgentId, Label};
use crate::provenance::Origin;

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

/// What a restriction covers, and what it answers. At least one of
/// `denies_tags`, `denies_actions`, `denies_delegation` must be given.
///
/// ```yaml
/// restrictions:
///   # The per-value form of "no export after untrusted content": an
///   # export escalates only when one of its argument values came from
///   # nothing but untrusted content (or from nowhere: composed by the
///   # model); an export of what the user gave proceeds.
///   untrusted_export: {denies_tags: [export], when_arguments_from: [untrusted, none], verdict: escalate}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestrictionSpec {
    /// What the restriction answers for what it covers: `deny` (the
    /// default) or `escalate` (a human decides; an approval lets the call
    /// proceed once).
    #[serde(default, skip_serializing_if = "RestrictionVerdict::is_deny")]
    pub verdict: RestrictionVerdict,
    /// The per-value form: the restriction covers a call of an action it
    /// names only when some value of the call's arguments comes from
    /// nothing but these origins (every origin found for the value is
    /// listed), e.g. `[untrusted, none]`. A run's step and an SOP at
    /// admission are plan literals (origin `plan`); a request whose
    /// argument origins are unknown is covered (fails closed). Applies to
    /// actions only, not to delegation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when_arguments_from: Vec<Origin>,
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

/// What a restriction answers for what it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestrictionVerdict {
    /// Refuse (`restricted_by:<restriction>`).
    #[default]
    Deny,
    /// Hold for human review (`restricted_by:<restriction>`).
    Escalate,
}

impl RestrictionVerdict {
    /// Whether it is `deny`.
    pub fn is_deny(&self) -> bool {
        *self == RestrictionVerdict::Deny
    }
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
