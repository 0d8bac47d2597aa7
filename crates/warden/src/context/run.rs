//! A run's envelope: opened at admission, the gate of each step against
//! it, and the fold of each step's labels.

use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Verdict};
use warden_core::envelope::{
    ContextGate as CoreGate, ContextRequest, Envelope, EnvelopeError, EnvelopeId, WorkflowId,
};
use warden_core::gate::{GateCall, GateContext, PlanUse, Verdicts, assess, literal_origins};
use warden_core::ids::{AgentId, Label, RunId};
use warden_core::provenance::{FingerprintKey, OriginSet, SourceIndex};
use warden_core::time::Timestamp;
use warden_store::{
    EscalationTarget, PutEnvelope, RunRecord, RunStep, StepOutcome, StepStatus, Store,
};

use crate::engine::{Caller, Engine, engine_reasons as er, ops};
use crate::error::{ConflictKind, EngineError, Missing};
use crate::tickets::Gated;

use super::escalation::BoundRequest;
use super::*;

impl<S: Store> Engine<S> {
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
        let workflow =
            WorkflowId::parse(run_id.as_str()).map_err(|e| identifier_error("run_id", e))?;
        self.open_workflow_envelope(
            &Caller::Agent(actor.clone()),
            actor,
            workflow,
            json!({"run_id": run_id}),
            now,
        )
        .await?
        .ok_or_else(|| EngineError::not_found(Missing::RunEnvelope, run_id.to_string()))
    }

    /// The envelope a new run or session of `agent` starts with, and the
    /// entry recording its opening (not stored yet): the one way both open
    /// one. Delegated from the agent's inherited envelope (same
    /// restrictions, sensitivity at least as high) if it holds one, else a
    /// new root for `workflow`. `None` without a `context:` policy. `extra`
    /// (the run or session id) joins the entry's details.
    pub(crate) async fn open_workflow_envelope(
        &self,
        caller: &Caller,
        agent: &AgentId,
        workflow: WorkflowId,
        extra: Value,
        now: Timestamp,
    ) -> Result<Option<(Envelope, AuditDraft)>, EngineError> {
        let Some(policy) = self.context_policy() else {
            return Ok(None);
        };
        let inherited = self.read_state()?.envelopes.get(agent).cloned();
        let id = new_envelope_id()?;
        if let Some(source) = inherited {
            let source = self.load_envelope(policy, &source).await?;
            let (envelope, t) = source.delegate(policy, agent.clone(), id, &[], false)?;
            let draft = self.transition_draft(caller, ops::CONTEXT_OPEN, &t, extra, now);
            return Ok(Some((envelope, draft)));
        }
        let envelope = Envelope::root(policy, id, workflow, agent.clone());
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::CONTEXT_CREATED,
            ops::CONTEXT_OPEN,
            envelope.envelope_id().to_string(),
            now,
        );
        let mut details = json!({
            "envelope_id": envelope.envelope_id(),
            "workflow_id": envelope.workflow_id(),
            "agent_id": envelope.agent_id(),
            "version": envelope.version(),
            "classification": envelope.aggregate_sensitivity(),
        });
        if let (Value::Object(d), Value::Object(more)) = (&mut details, extra) {
            d.extend(more);
        }
        Ok(Some((envelope, self.draft(&d).with_details(details))))
    }

    /// The gate of one step, after the run's own checks (order, a stopped
    /// run) passed: the one gate every call passes
    /// (`warden_core::gate::assess`), the step being the call of its
    /// planned step in the run's fully literal plan (its SOP), decided once
    /// against the run's envelope.
    ///
    /// `Open` carries the proceeding decision and the envelope it was
    /// decided against (kept in the step's ticket, so completion neither
    /// reloads nor re-decides it); its `draft` is the entry still to record
    /// (`None` when consuming an approval recorded it already). `Denied`
    /// (the step recorded denied: the run stops) and `Escalated` are
    /// recorded. Without a context policy (or an envelope on the run) no
    /// envelope is consulted.
    pub(crate) async fn gate_step(
        &self,
        actor: &AgentId,
        run: &RunRecord,
        step: &RunStep,
        arguments: &Value,
        now: Timestamp,
    ) -> Result<ContextGate, EngineError> {
        let caller = Caller::Agent(actor.clone());
        let resource = format!("{}:{}", run.run_id, step.step_id);
        let envelope = match (self.context_policy(), &run.envelope_id) {
            (Some(policy), Some(id)) => Some(self.load_envelope(policy, id).await?),
            _ => None,
        };
        let position = run
            .steps
            .iter()
            .position(|s| s.step_id == step.step_id)
            .unwrap_or_default();
        let a = {
            let st = self.read_state()?;
            assess(
                &GateContext {
                    hierarchy: &st.hierarchy,
                    policy: self.policy(),
                },
                &GateCall {
                    actor,
                    action: step.action.as_str(),
                    arguments,
                    plan: PlanUse::Literal {
                        index: position,
                        step_id: &step.step_id,
                    },
                    index: literal_plan_index()?,
                    envelope: envelope.as_ref(),
                },
                Verdicts::default(),
            )
        };
        let mut details = json!({
            "reasons": a.reasons.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            "plan_step": step.step_id,
            "provenance": a.provenance_json(),
        });
        if let (Some(e), Some(cd), Value::Object(d)) = (&envelope, &a.context, &mut details)
            && let Value::Object(more) = context_details(e, cd)
        {
            d.extend(more);
        }
        match a.verdict {
            Verdict::Allow | Verdict::Constrain => {
                let (decision, gated) = match (envelope, a.context) {
                    (Some(envelope), Some(cd)) => {
                        let gate = CoreGate::from_decision(cd);
                        let (verdict, reason) = gate.begin();
                        let mut d =
                            self.decision(&caller, verdict, reason, ops::STEP_BEGIN, resource, now);
                        d.obligations.clone_from(&gate.obligations);
                        (d, Some(Box::new(Gated { envelope, gate })))
                    }
                    _ => (
                        self.decision(
                            &caller,
                            Verdict::Allow,
                            warden_core::decision::reasons::STEP_ALLOWED,
                            ops::STEP_BEGIN,
                            resource,
                            now,
                        ),
                        None,
                    ),
                };
                let draft = Some(self.draft(&decision).with_details(details));
                Ok(ContextGate::Open {
                    decision,
                    draft,
                    gated,
                })
            }
            Verdict::Deny => {
                let d = self.decision(
                    &caller,
                    Verdict::Deny,
                    a.reason.clone(),
                    ops::STEP_BEGIN,
                    resource,
                    now,
                );
                self.stop_step(run, step, &d, details, now).await?;
                Ok(ContextGate::Denied(d))
            }
            Verdict::Escalate => {
                // Every argument of a run's step is a plan literal, so only
                // the envelope escalates a step.
                let (Some(envelope), Some(cd)) = (envelope, a.context) else {
                    return Err(EngineError::internal(
                        "a run step escalated without a context decision",
                    ));
                };
                // The step's arguments are fixed by the SOP; the approval
                // still binds the run, the step and their digest.
                let request = BoundRequest::new(json!({
                    "run_id": run.run_id,
                    "step_id": step.step_id,
                    "action": step.action,
                    "operation_id": step.operation_id,
                    "sop_hash": run.sop_hash,
                    "arguments": arguments,
                }));
                let target = EscalationTarget::Step {
                    run_id: run.run_id.clone(),
                    step_id: step.step_id.clone(),
                    request_digest: Some(request.digest),
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
                    return Ok(ContextGate::Open {
                        decision: d,
                        draft: None,
                        gated: Some(Box::new(Gated {
                            envelope,
                            gate: CoreGate::from_decision(cd),
                        })),
                    });
                }
                let (decision, escalation_id, created) = self
                    .open_escalation(
                        target,
                        &caller,
                        ops::STEP_BEGIN,
                        resource,
                        &envelope,
                        &cd,
                        request,
                        now,
                    )
                    .await?;
                Ok(ContextGate::Escalated {
                    decision,
                    escalation_id,
                    created,
                })
            }
        }
    }

    /// Record `step` as denied by `decision` (the run stops).
    pub(super) async fn stop_step(
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
        self.withdraw_step_slot(&decision.subject, run, &step.step_id, now)
            .await?;
        Ok(())
    }

    /// Fold a completed (or failed) call's labels into the envelope
    /// `envelope_id` (a run's, for a step; a session's, for a call),
    /// retrying on concurrent writers: the one fold of runs and sessions.
    /// Unknown labels change nothing ([`Folded::Unknown`]).
    ///
    /// `gated` is what the call's gate decided (a step's ticket): the
    /// envelope it decided against, tried first for the compare-and-set
    /// (no reload unless something else wrote meanwhile), and its
    /// obligations. Without it the gate is decided here, against the
    /// envelope as it stands: for a run's step that is how a bypass is
    /// detected; a session's call is gated by its record instead.
    /// `origins` are the call's argument origins for that decision (a
    /// run's step: every value a plan literal). `extra` joins the
    /// transition's audit details.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fold_labels(
        &self,
        caller: &Caller,
        envelope_id: &EnvelopeId,
        action: &str,
        origins: &[OriginSet],
        reported: &[Label],
        gated: Option<&Gated>,
        extra: Value,
        now: Timestamp,
    ) -> Result<Folded, EngineError> {
        let Some(policy) = self.context_policy() else {
            return Err(EngineError::not_found(
                Missing::RunEnvelope,
                envelope_id.to_string(),
            ));
        };
        let declared = self.output_labels(action);
        // What the gate decided: from the ticket, or decided now.
        let (gate, mut known) = match gated {
            Some(g) => (g.gate.clone(), Some(g.envelope.clone())),
            None => {
                let before = self.load_envelope(policy, envelope_id).await?;
                let request = ContextRequest::Call {
                    action: self.action_ref(action),
                    arguments: origins,
                };
                (
                    CoreGate::decide_request(&before, policy, &request),
                    Some(before),
                )
            }
        };
        for _ in 0..MAX_ENVELOPE_ATTEMPTS {
            let before = match known.take() {
                Some(e) => e,
                None => self.load_envelope(policy, envelope_id).await?,
            };
            let (after, t) = match before.fold(policy, reported, declared) {
                Ok(x) => x,
                Err(EnvelopeError::UnknownLabels { labels }) => {
                    return Ok(Folded::Unknown(labels));
                }
                Err(e) => return Err(e.into()),
            };
            let draft =
                self.transition_draft(caller, ops::CONTEXT_ACCUMULATE, &t, extra.clone(), now);
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
                return Ok(Folded::Done {
                    after,
                    transition: Box::new(t),
                    labels: gate.outcome_labels(reported, declared),
                    bypassed: gate.bypassed(),
                });
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::EnvelopeContention,
            id: envelope_id.to_string(),
        })
    }

    /// Fold a completed (or failed) step's labels into its run's envelope
    /// ([`Engine::fold_labels`]); `None` without a context policy or an
    /// envelope on the run.
    pub(crate) async fn fold_step(
        &self,
        actor: &AgentId,
        run: &RunRecord,
        step: &RunStep,
        reported: &[Label],
        gated: Option<&Gated>,
        now: Timestamp,
    ) -> Result<Option<Folded>, EngineError> {
        let (Some(policy), Some(envelope_id)) = (self.context_policy(), &run.envelope_id) else {
            return Ok(None);
        };
        // The argument origins matter only when the gate is decided here
        // (no ticket) and a restriction applies by origin.
        let origins = if gated.is_none() && policy.has_conditional_restrictions() {
            literal_origins(&Value::Object(crate::steps::step_arguments(
                run,
                &step.step_id,
            )))
        } else {
            Vec::new()
        };
        self.fold_labels(
            &Caller::Agent(actor.clone()),
            envelope_id,
            step.action.as_str(),
            &origins,
            reported,
            gated,
            json!({"run_id": run.run_id, "step_id": step.step_id}),
            now,
        )
        .await
        .map(Some)
    }
}

/// What the context gate said about a step.
pub(crate) enum ContextGate {
    /// The step may proceed.
    Open {
        /// The proceeding decision (allow or constrain).
        decision: Decision,
        /// Its entry, if not recorded yet.
        draft: Option<AuditDraft>,
        /// What the envelope decided (`None` without a context policy).
        gated: Option<Box<Gated>>,
    },
    /// Denied; the step is recorded denied and the run stops.
    Denied(Decision),
    /// Held for review (recorded): the pending escalation.
    Escalated {
        /// The decision (verdict `escalate`).
        decision: Decision,
        /// The escalation to review.
        escalation_id: String,
        /// Whether this request stored it (not: the same request was
        /// already held).
        created: bool,
    },
}

/// The source index of a run: empty, since every argument of a fully
/// literal plan is vouched for by the plan itself.
fn literal_plan_index() -> Result<&'static SourceIndex, EngineError> {
    static EMPTY: std::sync::LazyLock<Result<SourceIndex, String>> =
        std::sync::LazyLock::new(|| {
            FingerprintKey::new(b"warden.run.literal-plan.v1")
                .map(SourceIndex::new)
                .map_err(|e| e.to_string())
        });
    EMPTY.as_ref().map_err(EngineError::internal)
}
