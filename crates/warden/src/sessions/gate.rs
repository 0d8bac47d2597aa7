//! Deciding one call of a session.
//!
//! In order, every check contributing its verdict (deny wins over
//! escalate, escalate over constrain, constrain over allow):
//!
//! 1. the session is open and holds fewer than [`super::MAX_CALLS`] calls;
//! 2. the agent holds the capability (`unknown_action`, `agent_revoked`,
//!    `capability_not_inherited`);
//! 3. the catalogue's argument schema and rules;
//! 4. with a plan, the planned step the call uses: the first in plan order
//!    whose action and literal arguments it matches and, for an effect (a
//!    state change or an outbound read), that no allowed call used yet; a
//!    planned read may be used again, and a binding to it refers to the
//!    latest call that used it (`unplanned_call`,
//!    escalated or denied as the bundle's `sessions.unplanned` says), and
//!    the bindings of its bound arguments (`binding_not_satisfied:<path>`);
//!    literal arguments of the plan are vouched for by the plan;
//! 5. the provenance of every argument value the action's rules guard
//!    (`argument_not_vouched:<path>`, `argument_confusable:<path>`);
//! 6. the session's context envelope (restrictions, the backstop, the
//!    sensitivity floor).
//!
//! An escalated call is held for review (an escalation whose target is the
//! call); the same call again after approval proceeds once.

use serde_json::{Value, json};
use warden_core::decision::{Obligation, Reason, Verdict, reasons};
use warden_core::envelope::{ContextRequest, Envelope, Sensitivity, decide};
use warden_core::ids::{ActionName, AgentId, CallId, SessionId, StepId};
use warden_core::plan::{PlanMatch, match_call};
use warden_core::provenance::{Origin, Otherwise, SourceId, SourceIndex, ValueProvenance};
use warden_core::time::Timestamp;
use warden_store::{
    CallRecord, CallStatus, EscalationRecord, EscalationStatus, EscalationTarget, PutEscalation,
    SessionHead, SessionStatus, SessionUpdate, Store,
};

use super::session_reasons as sr;
use super::{CallAnswer, MAX_ARGUMENT_BYTES, MAX_CALLS, MAX_SESSION_ATTEMPTS, digest_of};
use warden_core::preflight::{PreflightContext, check_call};

use crate::engine::{Caller, Engine, engine_reasons as er, ops, random_id};
use crate::error::{ConflictKind, EngineError};

/// A call an agent proposes.
#[derive(Debug, Clone)]
pub struct ProposedCall {
    /// The call id (an idempotency key); generated when absent.
    pub call_id: Option<CallId>,
    /// The action, as the agent named it.
    pub action: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

/// What one decision found, before it is recorded.
struct Assessment {
    verdict: Verdict,
    reason: Reason,
    reasons: Vec<Reason>,
    obligations: Vec<Obligation>,
    plan_step: Option<(usize, StepId)>,
    provenance: Vec<Value>,
    context: Option<Value>,
    sensitivity: Sensitivity,
    envelope: Option<(warden_core::envelope::EnvelopeId, u64)>,
}

/// Verdicts by strength.
fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Allow => 0,
        Verdict::Constrain => 1,
        Verdict::Escalate => 2,
        Verdict::Deny => 3,
    }
}

/// Collects verdicts and reasons in check order.
#[derive(Default)]
struct Verdicts {
    found: Vec<(Verdict, Reason)>,
}

impl Verdicts {
    fn add(&mut self, verdict: Verdict, reason: Reason) {
        if verdict != Verdict::Allow && !self.found.iter().any(|(_, r)| *r == reason) {
            self.found.push((verdict, reason));
        }
    }

    fn winner(&self) -> (Verdict, Reason) {
        let verdict = self
            .found
            .iter()
            .map(|(v, _)| *v)
            .max_by_key(|v| rank(*v))
            .unwrap_or(Verdict::Allow);
        let reason = self
            .found
            .iter()
            .find(|(v, _)| *v == verdict)
            .map(|(_, r)| r.clone())
            .unwrap_or(sr::CALL_ALLOWED);
        (verdict, reason)
    }

    fn reasons(&self) -> Vec<Reason> {
        self.found.iter().map(|(_, r)| r.clone()).collect()
    }
}

fn otherwise_verdict(o: Otherwise) -> Verdict {
    match o {
        Otherwise::Escalate => Verdict::Escalate,
        Otherwise::Deny => Verdict::Deny,
    }
}

