//! # warden
//!
//! The Warden engine: `warden-core`'s pure rules applied to a
//! `warden-store` backend, with the decision log written for every decision
//! and handlers executed only for admitted steps.
//!
//! ```text
//! caller ──► Engine ──► core rules (pure) ──► Decision
//!              │                                  │
//!              └──► Store (state + audit, one transaction)
//! ```
//!
//! The engine keeps the agent hierarchy (with cached effective capabilities)
//! in memory for the hot paths and persists every change before applying it
//! to the cache. Memory records, runs and the decision log live in the store.
//! Several engines (servers) may share one store: each applies the others'
//! hierarchy changes to its cache with [`Engine::apply_agents`] or
//! [`Engine::reload_agents`] without recording them again, and looks an
//! agent it has not cached up in the store before refusing a request that
//! names it ([`Engine::refresh_agent`]).
//! Identity is an argument of every call: the server derives it from the
//! bearer token; an embedding program from its own runtime context. Nothing
//! in a request body or SOP can change it. Bearer tokens are engine
//! operations too ([`Engine::issue_token`], [`Engine::revoke_token`],
//! [`Engine::ensure_operator_token`]); [`Engine::authenticate`] turns a
//! token into a caller (or a refusal, with the store's
//! `requests_per_second` and `tree_requests_per_second` buckets, shared by
//! every engine on the store; a
//! throttled agent's refusals are recorded once per window and counted),
//! and [`Engine::read_agent`],
//! [`Engine::run_visibility`] and [`Engine::read_envelope`] decide and
//! record who may see what. The decision log is read and verified through
//! [`Engine::audit_page`] and [`Engine::verify_audit`];
//! [`Engine::checkpoint_audit`] signs its head.
//!
//! With a `context:` section in the policy, every run carries a context
//! envelope that accumulates what its steps produce and gates the next step,
//! delegated children inherit it, escalated requests wait in a review queue,
//! and only listed declassifiers can lower it: the semantics are in
//! [`context`].

mod access;
mod admission;
mod agents;
mod audit_log;
mod clock;
pub mod context;
mod engine;
pub mod envelope_keys;
mod error;
mod execute;
mod memory;
pub mod sessions;
mod steps;
mod tickets;
mod tokens;
pub mod tool_listing;

pub use access::{
    AgentRead, AgentVisibility, Authentication, EnvelopeRead, RouteRefusal, RunAccess,
    RunVisibility,
};
pub use admission::{Admission, PlanCheck};
pub use agents::{
    AgentView, AppliedAgents, RegisterAgent, Registration, RegistrationRefusal, Revocation,
};
pub use audit_log::{AuditProblem, AuditVerification};
pub use clock::{Clock, ManualClock, SystemClock};
pub use context::{DeclassifyOutcome, DelegationOptions, ReviewOutcome, check_text};
pub use engine::{Caller, Engine, engine_reasons, ops};
pub use error::{Cause, ConflictKind, EngineError, Missing, Problem};
pub use execute::{
    Handler, HandlerCall, HandlerError, HandlerFuture, Handlers, RunReport, StepReport,
};
pub use memory::{
    DeleteResult, ReadOutcome, ReadStatus, ResolvedValue, WriteOutcome, WriteRequest, WriteStatus,
    quota_reason,
};
pub use sessions::{
    CallAnswer, CallResult, IndexSummary, OpenSession, ProposedCall, SessionOpening,
    SessionRefusal, SessionView, session_reasons,
};
pub use steps::{Completion, StepGate, StepRefusal, StepResult};
pub use tokens::{
    GENERATED_OPERATOR_TOKEN_ID, IssuedToken, MAX_TOKEN_LEN, MIN_OPERATOR_TOKEN_LEN,
    OperatorTokenError, OperatorTokenSource, TOKEN_PREFIX, TokenIssue, TokenRevocation, hash_token,
};
pub use warden_core;
pub use warden_store;
