//! Context envelopes in the engine: accumulation across a run, inheritance
//! down delegation, escalation review, declassification and export.
//!
//! The rules are the core's (`warden_core::envelope`); this module applies
//! them to stored state and records every decision and transition. Nothing
//! here exists when the policy has no `context:` section: no envelopes, no
//! extra audit entries, the engine behaves as without this module.
//!
//! # Where envelopes live
//!
//! - **Every run has its own envelope** (`RunRecord::envelope_id`), opened at
//!   admission: an empty root (`public`, workflow = the run id), or, when the
//!   acting agent holds an inherited envelope, one built from it with
//!   `Envelope::delegate` (same restrictions, sensitivity at least as high,
//!   one delegation hop deeper).
//! - **A delegated child holds an inherited envelope**
//!   (`StoredAgent::envelope_id`), built with `Envelope::delegate` from the
//!   run it was delegated from (`DelegationOptions::from_run`), else from its
//!   parent's inherited envelope. Every registration path
//!   (`register_agent`, `delegate`, `delegate_from_run`, `delegate_with`)
//!   goes through `register_agent_with`, so inheritance cannot be skipped.
//! - **Every version is stored** (`Store::put_envelope`, compare-and-set on
//!   the version), and every transition is one audit entry whose details are
//!   the core's `Transition` (labels, restriction and rule names, levels,
//!   versions; never data) with its `classification`: the higher of the two
//!   levels, since an entry naming restricted labels is itself restricted.
//!
//! # Decisions
//!
//! - `begin_step` decides the step with `decide` against the run's envelope
//!   as it is after every earlier step's fold, with every triggered rule
//!   projected, so a restriction the previous step implied binds this one.
//!   `allow` proceeds (`step_allowed`); `constrain` proceeds with the
//!   obligations (`context_constrained`); `deny` records the step `Denied`
//!   and stops the run; `escalate` refuses it for now and opens (or finds)
//!   the pending escalation of that run and step ([`crate::StepGate::Escalated`]).
//! - `complete_step` folds the reported `result_labels` and the action's
//!   catalogue `output_labels` (so an adapter that under-reports lowers
//!   nothing), on success and on failure alike (a failed step may still
//!   have produced something). The outcome's labels also carry the
//!   `ResultLabels` obligation (every label of the envelope the step ran
//!   under, when it was at or above `inherit_threshold`): the engine adds
//!   them whether or not the caller reported them. Between a step's begin
//!   and its completion nothing else folds into the run's envelope (steps
//!   run in order), so the obligation is re-derived at completion; only a
//!   declassification in between changes it, and that is an explicit,
//!   authorised lowering.
//! - Completion folds first and records the outcome second. A crash in
//!   between leaves the envelope raised and the step open: the retried
//!   completion folds again (labels are a set; only the version moves) and
//!   records. Two racing completions of one step may both fold, so the
//!   envelope may hold the losing report's labels too: more, never fewer.
//!   Concurrent transitions of one envelope (a fold and a declassification)
//!   never lose one another: each is a compare-and-set on the version,
//!   retried on conflict.
//! - An unknown result label fails the completion: the step is recorded
//!   `Failed` with error `unknown_label:<first unknown>`, its result is
//!   dropped, the envelope is unchanged (nothing is lowered, nothing is
//!   guessed) and the run stops.
//! - A completion for a step the run's restrictions deny (the gate was
//!   bypassed) still folds its labels, but records the step `Denied`
//!   (`completed_without_gate`) and stops the run.
//! - Delegation is decided with `decide(…, ContextRequest::Delegation)`
//!   against the source envelope, the delegatee's authority being the
//!   capabilities it would hold. `InheritRestrictions` is enforced by the
//!   construction itself: the child's envelope comes from
//!   `Envelope::delegate`.
//!
//! # Escalations
//!
//! An escalated step or delegation opens an [`EscalationRecord`] (one open
//! per target). The operator, or an active ancestor of the requesting agent
//! (never the requester itself), approves or rejects it. An approval is
//! consumed by the next request for exactly that target, which proceeds once
//! (`escalation_approved`); the one after escalates again. A rejection of a
//! step records it `Denied` (`escalation_rejected`) and stops the run.
//!
//! Admission uses the run's starting envelope too: a step its restrictions
//! already deny is rejected with the SOP (restrictions never shrink, so it
//! could never run). Everything else about accumulation is decided step by
//! step: an admitted run can still be stopped by what its own steps produce.
//!
//! # Declassification and export
//!
//! [`Engine::declassify`] is the only way down: allowed to the agents the
//! bundle's `context.declassifiers` names, with a justification, recorded
//! either way. [`Engine::export_envelope`] signs the run's latest envelope
//! for a trust boundary; [`Engine::receipt`] issues an opaque receipt.

