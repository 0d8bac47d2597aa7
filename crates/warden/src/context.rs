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
//!   the pending escalation of that run and step ([`StepGate::Escalated`]).
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

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Obligation, Reason, Subject, Verdict};
use warden_core::envelope::sign::{Receipt, SignedEnvelope, SigningKey, sign};
use warden_core::envelope::{
    ActionRef, ContextDecision, ContextPolicy, ContextRequest, Envelope, EnvelopeError, EnvelopeId,
    EnvelopeRecord, IssuerId, Sensitivity, Transition, TrustZone, WorkflowId, decide,
    effective_delegated_authority, reasons as context_reasons,
};
use warden_core::ids::{ActionName, AgentId, Label, RunId};
use warden_core::preflight::Preflight;
use warden_core::time::Timestamp;
use warden_store::{
    EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget, PutEnvelope,
    PutEscalation, RecordStep, ResolveEscalation, RunRecord, RunStep, StepOutcome, StepStatus,
    Store,
};

use crate::engine::{Caller, Engine, RegisterAgent, engine_reasons as er, ops, random_id};
use crate::error::EngineError;
use crate::runs::StepGate;

/// How often a compare-and-set on an envelope is retried before giving up
/// with [`EngineError::EnvelopeContention`].
const MAX_ENVELOPE_ATTEMPTS: usize = 16;

/// The context part of a registration: where the child's envelope comes
/// from and what the delegation is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationOptions {
    /// Inherit the envelope of this run (a run of the parent).
    #[serde(default)]
    pub from_run: Option<RunId>,
    /// Where the child runs; `None` is internal (inside this deployment).
    #[serde(default)]
    pub zone: Option<TrustZone>,
    /// Restrictions the child gets on top of the inherited ones.
    #[serde(default)]
    pub restrictions: Vec<Label>,
    /// Pass the sensitivity and restrictions but not the labels (the child
    /// receives a reduced payload).
    #[serde(default)]
    pub redact_labels: bool,
}

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

fn identifier_error(field: &str, e: warden_core::ids::IdentifierError) -> EngineError {
    EngineError::Invalid {
        field: field.into(),
        message: e.to_string(),
    }
}

fn new_envelope_id() -> Result<EnvelopeId, EngineError> {
    EnvelopeId::parse(&random_id("env")?).map_err(|e| identifier_error("envelope_id", e))
}

/// The details of a decision made against `envelope`.
fn context_details(envelope: &Envelope, cd: &ContextDecision) -> Value {
    json!({
        "envelope_id": envelope.envelope_id(),
        "envelope_version": envelope.version(),
        "classification": cd.projected_sensitivity,
        "context_reason": cd.reason,
    })
}

/// The audit details of a transition, plus `extra`.
fn transition_details(t: &Transition, extra: Value) -> Value {
    let mut details = serde_json::to_value(t).unwrap_or(Value::Null);
    if let (Value::Object(d), Value::Object(more)) = (&mut details, extra) {
        d.extend(more);
    }
    details
}

/// Whether a context denial can never be lifted (restrictions never
/// shrink, so a `restricted_by` denial is permanent).
fn is_permanent(cd: &ContextDecision) -> bool {
    cd.verdict == Verdict::Deny && cd.reason.kind() == context_reasons::RESTRICTED_BY
}

fn check_text(field: &str, text: &str) -> Result<(), EngineError> {
    let invalid = |message: &str| EngineError::Invalid {
        field: field.into(),
        message: message.into(),
    };
    if text.trim().is_empty() {
        return Err(invalid("must not be empty"));
    }
    if text.len() > warden_core::envelope::MAX_JUSTIFICATION_BYTES {
        return Err(invalid("is too long"));
    }
    if text.chars().any(char::is_control) {
        return Err(invalid("contains a control character"));
    }
    Ok(())
}

impl<S: Store> Engine<S> {
    /// The compiled `context:` section, if the policy has one.
    pub fn context_policy(&self) -> Option<&ContextPolicy> {
        self.policy().context.as_ref()
    }

    /// The catalogue description of an action (unknown actions have no
    /// tags; they are never admitted anyway).
    fn action_ref<'a>(&'a self, name: &'a str) -> ActionRef<'a> {
        ActionRef {
            name,
            tags: self
                .policy()
                .catalogue
                .by_name(name)
                .map_or(&[], |a| a.tags()),
        }
    }

    fn output_labels(&self, action: &str) -> &[Label] {
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
            .ok_or_else(|| EngineError::UnknownRun(run_id.to_string()))?;
        match state.run.envelope_id {
            None => Ok(None),
            Some(id) => self
                .envelope(&id, None)
                .await?
                .map(Some)
                .ok_or_else(|| EngineError::UnknownEnvelope(id.to_string())),
        }
    }

