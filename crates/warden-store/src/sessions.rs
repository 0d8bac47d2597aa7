//! Tool-call sessions: what a backend stores for them.
//!
//! A session is one row that changes by compare-and-set on its `revision`
//! ([`Store::update_session`](crate::Store::update_session)), holding the
//! session record, the serialised source index (keyed fingerprints, never
//! tool output; a recorded result appends its delta, [`IndexChange`]) and,
//! beside it, one row per call keyed by `(session_id, call_id)`. The session's context envelope lives with every
//! other envelope (`put_envelope`); its first version is created in the
//! session's own transaction.
//!
//! An imported envelope ([`EnvelopeImport`]) is checked against every import
//! of the same `(issuer, envelope_id)` inside the create's transaction, so a
//! replayed or downgraded envelope is refused before anything is created,
//! across servers sharing one database too.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden_core::audit::Digest;
use warden_core::decision::{Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, Sensitivity};
use warden_core::ids::{ActionName, AgentId, CallId, Label, SessionId, StepId};
use warden_core::time::Timestamp;

/// Whether a session still takes calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Calls are decided.
    Open,
    /// Cancelled: later calls are refused; final.
    Cancelled,
}

impl SessionStatus {
    /// The status's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Open => "open",
            SessionStatus::Cancelled => "cancelled",
        }
    }
}

/// Who cancelled a session, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionClosure {
    /// The agent itself, an ancestor or the operator.
    pub by: Subject,
    /// When.
    pub at: Timestamp,
    /// The reason given (checked free text).
    pub reason: String,
}

/// The plan a session was admitted with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPlan {
    /// The plan as submitted (the SOP form with bindings).
    pub plan: Value,
    /// Hash of its canonical JSON.
    pub hash: Digest,
    /// Per planned step (in plan order), the call that used it, if any.
    pub used_by: Vec<Option<CallId>>,
}

/// An envelope a session was opened from: a signed export of another
/// deployment (or this one), verified against a trusted issuer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeImport {
    /// The issuer id the bundle trusts.
    pub issuer: String,
    /// The imported envelope's id (in the issuer's deployment).
    pub envelope_id: EnvelopeId,
    /// Its version.
    pub version: u64,
    /// Its restrictions.
    pub restrictions: BTreeSet<Label>,
    /// Its aggregate sensitivity.
    pub sensitivity: Sensitivity,
    /// The session it opened.
    pub session_id: SessionId,
    /// When it was imported.
    pub at: Timestamp,
}

/// Why an import was refused by the store (decided in the create's
/// transaction against earlier imports of the same envelope).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImportRefusal {
    /// This exact `(issuer, envelope_id, version)` was imported before.
    Replayed {
        /// The session it opened then.
        session_id: SessionId,
    },
    /// A higher version was imported before, or this version drops a
    /// restriction the latest one imported carried. (Sensitivity may drop
    /// between versions: that is how a signed declassification looks from
    /// outside, as `warden_core::envelope::sign` says.)
    Downgraded {
        /// The latest version imported before.
        seen_version: u64,
    },
}

/// A session: who it belongs to and the state its calls change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session id.
    pub session_id: SessionId,
    /// The agent whose calls it decides.
    pub agent: AgentId,
    /// Who opened it (the agent, an ancestor or the operator).
    pub opened_by: Subject,
    /// When.
    pub created_at: Timestamp,
    /// The bundle version it was opened under.
    pub policy_version: String,
    /// Open or cancelled.
    pub status: SessionStatus,
    /// Set when cancelled.
    pub closure: Option<SessionClosure>,
    /// The session's context envelope (with a `context:` policy).
    pub envelope_id: Option<EnvelopeId>,
    /// The admitted plan, if any.
    pub plan: Option<StoredPlan>,
    /// The envelope it was opened from, if any.
    pub imported: Option<EnvelopeImport>,
    /// Hash of the canonical JSON of the trusted inputs.
    pub trusted_inputs_hash: Digest,
    /// Starts at 1; every update adds one.
    pub revision: u64,
}

/// What became of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Allowed; its result is not recorded yet.
    Allowed,
    /// Refused; final.
    Denied,
    /// Waiting for a reviewer; the same call again proceeds once approved.
    Escalated,
    /// Allowed and its result recorded; final.
    Completed,
    /// Allowed and the tool reported an error; final.
    Failed,
}

impl CallStatus {
    /// The status's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Allowed => "allowed",
            CallStatus::Denied => "denied",
            CallStatus::Escalated => "escalated",
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
        }
    }
}

