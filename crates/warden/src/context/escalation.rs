//! Escalations: holding a request for review, approving and rejecting it,
//! and consuming an approval exactly once.

use serde_json::{Value, json};
use warden_core::audit::Digest;
use warden_core::canonical::to_canonical;
use warden_core::decision::{Decision, Reason, Subject, Verdict};
use warden_core::envelope::{ContextDecision, Envelope};
use warden_core::ids::RunId;
use warden_core::time::Timestamp;
use warden_store::{
    ConsumedEscalation, EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget,
    PutEscalation, RecordStep, ResolveEscalation, StepOutcome, StepStatus, Store,
};

use crate::engine::{Caller, Engine, engine_reasons as er, ops, random_id};
use crate::error::{EngineError, Missing};

use super::*;

/// A request as a reviewer is shown it, bound by its digest: the SHA-256 of
/// its canonical JSON. An approval is bound to the digest (part of the
/// escalation's target), so any other request escalates afresh.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BoundRequest {
    /// The request (every field that shapes what is created or run).
    pub(crate) request: Value,
    /// SHA-256 of its canonical JSON.
    pub(crate) digest: Digest,
}

impl BoundRequest {
    /// Bind `request`.
    pub(crate) fn new(request: Value) -> Self {
        let digest = Digest::of(&to_canonical(&request));
        Self { request, digest }
    }
}

/// Whether `e` binds the request it shows: a digest in its target that is
/// the digest of its stored request. A record stored before requests were
/// bound has neither and binds nothing.
pub(crate) fn is_bound(e: &EscalationRecord) -> bool {
    match (e.target.request_digest(), &e.request) {
        (Some(digest), Some(request)) => Digest::of(&to_canonical(request)) == digest,
        _ => false,
    }
}

impl<S: Store> Engine<S> {
    // ------------------------------------------------------------------
    // Escalations
    // ------------------------------------------------------------------

    /// Use the approval of `target`, recording `decision` (the request
    /// proceeding) if there was one. Whether there was.
    pub(crate) async fn consume_approval(
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
        let withdrawn = self.decision(
            &decision.subject,
            Verdict::Deny,
            er::ESCALATION_WITHDRAWN,
            ops::ESCALATION_REJECT,
            decision.resource.clone(),
            now,
        );
        let withdrawn = self.draft(&withdrawn);
        let used = self
            .inner
            .store
            .consume_escalation(
                target,
                now,
                Box::new(move |o| match o {
                    None => Vec::new(),
                    Some(ConsumedEscalation {
                        escalation: e,
                        withdrawn: others,
                    }) => {
                        let who = json!({
                            "escalation_id": e.escalation_id,
                            "approved_by": e.resolved_by,
                            "request_digest": e.target.request_digest(),
                        });
                        let mut entries = vec![
                            consumed.with_details(who.clone()),
                            proceed.with_details(who),
                        ];
                        // Other requests for the same slot can never
                        // proceed now: withdrawn with this one.
                        entries.extend(others.iter().map(|w| {
                            withdrawn.clone().with_details(json!({
                                "escalation_id": w.escalation_id,
                                "target": w.target,
                                "withdrawn_for": e.escalation_id,
                            }))
                        }));
                        entries
                    }
                }),
            )
            .await?;
        Ok(used.is_some())
    }

    /// Withdraw every pending escalation of `slot`'s slot
    /// ([`EscalationTarget::same_slot`]) because the slot is used: the
    /// child id is registered, the run step's outcome is recorded, or the
    /// call is decided. None of them can ever proceed, so none may be left
    /// for a reviewer to approve. Each is rejected
    /// ([`ESCALATION_WITHDRAWN`](warden_store::ESCALATION_WITHDRAWN)) by
    /// `caller`, recorded. How many were withdrawn.
    ///
    /// [`Store::consume_escalation`] withdraws the slot's pending requests
    /// in its own transaction, but a request that lost the race can store
    /// its escalation just after (on another server, between its own look
    /// for an approval and its insert). So both sides look after they
    /// write: whoever uses a slot calls this once the use is committed,
    /// and whoever stores a new escalation looks whether the slot is used
    /// and, if it is, calls this. Every write is committed before the
    /// other side's later read starts, so of the two reads at least one
    /// sees the other's write, whatever the interleaving: no pending
    /// escalation of a used slot survives both.
    pub(crate) async fn withdraw_slot(
        &self,
        caller: &Caller,
        slot: &EscalationTarget,
        now: Timestamp,
    ) -> Result<usize, EngineError> {
        self.withdraw_pending(caller, |t| t.same_slot(slot), er::ESCALATION_WITHDRAWN, now)
            .await
    }

    /// [`Engine::withdraw_slot`] for the child id `child`, just registered
    /// (whoever asked for it, with whatever request).
    pub(crate) async fn withdraw_child_slot(
        &self,
        caller: &Caller,
        child: &warden_core::ids::AgentId,
        now: Timestamp,
    ) -> Result<usize, EngineError> {
        self.withdraw_pending(
            caller,
            |t| matches!(t, EscalationTarget::Delegation { child: c, .. } if c == child),
            er::ESCALATION_WITHDRAWN,
            now,
        )
        .await
    }

