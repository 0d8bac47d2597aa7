//! # warden-store
//!
//! The one storage trait every Warden backend implements ([`Store`]), the
//! records it stores, an in-memory implementation ([`MemoryStore`]) and the
//! conformance suite that every backend must pass (module `conformance`,
//! behind the `conformance` feature).
//!
//! Design rules every backend follows:
//!
//! - **A decision and the state change it describes commit together.** Every
//!   mutating method takes the audit entries to append and commits them in
//!   the same transaction as the change. Methods whose outcome is decided
//!   inside the transaction (a compare-and-set, say) take an [`AuditFn`] that
//!   turns the outcome into the entries to append, so a conflict is recorded
//!   as a conflict and a write as a write, never one for the other.
//! - **Compare-and-set is atomic** in the backend: the check of the revision
//!   and the mutation are one statement or one serialised transaction.
//! - **The audit log is a hash chain** (see `warden_core::audit`); the backend
//!   assigns sequence numbers and links each entry to the previous one while
//!   holding the write lock, so the chain has one total order.
//! - **Envelope versions only go up.** [`Store::put_envelope`] is a
//!   compare-and-set on the latest version, so two concurrent folds of one
//!   envelope cannot lose either: the loser re-reads and folds again.
//! - **Escalations resolve exactly once** and an approval is consumed
//!   exactly once ([`Store::resolve_escalation`],
//!   [`Store::consume_escalation`]), each a single atomic state change.
//! - **Acknowledged means durable**: a method that returned `Ok` has its
//!   effect on stable storage (for the in-memory store: in memory).
//!
//! This crate depends on no database driver; backends live in their own
//! crates. Every backend runs the conformance suite with one line
//! (`conformance_tests!`, with the `conformance` feature enabled from its
//! dev-dependencies); [`verify`] checks any backend's audit chain
//! against its recorded head and an external [`HeadAnchor`].

mod error;
pub mod forward;
mod keys;
mod memory_store;
mod quota;
pub mod rates;
mod records;
mod sessions;

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod verify;

use std::collections::BTreeSet;
use std::future::Future;

use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, Digest};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, CallId, Key, Namespace, RunId, SessionId, StepId};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;

pub use error::{BoxError, Entity, StoreError, Unavailability};

pub use keys::{SigningKeyRecord, check_signing_key};
pub use memory_store::MemoryStore;
pub use quota::{QuotaKind, RunsInFlight, StorageQuota, decide_put, encoded_len, run_finished};
pub use rates::{RateBuckets, RateCharge, TakeTokens};
pub use records::*;
pub use sessions::*;
pub use verify::{HeadAnchor, VerifyError, VerifyReport, verify_store};
/// The core crate, for the types [`forward_store!`] names.
#[doc(hidden)]
pub use warden_core as __core;

/// Turns the outcome of an operation decided inside a transaction into the
/// audit entries committed with it.
pub type AuditFn<T> = Box<dyn FnOnce(&T) -> Vec<AuditDraft> + Send>;

/// The [`AuditFn`] of a put ([`Store::put_record`]), which may be called
/// more than once: a backend may decide a put in a transaction that it
/// then rolls back and decide it again in another (PostgreSQL's writers
/// send a group's row changes, audit entries and `COMMIT` together, and run
/// the group again one put at a time if a statement failed). Each call
/// gets the outcome of one attempt; only the drafts of the attempt that
/// commits are recorded.
pub type PutAuditFn = Box<dyn Fn(&PutOutcome) -> Vec<AuditDraft> + Send + Sync>;

/// An [`AuditFn`] for [`Store::create_run`] that appends `drafts` when the
/// run is created and nothing otherwise (an existing run, a refusal).
pub fn audit_if_created(drafts: Vec<AuditDraft>) -> AuditFn<CreateRun> {
    Box::new(move |outcome| match outcome {
        CreateRun::Created => drafts,
        CreateRun::Existing(_) | CreateRun::OverQuota { .. } => Vec::new(),
    })
}