/// One call of a session, as decided (and, later, completed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The call id (an idempotency key).
    pub call_id: CallId,
    /// Position in the session, from 0, in decision order.
    pub seq: u64,
    /// The action.
    pub action: ActionName,
    /// Hash of the canonical JSON of the arguments (a retry with other
    /// arguments is a conflict).
    pub arguments_hash: Digest,
    /// The verdict.
    pub verdict: Verdict,
    /// The reason.
    pub reason: Reason,
    /// The decision's detail as answered to the caller: obligations and the
    /// provenance of every argument checked (origins and sources, never
    /// recorded text).
    pub detail: Value,
    /// The planned step it used, if the session has a plan.
    pub plan_step: Option<StepId>,
    /// The escalation holding it, when escalated.
    pub escalation_id: Option<String>,
    /// Where the call is.
    pub status: CallStatus,
    /// When it was decided (last).
    pub decided_at: Timestamp,
    /// Hash of the canonical JSON of the recorded result (or error).
    pub result_hash: Option<Digest>,
    /// Labels folded from the result.
    pub result_labels: Vec<Label>,
    /// When the result was recorded.
    pub completed_at: Option<Timestamp>,
}

/// A session with everything it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    /// The session row.
    pub session: SessionRecord,
    /// The serialised source index (`warden_core::provenance::SourceIndex`).
    pub sources: Vec<u8>,
    /// Its calls, by `seq`.
    pub calls: Vec<CallRecord>,
}

impl SessionState {
    /// The call with `call_id`, if decided.
    pub fn call(&self, call_id: &CallId) -> Option<&CallRecord> {
        self.calls.iter().find(|c| &c.call_id == call_id)
    }
}

/// What deciding one call needs of a session, without its other calls
/// ([`Store::get_session_head`](crate::Store::get_session_head)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHead {
    /// The session row.
    pub session: SessionRecord,
    /// The serialised source index (`warden_core::provenance::SourceIndex`);
    /// `None` exactly when the caller said it holds the index of the
    /// revision stored (`known_revision`), so the bytes are not copied.
    pub sources: Option<Vec<u8>>,
    /// How many calls the session holds (the `seq` of the next one).
    pub calls: u64,
    /// The call asked for, if it was decided.
    pub call: Option<CallRecord>,
}

impl SessionHead {
    /// The head of `state` with the call `call_id` (if given and decided),
    /// its index bytes left out when `known_revision` is the session's
    /// revision.
    pub fn of(state: &SessionState, call_id: Option<&CallId>, known_revision: Option<u64>) -> Self {
        Self {
            session: state.session.clone(),
            sources: sources_unless_known(&state.session, &state.sources, known_revision),
            calls: u64::try_from(state.calls.len()).unwrap_or(u64::MAX),
            call: call_id.and_then(|id| state.call(id)).cloned(),
        }
    }
}

/// A head's `sources`: the bytes, unless `known_revision` is `session`'s
/// revision. The one rule every backend applies.
pub fn sources_unless_known(
    session: &SessionRecord,
    sources: &[u8],
    known_revision: Option<u64>,
) -> Option<Vec<u8>> {
    (known_revision != Some(session.revision)).then(|| sources.to_vec())
}

/// Whether a create is consistent in itself, before anything is looked up:
/// an envelope given must be the session's (`envelope_id` set, and the
/// same id), and the calls it starts with (normally none) have distinct
/// ids and positions. Every backend checks this first and then, for a
/// session naming an envelope without giving it, that the envelope is
/// stored ([`missing_envelope`]). Refused: [`StoreError::Invalid`](crate::StoreError::Invalid), or
/// [`StoreError::Duplicate`](crate::StoreError::Duplicate) of [`Entity::Call`](crate::Entity::Call);
/// nothing is stored.
pub fn check_create(
    state: &SessionState,
    envelope: Option<&warden_core::envelope::EnvelopeRecord>,
) -> Result<(), crate::StoreError> {
    let session = &state.session;
    let id = &session.session_id;
    match (envelope, &session.envelope_id) {
        (Some(e), None) => {
            return Err(crate::StoreError::invalid(
                crate::Entity::Session,
                id,
                format!(
                    "envelope `{}` given for a session without an envelope id",
                    e.envelope_id
                ),
            ));
        }
        (Some(e), Some(named)) if &e.envelope_id != named => {
            return Err(crate::StoreError::invalid(
                crate::Entity::Session,
                id,
                format!(
                    "envelope `{}` given for a session whose envelope is `{named}`",
                    e.envelope_id
                ),
            ));
        }
        _ => {}
    }
    let mut ids = BTreeSet::new();
    let mut seqs = BTreeSet::new();
    for call in &state.calls {
        if !ids.insert(&call.call_id) {
            return Err(crate::StoreError::duplicate(
                crate::Entity::Call,
                format!("{id}/{}", call.call_id),
            ));
        }
        if !seqs.insert(call.seq) {
            return Err(seq_taken(id, call.seq));
        }
    }
    Ok(())
}

