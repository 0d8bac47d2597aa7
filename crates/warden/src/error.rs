//! The engine's error type: why a request could not be decided or carried
//! out. Denials are never errors.
//!
//! Every decision (allow, constrain, deny, escalate) comes back inside an
//! outcome value ([`crate::Registration`], [`crate::WriteOutcome`],
//! [`crate::StepGate`], ...), recorded before it is returned. An
//! `EngineError` is typed by who is at fault:
//!
//! - the caller: [`EngineError::Input`], [`EngineError::Sop`],
//!   [`EngineError::Envelope`], [`EngineError::NotFound`],
//!   [`EngineError::Conflict`], [`EngineError::MissingHandlers`] (a 4xx in
//!   the server; nothing changed);
//! - the deployment: [`EngineError::Unavailable`] (storage cannot be reached
//!   now: retry later, a 503) and [`EngineError::Internal`] (a bug or damaged
//!   state, a 500).

use std::fmt;

use warden_core::envelope::EnvelopeError;
use warden_core::sop::SopError;
use warden_store::StoreError;

/// What kind of thing a [`EngineError::NotFound`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// An agent.
    Agent,
    /// A run (or a run of another agent).
    Run,
    /// A step of a run.
    Step,
    /// A context envelope.
    Envelope,
    /// The envelope of a run: the run exists but has none (the policy has
    /// no `context:` section, or the run predates it).
    RunEnvelope,
    /// An escalation.
    Escalation,
    /// A token.
    Token,
    /// A tool-call session (or one the caller may not see).
    Session,
    /// A call of a session.
    Call,
}

impl Missing {
    /// The lowercase name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Missing::Agent => "agent",
            Missing::Run => "run",
            Missing::Step => "step",
            Missing::Envelope => "envelope",
            Missing::RunEnvelope => "run envelope",
            Missing::Escalation => "escalation",
            Missing::Token => "token",
            Missing::Session => "session",
            Missing::Call => "call",
        }
    }
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`EngineError::Conflict`] conflicts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKind {
    /// A run id reused with a different SOP or by another agent.
    RunId,
    /// An envelope kept changing under concurrent writers; retry.
    EnvelopeContention,
    /// A unique key that already exists.
    Duplicate,
    /// A session id reused with other content, or for another agent.
    SessionId,
    /// A call id reused with another action or other arguments.
    CallId,
    /// A result reported for a call that was not allowed (or is still
    /// waiting for review).
    CallNotAllowed,
    /// A second, different result for a call.
    CallResult,
    /// A session kept changing under concurrent calls; retry.
    SessionContention,
    /// A run's step is leased to another worker (it began the step and
    /// has not completed it): not yours to complete.
    StepInProgress,
}

/// What is wrong with an input field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Empty (or only white space) where text is required.
    Empty,
    /// Longer than `max` bytes.
    TooLong {
        /// The limit, in bytes.
        max: usize,
    },
    /// Contains a control character.
    ControlCharacter,
    /// Anything else, said in words.
    Other(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Empty => f.write_str("must not be empty"),
            Problem::TooLong { max } => write!(f, "is longer than {max} bytes"),
            Problem::ControlCharacter => f.write_str("contains a control character"),
            Problem::Other(s) => f.write_str(s),
        }
    }
}

/// A failure whose cause is kept for the log, not for the caller.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an engine call failed (as opposed to being denied).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A request field is malformed or inconsistent; nothing changed.
    #[error("invalid `{field}`: {problem}")]
    Input {
        /// The field.
        field: String,
        /// What is wrong with it.
        problem: Problem,
    },
    /// The SOP could not be parsed; nothing changed.
    #[error(transparent)]
    Sop(#[from] SopError),
    /// A session's plan could not be parsed; nothing changed.
    #[error(transparent)]
    Plan(#[from] warden_core::plan::PlanError),
    /// An envelope transition or restore was refused (an unknown
    /// restriction, a stored record the policy cannot read).
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The named thing does not exist (or is not the caller's to see).
    #[error("unknown {what} `{id}`")]
    NotFound {
        /// What kind of thing.
        what: Missing,
        /// Its id as given.
        id: String,
    },
    /// The request conflicts with existing state; nothing changed.
    #[error("{}", conflict_message(*.kind, .id))]
    Conflict {
        /// With what.
        kind: ConflictKind,
        /// The id involved.
        id: String,
    },
    /// Handlers missing after admission; nothing ran (an embedding program
    /// registered too few handlers; recorded).
    #[error("missing handlers: {}", .0.join(", "))]
    MissingHandlers(Vec<String>),
    /// Storage cannot be reached or cannot take writes right now; nothing
    /// is known to have changed. Retry later.
    #[error("storage unavailable: {0}")]
    Unavailable(#[source] StoreError),
    /// An internal failure (damaged state, a failed backend, a poisoned
    /// lock). The cause is for the log.
    #[error("internal failure: {0}")]
    Internal(#[source] Cause),
}

fn conflict_message(kind: ConflictKind, id: &str) -> String {
    match kind {
        ConflictKind::RunId => format!("run `{id}` already exists with a different sop"),
        ConflictKind::EnvelopeContention => {
            format!("envelope `{id}` kept changing concurrently; retry")
        }
        ConflictKind::Duplicate => format!("`{id}` already exists"),
        ConflictKind::SessionId => {
            format!("session `{id}` already exists with other content")
        }
        ConflictKind::CallId => {
            format!("call `{id}` was already decided with another action or other arguments")
        }
        ConflictKind::CallNotAllowed => format!("call `{id}` was not allowed: nothing to record"),
        ConflictKind::CallResult => format!("call `{id}` already has a different result"),
        ConflictKind::SessionContention => {
            format!("session `{id}` kept changing concurrently; retry")
        }
        ConflictKind::StepInProgress => {
            format!("step `{id}` is in progress under another worker's lease")
        }
    }
}

impl EngineError {
    /// A malformed field.
    pub fn input(field: impl Into<String>, problem: impl fmt::Display) -> Self {
        EngineError::Input {
            field: field.into(),
            problem: Problem::Other(problem.to_string()),
        }
    }

    /// A missing thing.
    pub fn not_found(what: Missing, id: impl fmt::Display) -> Self {
        EngineError::NotFound {
            what,
            id: id.to_string(),
        }
    }

    /// An internal failure with a message.
    pub fn internal(message: impl fmt::Display) -> Self {
        EngineError::Internal(message.to_string().into())
    }

    /// Whether retrying later may succeed ([`EngineError::Unavailable`]).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, EngineError::Unavailable(_))
    }
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Duplicate { id, .. } => EngineError::Conflict {
                kind: ConflictKind::Duplicate,
                id,
            },
            e @ (StoreError::Unavailable { .. } | StoreError::ReadOnly { .. }) => {
                EngineError::Unavailable(e)
            }
            other => EngineError::Internal(Box::new(other)),
        }
    }
}

impl From<warden_core::hierarchy::HierarchyError> for EngineError {
    /// A hierarchy error outside a registration (stored agents the policy
    /// cannot load, a reconciliation that would break the hierarchy) is
    /// damaged state, not a client mistake: registrations report theirs
    /// in [`crate::Registration::Refused`].
    fn from(e: warden_core::hierarchy::HierarchyError) -> Self {
        EngineError::Internal(Box::new(e))
    }
}
