//! Deciding one call of a session.
//!
//! The session's own state is checked first (a cancelled session, one
//! holding [`super::MAX_CALLS`] calls); then the one gate every call and
//! every run step passes, `warden_core::gate::assess`: capability, the
//! catalogue's schema and rules, the planned step it uses and its
//! bindings, the provenance of every guarded argument value against the
//! session's index, the session's context envelope. The answer is recorded
//! with the call in one compare-and-set of the session.
//!
//! An escalated call is held for review (an escalation whose target is the
//! call); the same call again after approval proceeds once. "The same call"
//! is the same call id, or, for a call that comes without one, the
//! session's escalated call of the same request (action and arguments, by
//! digest) whose escalation is approved and not yet used: a retry after a
//! hold timed out, on any server and after a restart, since both the call
//! and its escalation are stored. The call takes that call's id and
//! consumes its approval by compare-and-set in the store, so of retries
//! racing for one approval exactly one proceeds; the others are new calls
//! and escalate afresh. A retry of the same call id that finds the
//! approval used by another request, whose record of the call has not
//! landed yet, waits briefly for that record and answers it.

use serde_json::{Value, json};
use warden_core::audit::Digest;
use warden_core::envelope::{ContextDecision, Envelope, Sensitivity};
use warden_core::gate::{Assessment, GateCall, GateContext, PlanUse, Verdicts, assess};
use warden_core::ids::{ActionName, AgentId, CallId, SessionId};
use warden_core::plan::Plan;
use warden_core::provenance::SourceIndex;
use warden_core::time::Timestamp;
use warden_store::{
    CallRecord, CallStatus, EscalationRecord, EscalationStatus, EscalationTarget, PutEscalation,
    SessionHead, SessionStatus, SessionUpdate, Store,
};

use super::memory::executed_by_engine;
use super::session_reasons as sr;
use super::{CallAnswer, MAX_ARGUMENT_BYTES, MAX_CALLS, MAX_SESSION_ATTEMPTS, digest_of};
use warden_core::decision::Verdict;

use crate::engine::{Caller, Engine, engine_reasons as er, ops, random_id};
use crate::error::{ConflictKind, EngineError};

/// A call an agent proposes.
#[derive(Debug, Clone)]
pub struct ProposedCall {
    /// The call id (an idempotency key). When absent, a call with the
    /// same action and arguments as the session's approved, unused held
    /// call takes up that call (once); otherwise an id is generated.
    pub call_id: Option<CallId>,
    /// The action, as the agent named it.
    pub action: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

/// Whether a call without a call id may still take up an approved held
/// call of the same request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// It may: nothing looked up yet.
    Possible,
    /// It took one up (its id is now the held call's).
    Adopted,
    /// It may not: it came with a call id, found none, or lost the held
    /// call to another retry.
    Lost,
}

/// The pauses (milliseconds) of a retry waiting for the request that used
/// its call's approval to record the call.
const APPROVAL_USE_WAITS_MS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

impl Retry {
    fn new(fresh: bool) -> Self {
        if fresh { Retry::Possible } else { Retry::Lost }
    }
}

/// The answer form of what the envelope decided about a call.
fn context_json(envelope: Option<&Envelope>, cd: Option<&ContextDecision>) -> Value {
    match (envelope, cd) {
        (Some(e), Some(cd)) => json!({
            "envelope_id": e.envelope_id(),
            "envelope_version": e.version(),
            "classification": cd.projected_sensitivity,
            "context_reason": cd.reason,
        }),
        _ => Value::Null,
    }
}