    /// The latest version of `envelope_id`, restored under the policy.
    async fn load_envelope(
        &self,
        policy: &ContextPolicy,
        envelope_id: &EnvelopeId,
    ) -> Result<Envelope, EngineError> {
        let record = self
            .envelope(envelope_id, None)
            .await?
            .ok_or_else(|| EngineError::UnknownEnvelope(envelope_id.to_string()))?;
        Ok(Envelope::restore(&record, policy)?)
    }

    async fn run_envelope_id(
        &self,
        run_id: &RunId,
    ) -> Result<(RunRecord, EnvelopeId), EngineError> {
        let state = self
            .inner
            .store
            .get_run(run_id.clone())
            .await?
            .ok_or_else(|| EngineError::UnknownRun(run_id.to_string()))?;
        let id = state
            .run
            .envelope_id
            .clone()
            .ok_or_else(|| EngineError::NoEnvelope(run_id.to_string()))?;
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

    fn transition_draft(
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

    // ------------------------------------------------------------------
    // Runs
    // ------------------------------------------------------------------

    /// A new envelope for run `run_id` of `actor`, and the entry recording
    /// its opening. Not stored yet.
    pub(crate) async fn open_run_envelope(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        now: Timestamp,
    ) -> Result<(Envelope, AuditDraft), EngineError> {
        let policy = self
            .context_policy()
            .ok_or_else(|| EngineError::NoEnvelope(run_id.to_string()))?;
        let caller = Caller::Agent(actor.clone());
        let inherited = self.read_state()?.envelopes.get(actor).cloned();
        let id = new_envelope_id()?;
        let extra = json!({"run_id": run_id});
        match inherited {
            Some(source) => {
                let source = self.load_envelope(policy, &source).await?;
                let (envelope, t) = source.delegate(policy, actor.clone(), id, &[], false)?;
                let draft = self.transition_draft(&caller, ops::CONTEXT_OPEN, &t, extra, now);
                Ok((envelope, draft))
            }
            None => {
                let workflow = WorkflowId::parse(run_id.as_str())
                    .map_err(|e| identifier_error("run_id", e))?;
                let envelope = Envelope::root(policy, id, workflow, actor.clone());
                let d = self.decision(
                    &caller,
                    Verdict::Allow,
                    er::CONTEXT_CREATED,
                    ops::CONTEXT_OPEN,
                    envelope.envelope_id().to_string(),
                    now,
                );
                let draft = self.draft(&d).with_details(json!({
                    "run_id": run_id,
                    "envelope_id": envelope.envelope_id(),
                    "workflow_id": envelope.workflow_id(),
                    "agent_id": envelope.agent_id(),
                    "version": envelope.version(),
                    "classification": envelope.aggregate_sensitivity(),
                }));
                Ok((envelope, draft))
            }
        }
    }

    /// Deny, at admission, every step the starting envelope's restrictions
    /// deny: they could never run.
    pub(crate) fn restrict_admission(&self, result: &mut Preflight, envelope: &Envelope) {
        let Some(policy) = self.context_policy() else {
            return;
        };
        for check in result.steps.iter_mut() {
            if !check.decision.permits() {
                continue;
            }
            let cd = decide(
                envelope,
                policy,
                &ContextRequest::Action(self.action_ref(&check.action)),
            );
            if is_permanent(&cd) {
                check.decision.verdict = Verdict::Deny;
                check.decision.reason = cd.reason.clone();
                check.violations.push(cd.reason);
                result.admitted = false;
            }
        }
    }

    /// The context gate of one step, after the structural checks passed.
    /// `None`: the run has no envelope (no context policy).
    pub(crate) async fn gate_step(
        &self,
        actor: &AgentId,
        run: &RunRecord,
        step: &RunStep,
        now: Timestamp,
    ) -> Result<Option<StepGate>, EngineError> {
        let (Some(policy), Some(envelope_id)) = (self.context_policy(), &run.envelope_id) else {
            return Ok(None);
        };
        let caller = Caller::Agent(actor.clone());
        let resource = format!("{}:{}", run.run_id, step.step_id);
        let envelope = self.load_envelope(policy, envelope_id).await?;
        let cd = decide(
            &envelope,
            policy,
            &ContextRequest::Action(self.action_ref(step.action.as_str())),
        );
        let details = context_details(&envelope, &cd);
        let proceed = |decision: Decision| StepGate::Proceed {
            decision,
            operation_id: step.operation_id.clone(),
            action: step.action.clone(),
            arguments: crate::runs::step_arguments(run, &step.step_id),
        };
        match cd.verdict {
            Verdict::Allow | Verdict::Constrain => {
                let reason = if cd.verdict == Verdict::Allow {
                    warden_core::decision::reasons::STEP_ALLOWED
                } else {
                    cd.reason.clone()
                };
                let mut d =
                    self.decision(&caller, cd.verdict, reason, ops::STEP_BEGIN, resource, now);
                d.obligations = cd.obligations.to_vec();
                self.inner
                    .store
                    .append_audit(vec![self.draft(&d).with_details(details)])
                    .await?;
                Ok(Some(proceed(d)))
            }
            Verdict::Deny => {
                let d = self.decision(
                    &caller,
                    Verdict::Deny,
                    cd.reason.clone(),
                    ops::STEP_BEGIN,
                    resource,
                    now,
                );
                self.stop_step(run, step, &d, details, now).await?;
                Ok(Some(StepGate::Refused { decision: d }))
            }
            Verdict::Escalate => {
                let target = EscalationTarget::Step {
                    run_id: run.run_id.clone(),
                    step_id: step.step_id.clone(),
                };
                let obligations = cd.obligations.to_vec();
                let verdict = if obligations.is_empty() {
                    Verdict::Allow
                } else {
                    Verdict::Constrain
                };
                let mut d = self.decision(
                    &caller,
                    verdict,
                    er::ESCALATION_APPROVED,
                    ops::STEP_BEGIN,
                    resource.clone(),
                    now,
                );
                d.obligations = obligations;
                if self
                    .consume_approval(target.clone(), &d, details.clone(), now)
                    .await?
                {
                    return Ok(Some(proceed(d)));
                }
                let (decision, escalation_id) = self
                    .open_escalation(
                        target,
                        &caller,
                        ops::STEP_BEGIN,
                        resource,
                        &envelope,
                        &cd,
                        now,
                    )
                    .await?;
                Ok(Some(StepGate::Escalated {
                    decision,
                    escalation_id,
                }))
            }
        }
    }

    /// Record `step` as denied by `decision` (the run stops).
    async fn stop_step(
        &self,
        run: &RunRecord,
        step: &RunStep,
        decision: &Decision,
        details: Value,
        now: Timestamp,
    ) -> Result<(), EngineError> {
        let outcome = StepOutcome {
            status: StepStatus::Denied,
            result: None,
            error: Some(decision.reason.to_string()),
            labels: Vec::new(),
            recorded_at: now,
        };
        self.inner
            .store
            .record_step(
                run.run_id.clone(),
                step.step_id.clone(),
                outcome,
                vec![self.draft(decision).with_details(details)],
            )
            .await?;
        Ok(())
    }

    /// Fold a completed (or failed) step's labels into its run's envelope,
    /// retrying on concurrent writers. Unknown labels change nothing.
    pub(crate) async fn fold_step(
        &self,
        actor: &AgentId,
        run: &RunRecord,
        step: &RunStep,
        reported: &[Label],
        now: Timestamp,
    ) -> Result<Option<Folded>, EngineError> {
        let (Some(policy), Some(envelope_id)) = (self.context_policy(), &run.envelope_id) else {
            return Ok(None);
        };
        let caller = Caller::Agent(actor.clone());
        let declared = self.output_labels(step.action.as_str());
        let action = self.action_ref(step.action.as_str());
        for _ in 0..MAX_ENVELOPE_ATTEMPTS {
            let before = self.load_envelope(policy, envelope_id).await?;
            let (after, t) = match before.fold(policy, reported, declared) {
                Ok(x) => x,
                Err(EnvelopeError::UnknownLabels { labels }) => {
                    return Ok(Some(Folded::Unknown(labels)));
                }
                Err(e) => return Err(e.into()),
            };
            // The step as the gate saw it: its obligations and whether the
            // run's restrictions deny it outright.
            let cd = decide(&before, policy, &ContextRequest::Action(action));
            let mut labels: BTreeSet<Label> = reported.iter().cloned().collect();
            labels.extend(declared.iter().cloned());
            if let Some(obliged) = cd.obligations.result_labels() {
                labels.extend(obliged.iter().cloned());
            }
            let draft = self.transition_draft(
                &caller,
                ops::CONTEXT_ACCUMULATE,
                &t,
                json!({"run_id": run.run_id, "step_id": step.step_id}),
                now,
            );
            let written = self
                .inner
                .store
                .put_envelope(
                    after.to_record(),
                    Some(before.version()),
                    Box::new(move |o| match o {
                        PutEnvelope::Written => vec![draft],
                        PutEnvelope::Conflict { .. } => Vec::new(),
                    }),
                )
                .await?;
            if written == PutEnvelope::Written {
                return Ok(Some(Folded::Done {
                    after,
                    transition: Box::new(t),
                    labels: labels.into_iter().collect(),
                    bypassed: is_permanent(&cd),
                }));
            }
        }
        Err(EngineError::EnvelopeContention(envelope_id.to_string()))
    }

    // ------------------------------------------------------------------
    // Escalations
    // ------------------------------------------------------------------

    /// Use the approval of `target`, recording `decision` (the request
    /// proceeding) if there was one. Whether there was.
    async fn consume_approval(
        &self,
        target: EscalationTarget,
        decision: &Decision,
        details: Value,
        now: Timestamp,
    ) -> Result<bool, EngineError> {
        let proceed = self.draft(decision).with_details(details);
        let consumed = self.decision(
            &decision.subject,
            Verdict::Allow,
            er::ESCALATION_CONSUMED,
            &decision.operation,
            decision.resource.clone(),
            now,
        );
        let consumed = self.draft(&consumed);
        let used = self
            .inner
            .store
            .consume_escalation(
                target,
                now,
                Box::new(move |o| match o {
                    None => Vec::new(),
                    Some(e) => {
                        let who = json!({
                            "escalation_id": e.escalation_id,
                            "approved_by": e.resolved_by,
                        });
                        vec![
                            consumed.with_details(who.clone()),
                            proceed.with_details(who),
                        ]
                    }
                }),
            )
            .await?;
        Ok(used.is_some())
    }

    /// Hold a request for review: the pending escalation of `target` (a new
    /// one, or the one already open) and the recorded `escalate` decision.
    #[expect(
        clippy::too_many_arguments,
        reason = "the escalation record is built from the request's parts, shared by steps and delegations"
    )]
    async fn open_escalation(
        &self,
        target: EscalationTarget,
        caller: &Caller,
        operation: &str,
        resource: String,
        envelope: &Envelope,
        cd: &ContextDecision,
        now: Timestamp,
    ) -> Result<(Decision, String), EngineError> {
        let mut d = self.decision(
            caller,
            Verdict::Escalate,
            cd.reason.clone(),
            operation,
            resource.clone(),
            now,
        );
        d.obligations = cd.obligations.to_vec();
        let id = random_id("esc")?;
        let record = EscalationRecord {
            escalation_id: id.clone(),
            target,
            requested_by: caller.clone(),
            operation: operation.to_owned(),
            resource,
            reason: cd.reason.clone(),
            envelope_id: Some(envelope.envelope_id().clone()),
            envelope_version: Some(envelope.version()),
            classification: cd.projected_sensitivity,
            obligations: d.obligations.clone(),
            status: EscalationStatus::Pending,
            created_at: now,
            resolved_by: None,
            resolved_at: None,
            rejection_reason: None,
            consumed_at: None,
        };
        let draft = self.draft(&d).with_details(context_details(envelope, cd));
        let new_id = id.clone();
        let out = self
            .inner
            .store
            .put_escalation(
                record,
                Box::new(move |o| {
                    let (id, created) = match o {
                        PutEscalation::Created => (new_id, true),
                        PutEscalation::Existing(e) => (e.escalation_id.clone(), false),
                    };
                    vec![draft.with_details(json!({"escalation_id": id, "created": created}))]
                }),
            )
            .await?;
        let id = match out {
            PutEscalation::Created => id,
            PutEscalation::Existing(e) => e.escalation_id,
        };
        Ok((d, id))
    }

