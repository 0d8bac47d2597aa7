//! Why a `context:` section does not compile.

use super::Sensitivity;
use crate::ids::Label;

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
    /// A restriction applied by origin that also denies delegation.
    #[error(
        "restriction `{restriction}`: `when_arguments_from` applies to actions; a restriction that denies delegation cannot be conditional"
    )]
    ConditionalDelegation {
        /// The restriction.
        restriction: Label,
    },
    /// A declaration of a built-in restriction that would weaken it.
    #[error(
        "restriction `{restriction}` is built in and always denies; declare a restriction of another name to escalate or to apply by origin"
    )]
    BuiltinWeakened {
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