impl<S: Store> Engine<S> {
    /// Decide one call of a session before it runs, and record the answer
    /// with the call (see the module docs). Only the session's agent gates
    /// its calls. Every decided call is an answer, whatever its verdict;
    /// errors are malformed input (nothing recorded), an unknown session
    /// or call-id conflicts.
    pub async fn session_call(
        &self,
        caller: &Caller,
        session_id: &SessionId,
        call: ProposedCall,
    ) -> Result<CallAnswer, EngineError> {
        let Caller::Agent(actor) = caller else {
            return Err(EngineError::input(
                "caller",
                "calls are gated for the session's agent, with its own token",
            ));
        };
        if !call.arguments.is_object() {
            return Err(EngineError::input("arguments", "must be a JSON object"));
        }
        let size = warden_core::canonical::to_canonical(&call.arguments).len();
        if size > MAX_ARGUMENT_BYTES {
            return Err(EngineError::input(
                "arguments",
                format!("{size} bytes is over the limit of {MAX_ARGUMENT_BYTES}"),
            ));
        }
        // `fresh`: the engine chose the id, so no escalation can name it;
        // such a call may take up an approved held call of the same
        // request (`retry`), once.
        let fresh = call.call_id.is_none();
        let mut call_id = match call.call_id.clone() {
            Some(id) => id,
            None => Self::new_call_id()?,
        };
        let mut retry = Retry::new(fresh);
        let hash = digest_of(&json!({"action": call.action, "arguments": call.arguments}));
        let mut resource = format!("{session_id}:{call_id}");
        let mut approved = false;
        // The pending escalation this request stored for its call, if any.
        let mut held: Option<EscalationTarget> = None;
        for _ in 0..MAX_SESSION_ATTEMPTS {
            let now = self.now();
            let (state, cached) = self.head_for_call(caller, session_id, &call_id).await?;
            let existing = state.call.clone();
            if retry == Retry::Adopted
                && existing
                    .as_ref()
                    .is_some_and(|c| c.arguments_hash != hash || c.status != CallStatus::Escalated)
            {
                // Another retry took the held call first (or it is not the
                // call its escalation named): this one is a new call.
                call_id = Self::new_call_id()?;
                resource = format!("{session_id}:{call_id}");
                retry = Retry::Lost;
                approved = false;
                continue;
            }
            if let Some(existing) = &existing {
                if existing.arguments_hash != hash {
                    return Err(EngineError::Conflict {
                        kind: ConflictKind::CallId,
                        id: call_id.to_string(),
                    });
                }
                if existing.status == CallStatus::Allowed
                    && executed_by_engine(existing.action.as_str())
                {
                    // Allowed, and stopped before its result was recorded:
                    // perform it now (the repeat is recorded first).
                    let replay = self
                        .replay_call(caller, existing.clone(), resource.clone(), now)
                        .await?;
                    return self
                        .execute_session_memory(
                            caller,
                            actor,
                            session_id,
                            existing.clone(),
                            replay.decision,
                            &call.arguments,
                        )
                        .await;
                }
                if existing.status != CallStatus::Escalated {
                    if let Some(slot) = held.take() {
                        // The call was decided meanwhile (another retry used
                        // its approval, perhaps on another server): the
                        // escalation this request stored can never be used.
                        self.withdraw_slot(caller, &slot, now).await?;
                    }
                    return self
                        .replay_call(caller, existing.clone(), resource, now)
                        .await;
                }
            }
            let index = self.index_of_head(&state, cached)?;
            let plan = self.plan_of(&state.session)?;
            let envelope = match (&state.session.envelope_id, self.context_policy()) {
                (Some(id), Some(policy)) => Some(self.load_envelope(policy, id).await?),
                _ => None,
            };
            let mut a = self.assess(
                actor,
                &state,
                &index,
                plan.as_deref(),
                envelope.as_ref(),
                &call,
            )?;
            // The approval binds the call's action and arguments (by the
            // digest the call record keeps too).
            let target = EscalationTarget::Call {
                session_id: session_id.clone(),
                call_id: call_id.clone(),
                request_digest: Some(hash),
            };
            let mut escalation_id = None;
            if a.verdict == Verdict::Escalate && retry == Retry::Possible {
                if let Some(held) = self.approved_held_call(session_id, hash).await? {
                    call_id = held;
                    resource = format!("{session_id}:{call_id}");
                    retry = Retry::Adopted;
                    continue;
                }
                retry = Retry::Lost;
            }
            if a.verdict == Verdict::Escalate {
                // An id the engine chose names no escalation: nothing to
                // consume unless it is a held call's.
                let may_consume = !fresh || retry == Retry::Adopted;
                if !approved && may_consume {
                    let d = self.decision(
                        caller,
                        Verdict::Allow,
                        er::ESCALATION_APPROVED,
                        ops::SESSION_CALL,
                        resource.clone(),
                        now,
                    );
                    approved = self
                        .consume_approval(target.clone(), &d, json!({"call_id": call_id}), now)
                        .await?;
                    if !approved && retry == Retry::Adopted {
                        // Another retry used the approval: a new call.
                        call_id = Self::new_call_id()?;
                        resource = format!("{session_id}:{call_id}");
                        retry = Retry::Lost;
                        continue;
                    }
                    if !approved
                        && self.approval_used_elsewhere(existing.as_ref()).await?
                        && self
                            .await_next_revision(caller, session_id, &call_id, &state)
                            .await?
                    {
                        // Another request (on any server) used this call's
                        // approval and has recorded its decision since:
                        // answer as it does instead of holding the call
                        // for a second review.
                        continue;
                    }
                }
                if approved {
                    a.verdict = if a.obligations.is_empty() {
                        Verdict::Allow
                    } else {
                        Verdict::Constrain
                    };
                    a.reason = er::ESCALATION_APPROVED;
                } else {
                    let (id, created) = self
                        .hold_call(
                            caller,
                            target.clone(),
                            &resource,
                            &a,
                            envelope.as_ref(),
                            json!({"action": call.action, "arguments": call.arguments}),
                            now,
                        )
                        .await?;
                    if created {
                        held = Some(target.clone());
                    }
                    escalation_id = Some(id);
                }
            }
            let status = match a.verdict {
                Verdict::Allow | Verdict::Constrain => CallStatus::Allowed,
                Verdict::Escalate => CallStatus::Escalated,
                Verdict::Deny => CallStatus::Denied,
            };
            let mut decision = self.decision(
                caller,
                a.verdict,
                a.reason.clone(),
                ops::SESSION_CALL,
                resource.clone(),
                now,
            );
            decision.obligations.clone_from(&a.obligations);
            let detail = json!({
                "reasons": Self::reason_list(&a.reasons),
                "obligations": a.obligations,
                "provenance": a.provenance_json(),
                "context": context_json(envelope.as_ref(), a.context.as_ref()),
                "plan_step": a.plan_step.as_ref().map(|(_, s)| s),
            });
            let record = CallRecord {
                call_id: call_id.clone(),
                seq: existing.as_ref().map_or(state.calls, |c| c.seq),
                action: ActionName::parse(&call.action)
                    .or_else(|_| ActionName::parse("unknown"))
                    .map_err(|e| EngineError::internal(format!("action name: {e}")))?,
                arguments_hash: hash,
                verdict: a.verdict,
                reason: a.reason.clone(),
                detail: detail.clone(),
                plan_step: a.plan_step.as_ref().map(|(_, s)| s.clone()),
                escalation_id: escalation_id.clone(),
                status,
                decided_at: now,
                result_hash: None,
                result_labels: Vec::new(),
                completed_at: None,
            };
            let mut session = state.session.clone();
            session.revision = state.session.revision + 1;
            if status == CallStatus::Allowed
                && let (Some((i, _)), Some(plan)) = (&a.plan_step, session.plan.as_mut())
                && let Some(slot) = plan.used_by.get_mut(*i)
            {
                *slot = Some(call_id.clone());
            }
            let draft = self.draft(&decision).with_details(json!({
                "session_id": session_id,
                "call_id": call_id,
                "action": call.action,
                "arguments_hash": hash.to_hex(),
                "escalation_id": escalation_id,
                "detail": detail,
            }));
            let update = SessionUpdate {
                session,
                sources: None,
                call: Some(record.clone()),
            };
            if self
                .commit_session(update, state.session.revision, draft)
                .await?
            {
                // The index did not change: it is the next revision's too.
                self.inner.session_indexes.put(
                    session_id.clone(),
                    state.session.revision + 1,
                    index,
                );
                if status != CallStatus::Escalated
                    && (approved
                        || existing
                            .as_ref()
                            .is_some_and(|c| c.status == CallStatus::Escalated))
                {
                    // The call is decided: a request for it that lost the
                    // race for its approval and stored an escalation just
                    // after the approval was used can never proceed.
                    self.withdraw_slot(caller, &target, now).await?;
                }
                if status == CallStatus::Allowed && executed_by_engine(&call.action) {
                    return self
                        .execute_session_memory(
                            caller,
                            actor,
                            session_id,
                            record,
                            decision,
                            &call.arguments,
                        )
                        .await;
                }
                return Ok(CallAnswer {
                    decision,
                    call: record,
                    replayed: false,
                    result: None,
                });
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::SessionContention,
            id: session_id.to_string(),
        })
    }

