//! Why a plan was refused: located, with stable codes.

use std::fmt;

use crate::sop::SopError;

/// What is wrong with a plan beyond the SOP format (see [`PlanError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanErrorKind {
    /// A step id is empty: every planned step must be nameable.
    EmptyStepId,
    /// A step id repeats an earlier one.
    DuplicateStepId,
    /// An object holds `$bind` and other keys (the field names the first
    /// other key).
    BindingNotAlone,
    /// The arguments object itself is a binding: bind its members instead.
    BindingWholeArguments,
    /// A key inside a binding the format does not have.
    BindingUnknownField,
    /// A binding field of the wrong JSON type.
    BindingWrongType {
        /// What the format requires (`a string`).
        expected: &'static str,
        /// What was there.
        found: &'static str,
    },
    /// `step` names no earlier step of the plan.
    BindingUnknownStep {
        /// The step id as written.
        step: String,
        /// It names this step itself or a later one (rather than none).
        not_earlier: bool,
    },
    /// `from` is empty.
    BindingEmptyFrom,
    /// `from` lists `none`.
    BindingOriginNone,
    /// An entry of `from` is not an origin.
    BindingUnknownOrigin {
        /// The entry as written.
        origin: String,
    },
    /// `otherwise` or `match` holds a value the format does not have.
    BindingInvalidValue {
        /// The values allowed (`` `escalate` or `deny` ``).
        allowed: &'static str,
    },
}

impl PlanErrorKind {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            PlanErrorKind::EmptyStepId => "empty_step_id",
            PlanErrorKind::DuplicateStepId => "duplicate_step_id",
            PlanErrorKind::BindingNotAlone => "binding_not_alone",
            PlanErrorKind::BindingWholeArguments => "binding_whole_arguments",
            PlanErrorKind::BindingUnknownField => "binding_unknown_field",
            PlanErrorKind::BindingWrongType { .. } => "binding_wrong_type",
            PlanErrorKind::BindingUnknownStep { .. } => "binding_unknown_step",
            PlanErrorKind::BindingEmptyFrom => "binding_empty_from",
            PlanErrorKind::BindingOriginNone => "binding_origin_none",
            PlanErrorKind::BindingUnknownOrigin { .. } => "binding_unknown_origin",
            PlanErrorKind::BindingInvalidValue { .. } => "binding_invalid_value",
        }
    }
}

impl fmt::Display for PlanErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanErrorKind::EmptyStepId => f.write_str("a planned step needs a step id"),
            PlanErrorKind::DuplicateStepId => f.write_str("step id repeats an earlier step's"),
            PlanErrorKind::BindingNotAlone => {
                f.write_str("an object holding `$bind` may hold no other key")
            }
            PlanErrorKind::BindingWholeArguments => {
                f.write_str("the arguments object cannot be bound as a whole; bind its members")
            }
            PlanErrorKind::BindingUnknownField => f.write_str(
                "unknown binding field; a binding has `step`, `from`, `otherwise` and `match`",
            ),
            PlanErrorKind::BindingWrongType { expected, found } => {
                write!(f, "expected {expected}, found {found}")
            }
            PlanErrorKind::BindingUnknownStep { step, not_earlier } => {
                if *not_earlier {
                    write!(
                        f,
                        "step `{}` is not earlier than this one; a binding names an earlier step",
                        step.escape_debug()
                    )
                } else {
                    write!(f, "no step `{}` in this plan", step.escape_debug())
                }
            }
            PlanErrorKind::BindingEmptyFrom => {
                f.write_str("`from` is empty, so no value could ever be vouched for")
            }
            PlanErrorKind::BindingOriginNone => {
                f.write_str("`none` cannot vouch for a value; list where it may come from")
            }
            PlanErrorKind::BindingUnknownOrigin { origin } => write!(
                f,
                "unknown origin `{}`; expected user, trusted, untrusted, memory or plan",
                origin.escape_debug()
            ),
            PlanErrorKind::BindingInvalidValue { allowed } => write!(f, "expected {allowed}"),
        }
    }
}

/// Why a plan was refused.
///
/// Displayed as one line naming the field: ``field
/// `steps[1].arguments.recipient.$bind.step`: no step `fetch` in this
/// plan``.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The plan is not a well-formed SOP (its error, as is).
    #[error(transparent)]
    Sop(#[from] SopError),
    /// The plan is a well-formed SOP, but not a valid plan.
    #[error("field `{field}`: {kind}")]
    Plan {
        /// Where: `steps[1].step_id`, `steps[0].arguments.to.$bind.from[1]`.
        field: String,
        /// What is wrong.
        kind: PlanErrorKind,
    },
}

impl PlanError {
    pub(super) fn at(field: impl Into<String>, kind: PlanErrorKind) -> Self {
        PlanError::Plan {
            field: field.into(),
            kind,
        }
    }

    /// The field the error is about (as [`SopError::field`] writes them;
    /// inside a binding `….$bind.step`, `….$bind.from[0]`).
    pub fn field(&self) -> &str {
        match self {
            PlanError::Sop(e) => e.field(),
            PlanError::Plan { field, .. } => field,
        }
    }

    /// The stable snake_case code: an [`SopError::code`] or a
    /// [`PlanErrorKind::code`].
    pub fn code(&self) -> &'static str {
        match self {
            PlanError::Sop(e) => e.code(),
            PlanError::Plan { kind, .. } => kind.code(),
        }
    }
}