    /// Escalations with `status` (every one when `None`), oldest first.
    pub async fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> Result<Vec<EscalationRecord>, EngineError> {
        Ok(self.inner.store.list_escalations(status).await?)
    }

    /// One escalation.
    pub async fn escalation(&self, escalation_id: &str) -> Result<EscalationRecord, EngineError> {
        self.inner
            .store
            .get_escalation(escalation_id.to_owned())
            .await?
            .ok_or_else(|| EngineError::UnknownEscalation(escalation_id.to_owned()))
    }

    /// Whether `reviewer` may review `e`: the operator, or an active
    /// ancestor of the requesting agent; never the requester itself.
    fn may_review(&self, reviewer: &Caller, e: &EscalationRecord) -> Result<bool, EngineError> {
        match (reviewer, &e.requested_by) {
            (Subject::Operator, _) => Ok(true),
            (Subject::Agent(_), Subject::Operator) => Ok(false),
            (Subject::Agent(_), Subject::Agent(requester)) => {
                self.may_manage(reviewer, requester, false)
            }
        }
    }

    /// Approve a pending escalation: the request it holds proceeds once,
    /// the next time it is made. Recorded with the approver.
    pub async fn approve_escalation(
        &self,
        escalation_id: &str,
        approver: &Caller,
    ) -> Result<ReviewOutcome, EngineError> {
        self.review(escalation_id, approver, EscalationResolution::Approve)
            .await
    }

