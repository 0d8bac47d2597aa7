//! The engine's error type: what went wrong other than a denial.
//!
//! Denials are [`Decision`](warden_core::decision::Decision)s inside the
//! outcome types; an `EngineError` means the request could not be decided or
//! carried out (malformed input, unknown run, storage failure).

use warden_core::decision::Decision;
use warden_core::envelope::EnvelopeError;
use warden_core::hierarchy::HierarchyError;
use warden_core::lockdown::LockdownError;
use warden_core::sop::SopError;
use warden_store::StoreError;

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The agent hierarchy refused the change.
    #[error(transparent)]
    Hierarchy(#[from] HierarchyError),
    /// Delegation lockdown refused the child; the decision was recorded.
    #[error(transparent)]
    Lockdown(#[from] LockdownError),
    /// The SOP could not be parsed.
    #[error(transparent)]
    Sop(#[from] SopError),
    /// The caller may not do this; the decision was recorded.
    #[error("denied: {}", .0.reason)]
    Denied(Box<Decision>),
    /// No such agent.
    #[error("unknown agent `{0}`")]
    UnknownAgent(String),
    /// No such run (or not the caller's).
    #[error("unknown run `{0}`")]
    UnknownRun(String),
    /// No such step in the run.
    #[error("unknown step `{step}` in run `{run}`")]
    UnknownStep {
        /// Run id.
        run: String,
        /// Step id.
        step: String,
    },
    /// A run id reused with a different SOP or by another agent.
    #[error("run `{0}` already exists with a different sop")]
    RunIdConflict(String),
    /// Handlers missing after admission; nothing ran.
    #[error("missing handlers: {}", .0.join(", "))]
    MissingHandlers(Vec<String>),
    /// A request field is invalid.
    #[error("invalid `{field}`: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The request was held for human review; nothing happened yet. The
    /// decision (verdict `escalate`) was recorded.
    #[error("escalated for review: {} (escalation `{escalation_id}`)", .decision.reason)]
    Escalated {
        /// The decision.
        decision: Box<Decision>,
        /// The pending escalation to approve or reject.
        escalation_id: String,
    },
    /// An envelope transition or restore was refused (unknown restriction,
    /// a stored record the policy cannot read).
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The run has no context envelope (the policy has no `context:`
    /// section, or the run predates it).
    #[error("run `{0}` has no context envelope")]
    NoEnvelope(String),
    /// A stored reference names an envelope the store does not hold.
    #[error("unknown envelope `{0}`")]
    UnknownEnvelope(String),
    /// An envelope kept changing under concurrent writers; nothing changed.
    #[error("envelope `{0}` kept changing concurrently; retry")]
    EnvelopeContention(String),
    /// No such escalation.
    #[error("unknown escalation `{0}`")]
    UnknownEscalation(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Internal state was poisoned by a panic elsewhere.
    #[error("engine state is unavailable")]
    Poisoned,
}