/// The answer form of one value's provenance.
fn provenance_json(argument: &str, from: &[Origin], p: &ValueProvenance, exempt: bool) -> Value {
    let vouched = exempt || p.origins.iter().any(|o| from.contains(o));
    json!({
        "path": p.path,
        "rule": argument,
        "from": from,
        "origins": if exempt { vec![Origin::Plan] } else { p.origins.clone() },
        "sources": p.hits.iter().map(|h| json!({
            "origin": h.origin, "source": h.source.to_string(), "field": h.field, "owner": h.owner,
        })).collect::<Vec<_>>(),
        "vouched": vouched,
        "short": p.short,
        "invisible": p.invisible,
        "unsearchable_content": p.unsearchable_content,
        "confusable_with": p.confusable_with.as_ref().map(|h| json!({
            "origin": h.origin, "source": h.source.to_string(), "field": h.field,
        })),
    })
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
        let call_id = match call.call_id.clone() {
            Some(id) => id,
            None => Self::new_call_id()?,
        };
        let hash = digest_of(&json!({"action": call.action, "arguments": call.arguments}));
        let resource = format!("{session_id}:{call_id}");
        let mut approved = false;
        for _ in 0..MAX_SESSION_ATTEMPTS {
            let now = self.now();
            let (state, cached) = self.head_for_call(caller, session_id, &call_id).await?;
            let existing = state.call.clone();
            if let Some(existing) = &existing {
                if existing.arguments_hash != hash {
                    return Err(EngineError::Conflict {
                        kind: ConflictKind::CallId,
                        id: call_id.to_string(),
                    });
                }
                if existing.status != CallStatus::Escalated {
                    return self
                        .replay_call(caller, existing.clone(), resource, now)
                        .await;
                }
            }
            let index = self.index_of_head(&state, cached)?;
            let envelope = match (&state.session.envelope_id, self.context_policy()) {
                (Some(id), Some(policy)) => Some(self.load_envelope(policy, id).await?),
                _ => None,
            };
            let mut a = self.assess(actor, &state, &index, envelope.as_ref(), &call)?;
            let target = EscalationTarget::Call {
                session_id: session_id.clone(),
                call_id: call_id.clone(),
            };
            let mut escalation_id = None;
            if a.verdict == Verdict::Escalate {
                if !approved {
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
                }
                if approved {
                    a.verdict = if a.obligations.is_empty() {
                        Verdict::Allow
                    } else {
                        Verdict::Constrain
                    };
                    a.reason = er::ESCALATION_APPROVED;
                } else {
                    escalation_id = Some(self.hold_call(caller, target, &resource, &a, now).await?);
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
                "provenance": a.provenance,
                "context": a.context,
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
                return Ok(CallAnswer {
                    decision,
                    call: record,
                    replayed: false,
                });
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::SessionContention,
            id: session_id.to_string(),
        })
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
        })
    }

    /// Hold a call for review: its pending escalation (new, or the one
    /// already open). The escalate decision is recorded with the call.
    async fn hold_call(
        &self,
        caller: &Caller,
        target: EscalationTarget,
        resource: &str,
        a: &Assessment,
        now: Timestamp,
    ) -> Result<String, EngineError> {
        let id = random_id("esc")?;
        let record = EscalationRecord {
            escalation_id: id.clone(),
            target,
            requested_by: caller.clone(),
            operation: ops::SESSION_CALL.to_owned(),
            resource: resource.to_owned(),
            reason: a.reason.clone(),
            envelope_id: a.envelope.as_ref().map(|(i, _)| i.clone()),
            envelope_version: a.envelope.as_ref().map(|(_, v)| *v),
            classification: a.sensitivity,
            obligations: a.obligations.clone(),
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
            PutEscalation::Created => id,
            PutEscalation::Existing(e) => e.escalation_id,
        })
    }

    /// Every check of one call, in order (see the module docs).
    fn assess(
        &self,
        actor: &AgentId,
        state: &SessionHead,
        index: &SourceIndex,
        envelope: Option<&Envelope>,
        call: &ProposedCall,
    ) -> Result<Assessment, EngineError> {
        let mut v = Verdicts::default();
        if state.session.status == SessionStatus::Cancelled {
            v.add(Verdict::Deny, sr::SESSION_CANCELLED);
        }
        if state.calls >= MAX_CALLS as u64 {
            v.add(Verdict::Deny, sr::SESSION_CALL_LIMIT);
        }
        let policy = self.policy();
        // The static checks a step of an SOP gets (capability, schema,
        // argument rules, memory arguments), on the concrete call.
        match ActionName::parse(&call.action) {
            Err(_) => v.add(Verdict::Deny, reasons::UNKNOWN_ACTION),
            Ok(action) => {
                let st = self.read_state()?;
                let ctx = PreflightContext {
                    hierarchy: &st.hierarchy,
                    catalogue: &policy.catalogue,
                    policy_version: &policy.version,
                };
                for r in check_call(&ctx, actor, &action, &call.arguments) {
                    v.add(Verdict::Deny, r);
                }
            }
        }
        let compiled = policy.catalogue.by_name(&call.action);
        // The plan.
        let mut plan_step = None;
        let mut exempt: Vec<String> = Vec::new();
        if let Some(stored) = &state.session.plan {
            let plan = warden_core::plan::parse_plan(&stored.plan, &policy.sop_limits)
                .map_err(|e| EngineError::internal(format!("stored plan unreadable: {e}")))?;
            // A planned effect (a state change or an outbound read) is used
            // once; a planned read stays available, so a read the model
            // repeats (or one an injection adds) never takes the user's.
            let used: Vec<bool> = stored
                .used_by
                .iter()
                .zip(plan.steps())
                .map(|(u, step)| {
                    u.is_some()
                        && policy
                            .catalogue
                            .by_name(step.action.as_str())
                            .is_none_or(|a| a.is_effect())
                })
                .collect();
            let action = ActionName::parse(&call.action).ok();
            let matched = match &action {
                Some(action) => match_call(&plan, &used, action, &call.arguments),
                None => PlanMatch::Unplanned { closest: None },
            };
            match matched {
                PlanMatch::Unplanned { .. } => {
                    v.add(
                        otherwise_verdict(policy.sessions().unplanned),
                        sr::UNPLANNED_CALL,
                    );
                }
                PlanMatch::Step {
                    index: i,
                    step_id,
                    literal_paths,
                    bound,
                } => {
                    exempt = literal_paths;
                    for b in &bound {
                        let mode = b.binding.matching.unwrap_or_default();
                        let mut ok = true;
                        if let Some(step) = &b.binding.step {
                            let source = plan
                                .steps()
                                .iter()
                                .position(|s| &s.step_id == step)
                                .and_then(|p| stored.used_by.get(p).cloned().flatten());
                            ok = source.is_some_and(|c| {
                                SourceId::parse(c.as_str())
                                    .is_ok_and(|sid| index.occurs_in(&sid, &b.value, mode))
                            });
                        }
                        if ok && let Some(from) = &b.binding.from {
                            let p = index.provenance(b.path.clone(), &b.value, mode);
                            ok = p.origins.iter().any(|o| from.contains(o));
                        }
                        if !ok {
                            v.add(
                                otherwise_verdict(
                                    b.binding.otherwise.unwrap_or(Otherwise::Escalate),
                                ),
                                Reason::with_param(sr::BINDING_NOT_SATISFIED, &b.path),
                            );
                        }
                    }
                    plan_step = Some((i, step_id));
                }
            }
        }
        // Provenance of every guarded value.
        let mut provenance = Vec::new();
        if let Some(action) = compiled {
            let rules = action.provenance();
            let pd = rules.decide_except(&call.arguments, index, &exempt);
            for arg in &pd.arguments {
                for p in &arg.values {
                    let is_exempt = exempt.iter().any(|e| {
                        p.path == *e
                            || p.path
                                .strip_prefix(e.as_str())
                                .is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'))
                    });
                    provenance.push(provenance_json(&arg.argument, &arg.from, p, is_exempt));
                }
            }
            v.add(pd.verdict, pd.reason.clone());
            for r in pd.reasons {
                v.add(pd.verdict, r);
            }
        }
        // The envelope.
        let mut obligations = Vec::new();
        let mut context = None;
        let mut sensitivity = Sensitivity::Public;
        let mut env_ref = None;
        if let (Some(envelope), Some(cp)) = (envelope, self.context_policy()) {
            let cd = decide(
                envelope,
                cp,
                &ContextRequest::Action(self.action_ref(&call.action)),
            );
            v.add(cd.verdict, cd.reason.clone());
            obligations = cd.obligations.to_vec();
            sensitivity = cd.projected_sensitivity;
            env_ref = Some((envelope.envelope_id().clone(), envelope.version()));
            context = Some(json!({
                "envelope_id": envelope.envelope_id(),
                "envelope_version": envelope.version(),
                "classification": cd.projected_sensitivity,
                "context_reason": cd.reason,
            }));
        }
        let (mut verdict, reason) = v.winner();
        if verdict == Verdict::Allow && !obligations.is_empty() {
            verdict = Verdict::Constrain;
        }
        Ok(Assessment {
            verdict,
            reason,
            reasons: v.reasons(),
            obligations,
            plan_step,
            provenance,
            context,
            sensitivity,
            envelope: env_ref,
        })
    }
}