mod declassify;
mod delegation;
mod escalation;
mod import;
mod run;

pub(crate) use run::ContextGate;

pub use crate::agents::DelegationOptions;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Obligation, Verdict};
use warden_core::envelope::{
    ActionRef, ContextDecision, ContextPolicy, Envelope, EnvelopeId, EnvelopeRecord, Transition,
};
use warden_core::ids::{Label, RunId};
use warden_core::time::Timestamp;
use warden_store::{EscalationRecord, PutEnvelope, RunRecord, Store};

use crate::engine::{Caller, Engine, random_id};
use crate::error::{EngineError, Missing, Problem};

/// How often a compare-and-set on an envelope is retried before giving up
/// with [`EngineError::EnvelopeContention`].
pub(super) const MAX_ENVELOPE_ATTEMPTS: usize = 16;

/// The outcome of [`Engine::declassify`]: the decision (recorded) and, when
/// allowed, the new envelope version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeclassifyOutcome {
    /// The decision.
    pub decision: Decision,
    /// The declassified envelope, when allowed.
    pub envelope: Option<EnvelopeRecord>,
}

/// The outcome of approving or rejecting an escalation: the decision
/// (recorded) and the escalation as it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewOutcome {
    /// The decision (`escalation_approved`, `escalation_rejected`, or a deny
    /// such as `escalation_not_pending`).
    pub decision: Decision,
    /// The escalation after the review.
    pub escalation: EscalationRecord,
}

/// A child's envelope, ready to store with the child.
pub(crate) struct ChildContext {
    /// Envelopes to create, in order (an empty root first, if one was made).
    pub(crate) records: Vec<EnvelopeRecord>,
    /// The child's inherited envelope.
    pub(crate) envelope_id: EnvelopeId,
    /// The registration's verdict (`allow` or `constrain`).
    pub(crate) verdict: Verdict,
    /// The delegation's obligations.
    pub(crate) obligations: Vec<Obligation>,
    /// Details for the registration's audit entry.
    pub(crate) details: Value,
}

/// What folding a step's labels did.
pub(crate) enum Folded {
    /// Folded: the envelope's new version and the outcome's labels.
    Done {
        /// The new version.
        after: Envelope,
        /// The transition.
        transition: Box<Transition>,
        /// Reported ∪ declared output ∪ the `ResultLabels` obligation.
        labels: Vec<Label>,
        /// Whether the run's restrictions deny the step (gate bypassed).
        bypassed: bool,
    },
    /// Some labels are unknown; nothing changed.
    Unknown(Vec<Label>),
}

pub(super) fn identifier_error(field: &str, e: warden_core::ids::IdentifierError) -> EngineError {
    EngineError::input(field, e)
}

pub(crate) fn new_envelope_id() -> Result<EnvelopeId, EngineError> {
    EnvelopeId::parse(&random_id("env")?).map_err(|e| identifier_error("envelope_id", e))
}

/// The details of a decision made against `envelope`.
pub(super) fn context_details(envelope: &Envelope, cd: &ContextDecision) -> Value {
    json!({
        "envelope_id": envelope.envelope_id(),
        "envelope_version": envelope.version(),
        "classification": cd.projected_sensitivity,
        "context_reason": cd.reason,
    })
}

/// The audit details of a transition, plus `extra`.
pub(super) fn transition_details(t: &Transition, extra: Value) -> Value {
    let mut details = serde_json::to_value(t).unwrap_or(Value::Null);
    if let (Value::Object(d), Value::Object(more)) = (&mut details, extra) {
        d.extend(more);
    }
    details
}