    /// Whether `existing` is a held call whose approval another request
    /// used: the escalation it was held under is consumed while the call
    /// is still recorded as escalated (that request is recording it).
    async fn approval_used_elsewhere(
        &self,
        existing: Option<&CallRecord>,
    ) -> Result<bool, EngineError> {
        let Some(id) = existing
            .filter(|c| c.status == CallStatus::Escalated)
            .and_then(|c| c.escalation_id.clone())
        else {
            return Ok(false);
        };
        let escalation = self.inner.store.get_escalation(id).await?;
        Ok(escalation.is_some_and(|e| e.status == EscalationStatus::Consumed))
    }

    /// Wait (at most [`APPROVAL_USE_WAITS_MS`] in all, about an eighth of
    /// a second) for the session to move past the revision `seen` was read
    /// at; whether it did. A request that used an approval records the
    /// call in its next write, so a retry that lost the approval to it
    /// waits for that record instead of answering with a new escalation
    /// nobody could use. One that never records it (it failed) leaves the
    /// retry to hold the call for review, as before the wait.
    async fn await_next_revision(
        &self,
        caller: &Caller,
        session_id: &SessionId,
        call_id: &CallId,
        seen: &SessionHead,
    ) -> Result<bool, EngineError> {
        for pause in APPROVAL_USE_WAITS_MS {
            tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            let (head, _) = self.head_for_call(caller, session_id, call_id).await?;
            if head.session.revision != seen.session.revision {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The session's held call of the request `digest` whose escalation is
    /// approved and not yet used (the oldest, if several), from the store.
    async fn approved_held_call(
        &self,
        session_id: &SessionId,
        digest: Digest,
    ) -> Result<Option<CallId>, EngineError> {
        let approved = self
            .inner
            .store
            .list_escalations(Some(EscalationStatus::Approved))
            .await?;
        Ok(approved.into_iter().find_map(|e| match e.target {
            EscalationTarget::Call {
                session_id: s,
                call_id,
                request_digest: Some(d),
            } if s == *session_id && d == digest => Some(call_id),
            _ => None,
        }))
    }

    /// The recorded answer to a repeated call, with the replay recorded.
    async fn replay_call(
        &self,
        caller: &Caller,
        call: CallRecord,
        resource: String,
        now: Timestamp,
    ) -> Result<CallAnswer, EngineError> {
        let d = self.decision(
            caller,
            call.verdict,
            sr::CALL_REPLAYED,
            ops::SESSION_CALL,
            resource,
            now,
        );
        self.inner
            .store
            .append_audit(vec![self.draft(&d).with_details(json!({
                "recorded_reason": call.reason,
                "status": call.status.as_str(),
            }))])
            .await?;
        Ok(CallAnswer {
            decision: d,
            call,
            replayed: true,
            result: None,
        })
    }

    /// Hold a call for review: its pending escalation (new, or the one
    /// already open: the id, and whether this request stored it), showing the call (`request`: its action and
    /// arguments, whose digest the target binds, as the call record's
    /// `arguments_hash` does). The escalate decision is recorded with the
    /// call.
    #[expect(
        clippy::too_many_arguments,
        reason = "the escalation record is built from the call's parts"
    )]
    async fn hold_call(
        &self,
        caller: &Caller,
        target: EscalationTarget,
        resource: &str,
        a: &Assessment,
        envelope: Option<&Envelope>,
        request: Value,
        now: Timestamp,
    ) -> Result<(String, bool), EngineError> {
        let id = random_id("esc")?;
        let record = EscalationRecord {
            escalation_id: id.clone(),
            target,
            requested_by: caller.clone(),
            operation: ops::SESSION_CALL.to_owned(),
            resource: resource.to_owned(),
            reason: a.reason.clone(),
            envelope_id: envelope.map(|e| e.envelope_id().clone()),
            envelope_version: envelope.map(Envelope::version),
            classification: a
                .context
                .as_ref()
                .map_or(Sensitivity::Public, |cd| cd.projected_sensitivity),
            obligations: a.obligations.clone(),
            request: Some(request),
            status: EscalationStatus::Pending,
            created_at: now,
            resolved_by: None,
            resolved_at: None,
            rejection_reason: None,
            consumed_at: None,
        };
        let out = self
            .inner
            .store
            .put_escalation(record, Box::new(|_| Vec::new()))
            .await?;
        Ok(match out {
            PutEscalation::Created => (id, true),
            PutEscalation::Existing(e) => (e.escalation_id, false),
        })
    }

    /// Every check of one call, in order (see the module docs): the
    /// session's own state, then the one gate of `warden_core::gate`
    /// (`plan`: the session's stored plan, parsed).
    fn assess(
        &self,
        actor: &AgentId,
        state: &SessionHead,
        index: &SourceIndex,
        plan: Option<&Plan>,
        envelope: Option<&Envelope>,
        call: &ProposedCall,
    ) -> Result<Assessment, EngineError> {
        let mut prior = Verdicts::default();
        if state.session.status == SessionStatus::Cancelled {
            prior.add(Verdict::Deny, sr::SESSION_CANCELLED);
        }
        if state.calls >= MAX_CALLS as u64 {
            prior.add(Verdict::Deny, sr::SESSION_CALL_LIMIT);
        }
        let policy = self.policy();
        let plan_use = match (plan, &state.session.plan) {
            (Some(plan), Some(stored)) => PlanUse::Match {
                plan,
                used_by: &stored.used_by,
            },
            _ => PlanUse::None,
        };
        let st = self.read_state()?;
        let ctx = GateContext {
            hierarchy: &st.hierarchy,
            policy,
        };
        Ok(assess(
            &ctx,
            &GateCall {
                actor,
                action: &call.action,
                arguments: &call.arguments,
                plan: plan_use,
                index,
                envelope,
            },
            prior,
        ))
    }
}
