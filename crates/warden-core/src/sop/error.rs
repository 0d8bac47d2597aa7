//! Why an SOP was refused: located, with stable codes.

use std::fmt;

/// Why an identifier field was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentifierProblem {
    /// It is empty.
    Empty,
    /// It is longer than the limit.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// It holds a character outside `[A-Za-z0-9._:-]`.
    BadChar {
        /// The character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
}

/// What is wrong, without the where (see [`SopError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SopErrorKind {
    /// Not JSON, or trailing input after it.
    MalformedJson {
        /// Line of the problem (1-based).
        line: usize,
        /// Column of the problem (1-based).
        column: usize,
        /// The JSON parser's message.
        message: String,
    },
    /// A key appears twice in one object.
    DuplicateField,
    /// A field the SOP format does not have.
    UnknownField,
    /// A field of the wrong JSON type.
    WrongType {
        /// What the format requires (`a string`).
        expected: &'static str,
        /// What was there (`a number`).
        found: &'static str,
    },
    /// A required field is absent.
    MissingField,
    /// `version` is below 1 or above `u32::MAX`.
    InvalidVersion,
    /// `steps` is empty.
    EmptySop,
    /// More steps than [`SopLimits::max_steps`](super::SopLimits::max_steps).
    TooManySteps {
        /// How many there are.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A step's arguments encode to more than
    /// [`SopLimits::max_argument_bytes`](super::SopLimits::max_argument_bytes).
    ArgumentsTooLarge {
        /// The limit.
        max: usize,
    },
    /// A step's arguments nest deeper than [`SopLimits::max_depth`](super::SopLimits::max_depth).
    NestingTooDeep {
        /// The limit.
        max: usize,
    },
    /// An invalid `sop_id`, `action` or non-empty `step_id`.
    InvalidIdentifier(IdentifierProblem),
}

impl SopErrorKind {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            SopErrorKind::MalformedJson { .. } => "malformed_json",
            SopErrorKind::DuplicateField => "duplicate_field",
            SopErrorKind::UnknownField => "unknown_field",
            SopErrorKind::WrongType { .. } => "wrong_type",
            SopErrorKind::MissingField => "missing_field",
            SopErrorKind::InvalidVersion => "invalid_version",
            SopErrorKind::EmptySop => "empty_sop",
            SopErrorKind::TooManySteps { .. } => "too_many_steps",
            SopErrorKind::ArgumentsTooLarge { .. } => "arguments_too_large",
            SopErrorKind::NestingTooDeep { .. } => "nesting_too_deep",
            SopErrorKind::InvalidIdentifier(_) => "invalid_identifier",
        }
    }
}

impl fmt::Display for SopErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SopErrorKind::MalformedJson { message, .. } => write!(f, "malformed json: {message}"),
            SopErrorKind::DuplicateField => f.write_str("field appears more than once"),
            SopErrorKind::UnknownField => f.write_str("unknown field"),
            SopErrorKind::WrongType { expected, found } => {
                write!(f, "expected {expected}, found {found}")
            }
            SopErrorKind::MissingField => f.write_str("required field is missing"),
            SopErrorKind::InvalidVersion => {
                write!(f, "version must be an integer from 1 to {}", u32::MAX)
            }
            SopErrorKind::EmptySop => f.write_str("an sop needs at least one step"),
            SopErrorKind::TooManySteps { count, max } => {
                write!(f, "{count} steps, the limit is {max}")
            }
            SopErrorKind::ArgumentsTooLarge { max } => {
                write!(f, "arguments encode to more than {max} bytes")
            }
            SopErrorKind::NestingTooDeep { max } => {
                write!(f, "arguments nest deeper than {max} levels")
            }
            SopErrorKind::InvalidIdentifier(IdentifierProblem::Empty) => {
                f.write_str("identifier is empty")
            }
            SopErrorKind::InvalidIdentifier(IdentifierProblem::TooLong { len, max }) => {
                write!(f, "identifier is {len} bytes long, the limit is {max}")
            }
            SopErrorKind::InvalidIdentifier(IdentifierProblem::BadChar { ch, at }) => write!(
                f,
                "identifier contains `{}` at byte {at}; allowed are A-Z a-z 0-9 . _ : -",
                ch.escape_debug()
            ),
        }
    }
}

/// Why an SOP was refused: a located [`SopErrorKind`].
///
/// Displayed as one line naming the field: ``field `steps[3].step_id`:
/// identifier is empty``, or `sop: ...` for the document as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SopError {
    field: String,
    kind: SopErrorKind,
}

impl std::error::Error for SopError {}

impl fmt::Display for SopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "sop: {}", self.kind)
        } else {
            write!(f, "field `{}`: {}", self.field, self.kind)
        }
    }
}

impl SopError {
    pub(super) fn new(field: impl Into<String>, kind: SopErrorKind) -> Self {
        Self {
            field: field.into(),
            kind,
        }
    }

    /// The field the error is about: `sop_id`, `steps[3].step_id`,
    /// `steps[0].arguments.a[2]`; `""` for the document as a whole. Keys
    /// that are not plain words (`[A-Za-z0-9_-]`, at most 64 bytes) are
    /// written as JSON strings in brackets, `["like this"]`, cut to 64 bytes
    /// with a `…` after the closing quote.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn kind(&self) -> &SopErrorKind {
        &self.kind
    }

    /// The stable snake_case code of [`SopError::kind`].
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
}