/// Check a free-text field a person reads (a justification, a rejection
/// reason): not empty, at most `MAX_JUSTIFICATION_BYTES`, no control
/// characters. The one implementation: the engine checks rejection
/// reasons with it, and a server checks a declassification's justification
/// with it before asking (an embedding program gets the recorded
/// `declassification_invalid` decision instead).
pub fn check_text(field: &str, text: &str) -> Result<(), EngineError> {
    let problem = if text.trim().is_empty() {
        Problem::Empty
    } else if text.len() > warden_core::envelope::MAX_JUSTIFICATION_BYTES {
        Problem::TooLong {
            max: warden_core::envelope::MAX_JUSTIFICATION_BYTES,
        }
    } else if text.chars().any(char::is_control) {
        Problem::ControlCharacter
    } else {
        return Ok(());
    };
    Err(EngineError::Input {
        field: field.into(),
        problem,
    })
}

impl<S: Store> Engine<S> {
    /// The compiled `context:` section, if the policy has one.
    pub fn context_policy(&self) -> Option<&ContextPolicy> {
        self.policy().context.as_ref()
    }

    /// The catalogue description of an action (unknown actions have no
    /// tags; they are never admitted anyway).
    pub(crate) fn action_ref<'a>(&'a self, name: &'a str) -> ActionRef<'a> {
        ActionRef {
            name,
            tags: self
                .policy()
                .catalogue
                .by_name(name)
                .map_or(&[], |a| a.tags()),
        }
    }

    pub(crate) fn output_labels(&self, action: &str) -> &[Label] {
        self.policy()
            .catalogue
            .by_name(action)
            .map_or(&[], |a| a.output_labels())
    }

    // ------------------------------------------------------------------
    // Reading envelopes
    // ------------------------------------------------------------------

    /// One version of an envelope (`None`: the latest), as stored.
    pub async fn envelope(
        &self,
        envelope_id: &EnvelopeId,
        version: Option<u64>,
    ) -> Result<Option<EnvelopeRecord>, EngineError> {
        Ok(self
            .inner
            .store
            .get_envelope(envelope_id.clone(), version)
            .await?)
    }

    /// The latest version of a run's envelope (`None`: the run has none).
    pub async fn run_envelope(
        &self,
        run_id: &RunId,
    ) -> Result<Option<EnvelopeRecord>, EngineError> {
        let state = self
            .inner
            .store
            .get_run(run_id.clone())
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::Run, run_id.to_string()))?;
        match state.run.envelope_id {
            None => Ok(None),
            Some(id) => self
                .envelope(&id, None)
                .await?
                .map(Some)
                .ok_or_else(|| EngineError::not_found(Missing::Envelope, id.to_string())),
        }
    }

    /// The latest version of `envelope_id`, restored under the policy.
    pub(crate) async fn load_envelope(
        &self,
        policy: &ContextPolicy,
        envelope_id: &EnvelopeId,
    ) -> Result<Envelope, EngineError> {
        let record = self
            .envelope(envelope_id, None)
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::Envelope, envelope_id.to_string()))?;
        Ok(Envelope::restore(&record, policy)?)
    }

    pub(super) async fn run_envelope_id(
        &self,
        run_id: &RunId,
    ) -> Result<(RunRecord, EnvelopeId), EngineError> {
        let state = self
            .inner
            .store
            .get_run(run_id.clone())
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::Run, run_id.to_string()))?;
        let id = state
            .run
            .envelope_id
            .clone()
            .ok_or_else(|| EngineError::not_found(Missing::RunEnvelope, run_id.to_string()))?;
        Ok((state.run, id))
    }

    /// Store the first version of a new envelope (no audit entry: the
    /// caller records its opening with what references it).
    pub(crate) async fn create_envelope(&self, record: EnvelopeRecord) -> Result<(), EngineError> {
        let id = record.envelope_id.to_string();
        match self
            .inner
            .store
            .put_envelope(record, None, Box::new(|_| Vec::new()))
            .await?
        {
            PutEnvelope::Written => Ok(()),
            PutEnvelope::Conflict { .. } => {
                Err(warden_store::StoreError::duplicate(warden_store::Entity::Envelope, id).into())
            }
        }
    }

    pub(crate) fn transition_draft(
        &self,
        subject: &Caller,
        operation: &str,
        t: &Transition,
        extra: Value,
        now: Timestamp,
    ) -> AuditDraft {
        let d = self.decision(
            subject,
            Verdict::Allow,
            t.reason(),
            operation,
            t.envelope_id().to_string(),
            now,
        );
        self.draft(&d).with_details(transition_details(t, extra))
    }
}