/// The error of a create naming an envelope it neither gives nor finds
/// stored: [`StoreError::NotFound`](crate::StoreError::NotFound) of the
/// envelope.
pub fn missing_envelope(envelope_id: &EnvelopeId) -> crate::StoreError {
    crate::StoreError::not_found(crate::Entity::Envelope, envelope_id)
}

/// The error of a call whose `seq` another call of the session holds:
/// [`StoreError::Duplicate`](crate::StoreError::Duplicate) of
/// [`Entity::Call`](crate::Entity::Call) `session/#seq`.
pub fn seq_taken(session_id: &SessionId, seq: u64) -> crate::StoreError {
    crate::StoreError::duplicate(crate::Entity::Call, format!("{session_id}/#{seq}"))
}

/// Outcome of [`Store::create_session`](crate::Store::create_session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateSession {
    /// Stored (with its first envelope version, and the import noted).
    Created,
    /// A session with this id exists; nothing stored.
    Existing(Box<SessionState>),
    /// The imported envelope was refused; nothing stored.
    ImportRefused(ImportRefusal),
}

/// One change of a session, applied by compare-and-set on its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionUpdate {
    /// The new session row; its `revision` is the expected one plus one.
    pub session: SessionRecord,
    /// How the source index changes, when it does.
    pub sources: Option<IndexChange>,
    /// A call to insert, or to replace (same `call_id`).
    pub call: Option<CallRecord>,
}

/// How an update changes a session's stored source index. The index is
/// one byte string to its readers ([`SessionState::sources`],
/// [`SessionHead::sources`]); how a backend keeps it is its own business,
/// but an append costs the size of what is appended, not of the index
/// (a recorded result adds a delta of its own fields,
/// `warden_core::provenance::SourceIndex::delta_since`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexChange {
    /// The index is now these bytes.
    Replace(Vec<u8>),
    /// These bytes follow the stored ones.
    Append(Vec<u8>),
}

impl IndexChange {
    /// Apply the change to the stored bytes `sources` (what every backend
    /// reads back after it).
    pub fn apply_to(self, sources: &mut Vec<u8>) {
        match self {
            IndexChange::Replace(bytes) => *sources = bytes,
            IndexChange::Append(bytes) => sources.extend_from_slice(&bytes),
        }
    }
}

/// Outcome of [`Store::update_session`](crate::Store::update_session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateSession {
    /// Applied.
    Updated,
    /// The stored revision is not the expected one (`None`: no such
    /// session); nothing changed.
    Conflict {
        /// The stored revision.
        current: Option<u64>,
    },
}

/// Decides an import against the latest earlier import of the same
/// `(issuer, envelope_id)` (`None`: first import). The one rule every
/// backend applies.
pub fn decide_import(
    import: &EnvelopeImport,
    earlier: &[EnvelopeImport],
) -> Result<(), ImportRefusal> {
    if let Some(same) = earlier.iter().find(|e| e.version == import.version) {
        return Err(ImportRefusal::Replayed {
            session_id: same.session_id.clone(),
        });
    }
    let Some(latest) = earlier.iter().max_by_key(|e| e.version) else {
        return Ok(());
    };
    if latest.version > import.version || !import.restrictions.is_superset(&latest.restrictions) {
        return Err(ImportRefusal::Downgraded {
            seen_version: latest.version,
        });
    }
    Ok(())
}

/// An [`AuditFn`](crate::AuditFn) for
/// [`Store::create_session`](crate::Store::create_session) that appends
/// `drafts` when the session is created and nothing otherwise.
pub fn audit_if_session_created(
    drafts: Vec<warden_core::audit::AuditDraft>,
) -> crate::AuditFn<CreateSession> {
    Box::new(move |outcome| match outcome {
        CreateSession::Created => drafts,
        CreateSession::Existing(_) | CreateSession::ImportRefused(_) => Vec::new(),
    })
}