/// Storage for everything Warden decides about.
///
/// All methods are `async` and return `Send` futures so the server can call
/// them from any task.
pub trait Store: Send + Sync + 'static {
    // ----- agents -----

    /// Every registered agent, in registration order.
    fn load_agents(&self) -> impl Future<Output = Result<Vec<StoredAgent>, StoreError>> + Send;

    /// Register an agent. `Duplicate` if the id exists.
    fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Set the status of several agents (revocation of a subtree).
    fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Replace an agent's declared capabilities.
    fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    // ----- tokens -----

    /// Store a token (its hash only). `Duplicate` if the hash or id exists.
    fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Find a token by the hash of its secret.
    fn find_token(
        &self,
        hash: Digest,
    ) -> impl Future<Output = Result<Option<TokenRecord>, StoreError>> + Send;

    /// Revoke a token by id; `false` if there is no such (active) token.
    fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    // ----- memory -----

    /// The records at `namespace.key` owned by any of `owners`, in the order
    /// of `owners` (owners without a record are skipped).
    fn get_records(
        &self,
        namespace: Namespace,
        key: Key,
        owners: Vec<AgentId>,
    ) -> impl Future<Output = Result<Vec<MemoryRecord>, StoreError>> + Send;

    /// Create or update one record with compare-and-set semantics (see
    /// `warden_core::memory::apply_put`) under the owner's `quota`,
    /// atomically with its audit entries: the decision is [`decide_put`]
    /// on the current record and the owner's usage, both read in the
    /// write's transaction, and a backend serialises one owner's
    /// quota-checked writes so the limit is exact across servers.
    /// [`PutOutcome::OverQuota`] writes nothing; `audit` records it.
    fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: PutAuditFn,
    ) -> impl Future<Output = Result<PutOutcome, StoreError>> + Send;

    /// Delete one record, optionally only at an expected revision.
    fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> impl Future<Output = Result<DeleteOutcome, StoreError>> + Send;

    /// How many records and value bytes `owner` holds.
    fn owner_usage(&self, owner: AgentId)
    -> impl Future<Output = Result<Usage, StoreError>> + Send;

    // ----- audit -----

    /// Append entries (in order) to the chain; returns the new head.
    fn append_audit(
        &self,
        drafts: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<ChainHead, StoreError>> + Send;

    /// Up to `limit` entries with `seq > after`, ascending.
    fn audit_page(
        &self,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AuditEntry>, StoreError>> + Send;

    /// The chain's current head (count = number of entries).
    fn audit_head(&self) -> impl Future<Output = Result<ChainHead, StoreError>> + Send;

    // ----- runs -----

    /// Create a run, or return the existing one with the same id (the caller
    /// compares SOP hashes; an existing run is returned whatever the
    /// quota). With `limit`, a create that would put more than `limit.max`
    /// runs of the same agent in flight is [`CreateRun::OverQuota`] and
    /// stores nothing; the count is taken in the create's transaction,
    /// serialised per agent. `audit` gets every outcome; its entries commit
    /// with it.
    fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> impl Future<Output = Result<CreateRun, StoreError>> + Send;

    /// A run with every recorded step outcome.
    fn get_run(
        &self,
        run_id: RunId,
    ) -> impl Future<Output = Result<Option<RunState>, StoreError>> + Send;

    /// Record a step's outcome exactly once: a second call returns the first
    /// outcome and appends nothing. [`Store::record_step_as`] without a
    /// holder: refused while anyone's lease holds the step.
    fn record_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<RecordStep, StoreError>> + Send {
        self.record_step_as(run_id, step_id, outcome, None, audit)
    }

    /// Record a step's outcome exactly once, as `holder`: while a lease
    /// live at `outcome.recorded_at` holds the step for another holder (or
    /// for anyone, when `holder` is `None`) the outcome is
    /// [`RecordStep::LeaseHeld`] and nothing is stored or appended; a
    /// second record returns the first outcome and appends nothing.
    /// Decided in one transaction (compare-and-set on the step's row).
    fn record_step_as(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        holder: Option<String>,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<RecordStep, StoreError>> + Send;

    /// Take the lease of a step that has no outcome, compare-and-set in the
    /// store (so it holds across servers sharing a database and across
    /// restarts): granted when the step has no lease, or its lease is
    /// `lease.holder`'s (renewed), or has lapsed at `lease.acquired_at`
    /// (taken over); otherwise [`LeaseStep::Held`] with the live lease, or
    /// [`LeaseStep::Recorded`] with the outcome, and nothing changes. Of
    /// concurrent callers with different holders exactly one is granted.
    /// `audit` gets the outcome; an unknown run or step is `NotFound`.
    fn lease_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        lease: StepLease,
        audit: AuditFn<LeaseStep>,
    ) -> impl Future<Output = Result<LeaseStep, StoreError>> + Send;

    // ----- context envelopes -----

    /// Store a new version of an envelope, atomically with the entries
    /// `audit` returns for the outcome.
    ///
    /// Every version is kept (receipts refer to `(envelope_id, version)`).
    /// With `expected_version: None` the envelope must not exist yet (any
    /// first version); with `Some(v)` its latest stored version must be `v`
    /// and `record.version` must be above `v`. Otherwise nothing is stored
    /// and the outcome is [`PutEnvelope::Conflict`] with the latest version.
    /// SQL: `INSERT INTO envelope_versions (envelope_id, version, record)`
    /// guarded by the latest version, in one transaction with the audit rows.
    fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> impl Future<Output = Result<PutEnvelope, StoreError>> + Send;

    /// One version of an envelope (`None`: the latest), if stored.
    fn get_envelope(
        &self,
        envelope_id: EnvelopeId,
        version: Option<u64>,
    ) -> impl Future<Output = Result<Option<EnvelopeRecord>, StoreError>> + Send;

    // ----- escalations -----

    /// Store a new pending escalation, unless an open one (pending or
    /// approved) exists for the same target: then return it and store
    /// nothing. `audit` gets the outcome. `Duplicate` if the id exists.
    fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> impl Future<Output = Result<PutEscalation, StoreError>> + Send;

    /// One escalation.
    fn get_escalation(
        &self,
        escalation_id: String,
    ) -> impl Future<Output = Result<Option<EscalationRecord>, StoreError>> + Send;

    /// Escalations with `status` (every one when `None`), oldest first.
    fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> impl Future<Output = Result<Vec<EscalationRecord>, StoreError>> + Send;

    /// Approve or reject a pending escalation, exactly once: only a
    /// `pending` escalation changes (to `approved` or `rejected`, with `by`,
    /// `at` and the rejection reason); anything else is
    /// [`ResolveEscalation::NotPending`]. `audit` gets the outcome.
    fn resolve_escalation(
        &self,
        escalation_id: String,
        resolution: EscalationResolution,
        by: Subject,
        at: Timestamp,
        audit: AuditFn<ResolveEscalation>,
    ) -> impl Future<Output = Result<ResolveEscalation, StoreError>> + Send;

    /// Use the approval of `target`, exactly once: the `approved`
    /// escalation for exactly this target (its request digest included; if
    /// any) becomes `consumed` at `at` and is returned; two concurrent
    /// callers never both get it. In the same transaction every `pending`
    /// escalation of the same slot ([`EscalationTarget::same_slot`]: other
    /// requests for that child id, run step or call, which can no longer
    /// proceed) is withdrawn ([`ConsumedEscalation::withdraw`]) and returned
    /// with it. `audit` gets the outcome (`None`: nothing was approved,
    /// nothing changed).
    fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<ConsumedEscalation>>,
    ) -> impl Future<Output = Result<Option<ConsumedEscalation>, StoreError>> + Send;

    // ----- sessions -----

    /// Create a session (with no calls) and, in the same transaction, the
    /// first version of its envelope (`envelope`, whose id is the
    /// session's `envelope_id`) and the note of an imported envelope
    /// (`import`, decided by [`decide_import`] against every earlier import
    /// of the same `(issuer, envelope_id)`). An existing session id is
    /// [`CreateSession::Existing`] and a refused import
    /// [`CreateSession::ImportRefused`]: nothing is stored. `audit` gets
    /// every outcome; its entries commit with it.
    ///
    /// A create that contradicts itself is an error before anything is
    /// looked up, and stores and appends nothing ([`check_create`]): an
    /// envelope given for a session without an `envelope_id`, or whose id
    /// is not the session's, is [`StoreError::Invalid`]; two starting calls
    /// with one id or one `seq` are [`StoreError::Duplicate`] of
    /// [`Entity::Call`]. A session naming an `envelope_id` without giving
    /// the envelope shares an envelope already stored; when none is, the
    /// create is [`StoreError::NotFound`] of that envelope
    /// ([`missing_envelope`]) and stores nothing.
    fn create_session(
        &self,
        state: SessionState,
        envelope: Option<EnvelopeRecord>,
        import: Option<EnvelopeImport>,
        audit: AuditFn<CreateSession>,
    ) -> impl Future<Output = Result<CreateSession, StoreError>> + Send;

    /// A session with its source index and every call, by `seq`.
    fn get_session(
        &self,
        session_id: SessionId,
    ) -> impl Future<Output = Result<Option<SessionState>, StoreError>> + Send;

    /// A session's row, source index and number of calls, with the one
    /// call `call_id` (if given and decided), from one snapshot: what
    /// deciding a call needs, at a cost that does not grow with the
    /// session's calls. Agrees with [`Store::get_session`]. When
    /// `known_revision` is the stored revision (the caller holds that
    /// revision's decoded index), the head's `sources` is `None` and the
    /// bytes are neither read out nor copied; otherwise they are there
    /// ([`sources_unless_known`]).
    fn get_session_head(
        &self,
        session_id: SessionId,
        call_id: Option<CallId>,
        known_revision: Option<u64>,
    ) -> impl Future<Output = Result<Option<SessionHead>, StoreError>> + Send;

    /// Apply one change to a session if its stored revision is
    /// `expected_revision` (and `update.session.revision` is one more):
    /// the row, the source index when given, and one call inserted or
    /// replaced by `call_id`, atomically with the entries `audit` returns.
    /// Otherwise [`UpdateSession::Conflict`] and nothing changes.
    ///
    /// A call's `seq` is unique within its session: a call whose `seq`
    /// another call of the session holds (a new call, or a replaced one
    /// moved onto it) is [`StoreError::Duplicate`] of [`Entity::Call`]
    /// ([`seq_taken`]), and nothing changes, the row included, nor is
    /// anything appended. (The engine gives a new call the session's call
    /// count from the head its compare-and-set expects, and a re-decided
    /// call keeps its own.)
    fn update_session(
        &self,
        update: SessionUpdate,
        expected_revision: u64,
        audit: AuditFn<UpdateSession>,
    ) -> impl Future<Output = Result<UpdateSession, StoreError>> + Send;

    /// Up to `limit` sessions (of `agent`, or every one), without their
    /// index or calls, in creation order: the order in which the creates
    /// were stored (a backend's insertion sequence, never `created_at`,
    /// which clocks of several servers need not agree on), oldest first.
    /// Two creates never share a place, so the order has no ties.
    fn list_sessions(
        &self,
        agent: Option<AgentId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SessionRecord>, StoreError>> + Send;

    // ----- request rates -----

    /// Charge one request to every bucket in `charges` at `now`, or to
    /// none: [`rates::take_tokens`] over the stored bucket states, decided
    /// atomically (across servers sharing the database too), so concurrent
    /// requests never take more than a bucket's burst plus its refill. A
    /// bucket never charged before is full. Charges that are empty, or name
    /// one bucket twice, are [`StoreError::Invalid`] and charge nothing
    /// ([`rates::check_charges`]). Nothing is recorded: the caller records
    /// refusals.
    fn take_request_tokens(
        &self,
        charges: Vec<RateCharge>,
        now: Timestamp,
    ) -> impl Future<Output = Result<TakeTokens, StoreError>> + Send;

    // ----- envelope signing keys -----

    /// Every stored envelope signing key, by generation (ascending; the
    /// last is the current key).
    fn signing_keys(
        &self,
    ) -> impl Future<Output = Result<Vec<SigningKeyRecord>, StoreError>> + Send;

    /// Store `key` at its generation, create-only, with `audit`: `true` if
    /// stored; `false` if that generation is taken (another server's key
    /// won), and then nothing is stored or appended. A generation of 0 is
    /// [`StoreError::Invalid`] ([`check_signing_key`]).
    fn insert_signing_key(
        &self,
        key: SigningKeyRecord,
        audit: Vec<AuditDraft>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