    /// Reject a pending escalation with a reason (non-empty, at most 1024
    /// bytes, no control characters). A held step is recorded `Denied`
    /// (`escalation_rejected`) and its run stops.
    pub async fn reject_escalation(
        &self,
        escalation_id: &str,
        approver: &Caller,
        reason: &str,
    ) -> Result<ReviewOutcome, EngineError> {
        check_text("reason", reason)?;
        self.review(
            escalation_id,
            approver,
            EscalationResolution::Reject {
                reason: reason.to_owned(),
            },
        )
        .await
    }

    async fn review(
        &self,
        escalation_id: &str,
        reviewer: &Caller,
        resolution: EscalationResolution,
    ) -> Result<ReviewOutcome, EngineError> {
        let now = self.now();
        let current = self.escalation(escalation_id).await?;
        let (operation, reason) = match resolution {
            EscalationResolution::Approve => (ops::ESCALATION_APPROVE, er::ESCALATION_APPROVED),
            EscalationResolution::Reject { .. } => {
                (ops::ESCALATION_REJECT, er::ESCALATION_REJECTED)
            }
        };
        let target = json!({"target": current.target, "requested_by": current.requested_by});
        let refuse = |reason: Reason| {
            self.decision(
                reviewer,
                Verdict::Deny,
                reason,
                operation,
                escalation_id.to_owned(),
                now,
            )
        };
        if !self.may_review(reviewer, &current)? {
            let d = refuse(er::ESCALATION_REVIEWER_NOT_AUTHORIZED);
            self.inner
                .store
                .append_audit(vec![self.draft(&d).with_details(target)])
                .await?;
            return Ok(ReviewOutcome {
                decision: d,
                escalation: current,
            });
        }
        let allow = self.decision(
            reviewer,
            if reason == er::ESCALATION_APPROVED {
                Verdict::Allow
            } else {
                Verdict::Deny
            },
            reason,
            operation,
            escalation_id.to_owned(),
            now,
        );
        let not_pending = refuse(er::ESCALATION_NOT_PENDING);
        let (a, n) = (self.draft(&allow), self.draft(&not_pending));
        let rejection = match &resolution {
            EscalationResolution::Reject { reason } => Some(reason.clone()),
            EscalationResolution::Approve => None,
        };
        let out = self
            .inner
            .store
            .resolve_escalation(
                escalation_id.to_owned(),
                resolution,
                reviewer.clone(),
                now,
                Box::new(move |o| match o {
                    ResolveEscalation::Resolved(e) => vec![a.with_details(json!({
                        "target": e.target,
                        "requested_by": e.requested_by,
                        "reviewer": e.resolved_by,
                        "rejection_reason": rejection,
                        "classification": e.classification,
                    }))],
                    ResolveEscalation::NotPending(e) => {
                        vec![n.with_details(json!({"status": e.status}))]
                    }
                    ResolveEscalation::NotFound => Vec::new(),
                }),
            )
            .await?;
        match out {
            ResolveEscalation::NotFound => {
                Err(EngineError::UnknownEscalation(escalation_id.to_owned()))
            }
            ResolveEscalation::NotPending(e) => Ok(ReviewOutcome {
                decision: not_pending,
                escalation: *e,
            }),
            ResolveEscalation::Resolved(e) => {
                if e.status == EscalationStatus::Rejected
                    && let EscalationTarget::Step { run_id, step_id } = &e.target
                {
                    self.deny_rejected_step(&e, run_id, step_id, now).await?;
                }
                Ok(ReviewOutcome {
                    decision: allow,
                    escalation: *e,
                })
            }
        }
    }