    /// [`Engine::withdraw_slot`] for the step `step_id` of `run`, whose
    /// outcome was just recorded. Only a run's context envelope escalates
    /// a step, so a run without one has nothing to withdraw.
    pub(crate) async fn withdraw_step_slot(
        &self,
        caller: &Caller,
        run: &warden_store::RunRecord,
        step_id: &warden_core::ids::StepId,
        now: Timestamp,
    ) -> Result<usize, EngineError> {
        if run.envelope_id.is_none() {
            return Ok(0);
        }
        let slot = EscalationTarget::Step {
            run_id: run.run_id.clone(),
            step_id: step_id.clone(),
            request_digest: None,
        };
        self.withdraw_slot(caller, &slot, now).await
    }

    /// Reject every pending escalation whose target `matches`, with
    /// `reason` (its rejection reason too), by `caller`; each rejection is
    /// recorded. Exactly once per escalation: one a reviewer resolved
    /// meanwhile is left as the reviewer left it. How many were rejected.
    pub(crate) async fn withdraw_pending(
        &self,
        caller: &Caller,
        matches: impl Fn(&EscalationTarget) -> bool,
        reason: Reason,
        now: Timestamp,
    ) -> Result<usize, EngineError> {
        let pending = self
            .inner
            .store
            .list_escalations(Some(EscalationStatus::Pending))
            .await?;
        let mut withdrawn = 0;
        for e in pending.into_iter().filter(|e| matches(&e.target)) {
            let d = self.decision(
                caller,
                Verdict::Deny,
                reason.clone(),
                ops::ESCALATION_REJECT,
                e.escalation_id.clone(),
                now,
            );
            let draft = self.draft(&d).with_details(json!({
                "escalation_id": e.escalation_id,
                "target": e.target,
            }));
            let out = self
                .inner
                .store
                .resolve_escalation(
                    e.escalation_id.clone(),
                    EscalationResolution::Reject {
                        reason: reason.to_string(),
                    },
                    caller.clone(),
                    now,
                    Box::new(move |o| match o {
                        ResolveEscalation::Resolved(_) => vec![draft],
                        _ => Vec::new(),
                    }),
                )
                .await?;
            if matches!(out, ResolveEscalation::Resolved(_)) {
                withdrawn += 1;
            }
        }
        Ok(withdrawn)
    }

    /// Hold a request for review: the pending escalation of `target` (a new
    /// one, or the one already open) and the recorded `escalate` decision,
    /// with the escalation's id and whether this request stored it (it did
    /// not when the same request was already held).
    #[expect(
        clippy::too_many_arguments,
        reason = "the escalation record is built from the request's parts, shared by steps and delegations"
    )]
    pub(super) async fn open_escalation(
        &self,
        target: EscalationTarget,
        caller: &Caller,
        operation: &str,
        resource: String,
        envelope: &Envelope,
        cd: &ContextDecision,
        request: BoundRequest,
        now: Timestamp,
    ) -> Result<(Decision, String, bool), EngineError> {
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
            request: Some(request.request),
            status: EscalationStatus::Pending,
            created_at: now,
            resolved_by: None,
            resolved_at: None,
            rejection_reason: None,
            consumed_at: None,
        };
        let draft = self
            .draft(&d)
            .with_details(context_details(envelope, cd))
            .with_details(json!({"request_digest": request.digest}));
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
        Ok(match out {
            PutEscalation::Created => (d, id, true),
            PutEscalation::Existing(e) => (d, e.escalation_id, false),
        })
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
            .ok_or_else(|| EngineError::not_found(Missing::Escalation, escalation_id.to_owned()))
    }

    /// Whether `reviewer` may review `e`: the operator, or an active
    /// ancestor of the requesting agent; never the requester itself.
    pub(super) fn may_review(
        &self,
        reviewer: &Caller,
        e: &EscalationRecord,
    ) -> Result<bool, EngineError> {
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

    pub(super) async fn review(
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
        if matches!(resolution, EscalationResolution::Approve)
            && current.status == EscalationStatus::Pending
            && !is_bound(&current)
        {
            // Nothing says what an approval would let through: only a
            // rejection resolves it.
            let d = refuse(er::ESCALATION_UNBOUND);
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
            ResolveEscalation::NotFound => Err(EngineError::not_found(
                Missing::Escalation,
                escalation_id.to_owned(),
            )),
            ResolveEscalation::NotPending(e) => Ok(ReviewOutcome {
                decision: not_pending,
                escalation: *e,
            }),
            ResolveEscalation::Resolved(e) => {
                if e.status == EscalationStatus::Rejected
                    && let EscalationTarget::Step {
                        run_id, step_id, ..
                    } = &e.target
                {
                    self.deny_rejected_step(&e, run_id, step_id, now).await?;
                }
                if e.status == EscalationStatus::Rejected
                    && let EscalationTarget::Call {
                        session_id,
                        call_id,
                        ..
                    } = &e.target
                {
                    self.deny_rejected_call(
                        &e.requested_by,
                        session_id,
                        call_id,
                        &e.escalation_id,
                        now,
                    )
                    .await?;
                }
                Ok(ReviewOutcome {
                    decision: allow,
                    escalation: *e,
                })
            }
        }
    }

    /// A rejected step: recorded `Denied`, the run stops.
    pub(super) async fn deny_rejected_step(
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
            // A step held for review was never leased.
            RecordStep::Recorded | RecordStep::AlreadyRecorded(_) | RecordStep::LeaseHeld(_) => {
                Ok(())
            }
        }
    }
}