    /// A rejected step: recorded `Denied`, the run stops.
    async fn deny_rejected_step(
        &self,
        e: &EscalationRecord,
        run_id: &RunId,
        step_id: &warden_core::ids::StepId,
        now: Timestamp,
    ) -> Result<(), EngineError> {
        let d = self.decision(
            &e.requested_by,
            Verdict::Deny,
            er::ESCALATION_REJECTED,
            ops::STEP_BEGIN,
            e.resource.clone(),
            now,
        );
        let outcome = StepOutcome {
            status: StepStatus::Denied,
            result: None,
            error: Some(er::ESCALATION_REJECTED.to_string()),
            labels: Vec::new(),
            recorded_at: now,
        };
        let draft = self.draft(&d).with_details(json!({
            "escalation_id": e.escalation_id,
            "rejected_by": e.resolved_by,
        }));
        match self
            .inner
            .store
            .record_step(run_id.clone(), step_id.clone(), outcome, vec![draft])
            .await?
        {
            RecordStep::Recorded | RecordStep::AlreadyRecorded(_) => Ok(()),
        }
    }

    // ------------------------------------------------------------------
    // Delegation
    // ------------------------------------------------------------------

    /// The context of a registration: decide it against the envelope the
    /// child inherits and build the child's envelope. `None` when there is
    /// nothing to inherit (or no context policy). A refusal is recorded and
    /// returned as an error; nothing is created.
    pub(crate) async fn delegation_context(
        &self,
        caller: &Caller,
        req: &mut RegisterAgent,
        options: &DelegationOptions,
        now: Timestamp,
        audit: &mut Vec<AuditDraft>,
    ) -> Result<Option<ChildContext>, EngineError> {
        let Some(parent) = req.parent.clone() else {
            if *options != DelegationOptions::default() {
                return Err(EngineError::Invalid {
                    field: "delegation".into(),
                    message: "delegation options need a parent".into(),
                });
            }
            return Ok(None);
        };
        let resource = req.id.to_string();
        // The source run must be the delegator's own.
        let run_envelope = match &options.from_run {
            None => None,
            Some(run_id) => match self.inner.store.get_run(run_id.clone()).await? {
                Some(state) if state.run.agent == parent => state.run.envelope_id,
                _ => return Err(EngineError::UnknownRun(run_id.to_string())),
            },
        };
        let Some(policy) = self.context_policy() else {
            return Ok(None);
        };
        let source_id = match run_envelope {
            Some(id) => Some(id),
            None => self.read_state()?.envelopes.get(&parent).cloned(),
        };
        let mut records = Vec::new();
        let source = match source_id {
            Some(id) => self.load_envelope(policy, &id).await?,
            None if !options.restrictions.is_empty() => {
                // Nothing to inherit, but restrictions to declare: the child's
                // envelope descends from an empty one of its parent.
                let workflow = WorkflowId::parse(&random_id("wf")?)
                    .map_err(|e| identifier_error("workflow_id", e))?;
                let root = Envelope::root(policy, new_envelope_id()?, workflow, parent.clone());
                let d = self.decision(
                    caller,
                    Verdict::Allow,
                    er::CONTEXT_CREATED,
                    ops::CONTEXT_OPEN,
                    root.envelope_id().to_string(),
                    now,
                );
                audit.push(self.draft(&d).with_details(json!({
                    "envelope_id": root.envelope_id(),
                    "workflow_id": root.workflow_id(),
                    "agent_id": root.agent_id(),
                    "version": root.version(),
                    "classification": root.aggregate_sensitivity(),
                })));
                records.push(root.to_record());
                root
            }
            None => return Ok(None),
        };

        // What the delegator and the environment let the child hold.
        let (delegator, org) = {
            let state = self.read_state()?;
            let delegator: BTreeSet<ActionName> = state
                .hierarchy
                .get(parent.as_str())
                .map(|n| self.policy().action_names(n.effective()))
                .unwrap_or_default()
                .into_iter()
                .collect();
            let org: BTreeSet<ActionName> = self
                .policy()
                .action_names(&self.policy().environment)
                .into_iter()
                .collect();
            (delegator, org)
        };
        let would_hold: BTreeSet<ActionName> = req
            .capabilities
            .iter()
            .filter(|a| delegator.contains(*a) && org.contains(*a))
            .cloned()
            .collect();
        let authority: Vec<ActionRef<'_>> = would_hold
            .iter()
            .map(|a| self.action_ref(a.as_str()))
            .collect();
        let zone = options.zone.unwrap_or(TrustZone::Internal);
        let cd = decide(
            &source,
            policy,
            &ContextRequest::Delegation {
                target: zone,
                delegatee_authority: &authority,
            },
        );
        let mut details = context_details(&source, &cd);
        if let Value::Object(d) = &mut details {
            d.insert("zone".into(), json!(zone));
            d.insert("from_run".into(), json!(options.from_run));
        }
        let mut obligations = cd.obligations.to_vec();
        let mut verdict = cd.verdict;
        match cd.verdict {
            Verdict::Allow | Verdict::Constrain => {}
            Verdict::Deny => {
                let d = self.decision(
                    caller,
                    Verdict::Deny,
                    cd.reason.clone(),
                    ops::AGENT_REGISTER,
                    resource,
                    now,
                );
                self.inner
                    .store
                    .append_audit(vec![self.draft(&d).with_details(details)])
                    .await?;
                return Err(EngineError::Denied(Box::new(d)));
            }
            Verdict::Escalate => {
                let target = EscalationTarget::Delegation {
                    parent: parent.clone(),
                    child: req.id.clone(),
                    from_run: options.from_run.clone(),
                };
                verdict = if obligations.is_empty() {
                    Verdict::Allow
                } else {
                    Verdict::Constrain
                };
                let mut d = self.decision(
                    caller,
                    verdict,
                    er::ESCALATION_APPROVED,
                    ops::AGENT_REGISTER,
                    resource.clone(),
                    now,
                );
                d.obligations = std::mem::take(&mut obligations);
                if !self
                    .consume_approval(target.clone(), &d, details.clone(), now)
                    .await?
                {
                    let (decision, escalation_id) = self
                        .open_escalation(
                            target,
                            caller,
                            ops::AGENT_REGISTER,
                            resource,
                            &source,
                            &cd,
                            now,
                        )
                        .await?;
                    return Err(EngineError::Escalated {
                        decision: Box::new(decision),
                        escalation_id,
                    });
                }
                obligations = d.obligations;
            }
        }

        let child_id = new_envelope_id()?;
        let (child, t) = match source.delegate(
            policy,
            req.id.clone(),
            child_id.clone(),
            &options.restrictions,
            options.redact_labels,
        ) {
            Ok(x) => x,
            Err(e) => {
                let d = self.decision(
                    caller,
                    Verdict::Deny,
                    e.reason(),
                    ops::AGENT_REGISTER,
                    resource,
                    now,
                );
                self.inner
                    .store
                    .append_audit(vec![self.draft(&d).with_details(details)])
                    .await?;
                return Err(e.into());
            }
        };

        // No laundering: the child holds only what the delegator holds, the
        // environment offers and the child's envelope leaves allowed.
        let catalogue = &self.policy().catalogue;
        let effective = effective_delegated_authority(
            &delegator,
            &req.capabilities,
            &child,
            policy,
            |a| catalogue.by_name(a.as_str()).map(|c| c.tags()),
            &org,
        );
        let removed: Vec<ActionName> = would_hold.difference(&effective).cloned().collect();
        if !removed.is_empty() {
            for a in &removed {
                req.capabilities.remove(a);
            }
            let d = self.decision(
                caller,
                Verdict::Constrain,
                er::AUTHORITY_NARROWED,
                ops::AGENT_REGISTER,
                resource,
                now,
            );
            audit.push(self.draft(&d).with_details(json!({
                "removed": removed,
                "envelope_id": child.envelope_id(),
                "classification": child.aggregate_sensitivity(),
            })));
        }
        audit.push(self.transition_draft(
            caller,
            ops::CONTEXT_DELEGATE,
            &t,
            json!({"from_run": options.from_run, "zone": zone}),
            now,
        ));
        if let Value::Object(d) = &mut details {
            d.insert("child_envelope_id".into(), json!(child.envelope_id()));
        }
        records.push(child.to_record());
        Ok(Some(ChildContext {
            records,
            envelope_id: child_id,
            verdict,
            obligations,
            details,
        }))
    }

    // ------------------------------------------------------------------
    // Declassification, export, receipts
    // ------------------------------------------------------------------

    /// Lower run `run_id`'s envelope to `to`, removing `remove_labels`: the
    /// only way an envelope's sensitivity ever drops.
    ///
    /// Allowed to an active agent the bundle lists under
    /// `context.declassifiers`, with a justification, and only as far as the
    /// labels left allow (see `Envelope::declassify`); restrictions are never
    /// removed. Recorded either way: an allowed declassification with the
    /// justification and the declassifier, a refusal with its reason.
    pub async fn declassify(
        &self,
        by: &AgentId,
        run_id: &RunId,
        to: Sensitivity,
        remove_labels: &[Label],
        justification: &str,
    ) -> Result<DeclassifyOutcome, EngineError> {
        let now = self.now();
        let policy = self
            .context_policy()
            .ok_or_else(|| EngineError::NoEnvelope(run_id.to_string()))?;
        let caller = Caller::Agent(by.clone());
        let (_, envelope_id) = self.run_envelope_id(run_id).await?;
        let resource = envelope_id.to_string();
        let inactive = {
            let state = self.read_state()?;
            match state.hierarchy.get(by.as_str()) {
                None => Some(warden_core::decision::reasons::UNKNOWN_AGENT),
                Some(n) if !n.is_active() => Some(warden_core::decision::reasons::AGENT_REVOKED),
                Some(_) => None,
            }
        };
        for _ in 0..MAX_ENVELOPE_ATTEMPTS {
            let current = self.load_envelope(policy, &envelope_id).await?;
            let result = match &inactive {
                Some(reason) => Err((reason.clone(), String::from("the agent is not active"))),
                None => current
                    .declassify(policy, by, to, remove_labels, justification)
                    .map_err(|e| (e.reason(), e.to_string())),
            };
            let (next, t) = match result {
                Ok(x) => x,
                Err((reason, message)) => {
                    let d = self.decision(
                        &caller,
                        Verdict::Deny,
                        reason,
                        ops::CONTEXT_DECLASSIFY,
                        resource,
                        now,
                    );
                    let draft = self.draft(&d).with_details(json!({
                        "run_id": run_id,
                        "envelope_id": envelope_id,
                        "envelope_version": current.version(),
                        "classification": current.aggregate_sensitivity(),
                        "requested": to,
                        "remove_labels": remove_labels,
                        "justification_bytes": justification.len(),
                        "message": message,
                    }));
                    self.inner.store.append_audit(vec![draft]).await?;
                    return Ok(DeclassifyOutcome {
                        decision: d,
                        envelope: None,
                    });
                }
            };
            let d = self.decision(
                &caller,
                Verdict::Allow,
                t.reason(),
                ops::CONTEXT_DECLASSIFY,
                resource.clone(),
                now,
            );
            let draft = self.transition_draft(
                &caller,
                ops::CONTEXT_DECLASSIFY,
                &t,
                json!({"run_id": run_id}),
                now,
            );
            let record = next.to_record();
            let written = self
                .inner
                .store
                .put_envelope(
                    record.clone(),
                    Some(current.version()),
                    Box::new(move |o| match o {
                        PutEnvelope::Written => vec![draft],
                        PutEnvelope::Conflict { .. } => Vec::new(),
                    }),
                )
                .await?;
            if written == PutEnvelope::Written {
                return Ok(DeclassifyOutcome {
                    decision: d,
                    envelope: Some(record),
                });
            }
        }
        Err(EngineError::EnvelopeContention(envelope_id.to_string()))
    }

    /// Sign the latest version of run `run_id`'s envelope as `issuer` with
    /// `key`, for a trust boundary (verify it with the core's `Verifier`).
    /// Recorded (`envelope_exported`) with the version and classification.
    pub async fn export_envelope(
        &self,
        caller: &Caller,
        run_id: &RunId,
        issuer: &IssuerId,
        key: &SigningKey,
    ) -> Result<SignedEnvelope, EngineError> {
        let now = self.now();
        let (_, envelope_id) = self.run_envelope_id(run_id).await?;
        let record = self
            .envelope(&envelope_id, None)
            .await?
            .ok_or_else(|| EngineError::UnknownEnvelope(envelope_id.to_string()))?;
        let token = sign(&record, issuer, key).map_err(|e| EngineError::Invalid {
            field: "envelope".into(),
            message: e.to_string(),
        })?;
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::ENVELOPE_EXPORTED,
            ops::CONTEXT_EXPORT,
            envelope_id.to_string(),
            now,
        );
        let draft = self.draft(&d).with_details(json!({
            "run_id": run_id,
            "envelope_version": record.version,
            "issuer": issuer,
            "classification": record.aggregate_sensitivity,
        }));
        self.inner.store.append_audit(vec![draft]).await?;
        Ok(token)
    }

    /// A receipt for the latest version of run `run_id`'s envelope: an
    /// opaque reference, the sensitivity tier and the window in which
    /// `issuer` keeps it resolvable. Recorded (`receipt_issued`).
    pub async fn receipt(
        &self,
        caller: &Caller,
        run_id: &RunId,
        issuer: &IssuerId,
        resolvable_until: Timestamp,
    ) -> Result<Receipt, EngineError> {
        let now = self.now();
        let (_, envelope_id) = self.run_envelope_id(run_id).await?;
        let record = self
            .envelope(&envelope_id, None)
            .await?
            .ok_or_else(|| EngineError::UnknownEnvelope(envelope_id.to_string()))?;
        let receipt = Receipt::issue(&record, issuer, resolvable_until);
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::RECEIPT_ISSUED,
            ops::CONTEXT_RECEIPT,
            envelope_id.to_string(),
            now,
        );
        let draft = self.draft(&d).with_details(json!({
            "run_id": run_id,
            "envelope_ref": receipt.envelope_ref,
            "envelope_version": record.version,
            "issuer": issuer,
            "classification": record.aggregate_sensitivity,
            "resolvable_until": resolvable_until,
        }));
        self.inner.store.append_audit(vec![draft]).await?;
        Ok(receipt)
    }
}
