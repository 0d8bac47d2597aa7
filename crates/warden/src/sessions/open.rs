//! Opening a session: who may, its trusted inputs, its plan, its envelope
//! (inherited, imported or new).

use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Reason, Verdict, reasons};
use warden_core::envelope::sign::SignedEnvelope;
use warden_core::envelope::{Envelope, WorkflowId};
use warden_core::ids::{AgentId, SessionId};
use warden_core::plan::Plan;
use warden_core::preflight::RunContext;
use warden_core::provenance::{SourceId, SourceIndex};
use warden_store::{
    CreateSession, EnvelopeImport, ImportRefusal, SessionRecord, SessionState, SessionStatus,
    Store, StoredPlan,
};

use super::session_reasons as sr;
use super::{MAX_TRUSTED_INPUTS, SessionView, digest_of};
use crate::engine::{Caller, Engine, ops, random_id};
use crate::error::{ConflictKind, EngineError};

/// A request to open a session.
#[derive(Debug, Clone, Default)]
pub struct OpenSession {
    /// The session id (an idempotency key); generated when absent.
    pub session_id: Option<SessionId>,
    /// The agent whose calls it decides; the caller when absent (the
    /// operator must name one).
    pub agent: Option<AgentId>,
    /// The user's request and any values the runtime vouches for: origin
    /// `user`. Never model output.
    pub trusted_inputs: Vec<Value>,
    /// A plan (the SOP form with bindings), admitted whole before anything
    /// is created.
    pub plan: Option<Value>,
    /// A signed envelope from a trusted issuer whose restrictions and
    /// sensitivity bind the session.
    pub from_envelope: Option<SignedEnvelope>,
}

/// Why a session was not opened (the decision says it in its reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionRefusal {
    /// The caller is neither the agent, an active ancestor, nor the
    /// operator; or the agent is revoked or unknown.
    NotPermitted,
    /// The plan's preflight refused a step.
    Plan {
        /// Every reason, in step order.
        reasons: Vec<Reason>,
    },
    /// The imported envelope is forged, from an unknown issuer, replayed
    /// or downgraded, or cannot bind this policy.
    Import,
}

/// What opening a session did.
#[derive(Debug, Clone)]
pub enum SessionOpening {
    /// Opened (or, for a repeated request with the same content, found).
    Opened {
        /// The decision (recorded).
        decision: Decision,
        /// The session.
        session: Box<SessionView>,
        /// Whether it existed already.
        existing: bool,
    },
    /// Refused; nothing was created.
    Refused {
        /// The decision (recorded).
        decision: Decision,
        /// Why.
        refusal: SessionRefusal,
    },
}

impl<S: Store> Engine<S> {
    /// Open a session (see the module docs). Nothing is created unless the
    /// whole request is admitted: the caller may act for the agent, every
    /// trusted input and the plan are well formed, the plan passes
    /// preflight, an imported envelope verifies and is neither replayed
    /// nor downgraded.
    pub async fn open_session(
        &self,
        caller: &Caller,
        request: OpenSession,
    ) -> Result<SessionOpening, EngineError> {
        let now = self.now();
        let agent = match (&request.agent, caller) {
            (Some(a), _) => a.clone(),
            (None, Caller::Agent(a)) => a.clone(),
            (None, Caller::Operator) => {
                return Err(EngineError::input(
                    "agent_id",
                    "the operator opens a session for a named agent",
                ));
            }
        };
        if request.trusted_inputs.len() > MAX_TRUSTED_INPUTS {
            return Err(EngineError::input(
                "trusted_inputs",
                format!("at most {MAX_TRUSTED_INPUTS} inputs"),
            ));
        }
        let session_id = match &request.session_id {
            Some(id) => id.clone(),
            None => SessionId::parse(&random_id("ses")?)
                .map_err(|e| EngineError::input("session_id", e))?,
        };
        let plan = match &request.plan {
            Some(v) => Some(warden_core::plan::parse_plan(v, &self.policy().sop_limits)?),
            None => None,
        };
        let resource = session_id.to_string();
        let refuse = |reason: Reason| {
            self.decision(
                caller,
                Verdict::Deny,
                reason,
                ops::SESSION_OPEN,
                resource.clone(),
                now,
            )
        };
        // Who may open it.
        let permitted_reason = {
            let state = self.read_state()?;
            match state.hierarchy.index_of(agent.as_str()) {
                None => Some(reasons::UNKNOWN_AGENT),
                Some(i) if !state.hierarchy.node(i).is_some_and(|n| n.is_active()) => {
                    Some(reasons::AGENT_REVOKED)
                }
                Some(_) => None,
            }
        };
        let permitted_reason = match permitted_reason {
            Some(r) => Some(r),
            None if !self.may_manage(caller, &agent, true)? => Some(sr::NOT_SESSION_AGENT),
            None => None,
        };
        if let Some(reason) = permitted_reason {
            let d = refuse(reason);
            self.inner
                .store
                .append_audit(vec![
                    self.draft(&d).with_details(json!({"agent_id": agent})),
                ])
                .await?;
            return Ok(SessionOpening::Refused {
                decision: d,
                refusal: SessionRefusal::NotPermitted,
            });
        }
        // The plan, whole.
        if let Some(plan) = &plan {
            let reasons = self.plan_preflight(&agent, plan, None)?;
            if !reasons.is_empty() {
                let d = refuse(sr::PLAN_REJECTED);
                let details = json!({
                    "agent_id": agent,
                    "reasons": Self::reason_list(&reasons),
                    "plan_hash": plan.hash().to_hex(),
                });
                self.inner
                    .store
                    .append_audit(vec![self.draft(&d).with_details(details)])
                    .await?;
                return Ok(SessionOpening::Refused {
                    decision: d,
                    refusal: SessionRefusal::Plan { reasons },
                });
            }
        }
        let trusted = Value::Array(request.trusted_inputs.clone());
        let trusted_inputs_hash = digest_of(&trusted);
        let plan_hash = plan.as_ref().map(Plan::hash);
        // A repeated request finds the session it opened.
        if let Some(existing) = self.inner.store.get_session(session_id.clone()).await? {
            return self
                .reopen(
                    caller,
                    existing,
                    &agent,
                    trusted_inputs_hash,
                    plan_hash,
                    now,
                )
                .await;
        }
        // The envelope: imported, inherited or new.
        let (envelope, import, envelope_draft) = match self
            .open_session_envelope(caller, &agent, &session_id, request.from_envelope, now)
            .await?
        {
            Ok(x) => x,
            Err((reason, details)) => {
                let d = refuse(reason);
                self.inner
                    .store
                    .append_audit(vec![self.draft(&d).with_details(details)])
                    .await?;
                return Ok(SessionOpening::Refused {
                    decision: d,
                    refusal: SessionRefusal::Import,
                });
            }
        };
        // The plan against the starting envelope: a step its restrictions
        // already deny could never run (restrictions never shrink), so the
        // plan is refused now, before anything is created.
        if let (Some(plan), Some(envelope), Some(policy)) =
            (&plan, &envelope, self.context_policy())
        {
            let run = RunContext { envelope, policy };
            let reasons = self.plan_preflight(&agent, plan, Some(run))?;
            if !reasons.is_empty() {
                let d = refuse(sr::PLAN_REJECTED);
                let details = json!({
                    "agent_id": agent,
                    "reasons": Self::reason_list(&reasons),
                    "plan_hash": plan.hash().to_hex(),
                    "envelope": {
                        "restrictions": envelope.to_record().restrictions,
                        "imported_from": import.as_ref().map(|i| &i.issuer),
                    },
                });
                self.inner
                    .store
                    .append_audit(vec![self.draft(&d).with_details(details)])
                    .await?;
                return Ok(SessionOpening::Refused {
                    decision: d,
                    refusal: SessionRefusal::Plan { reasons },
                });
            }
        }
        let envelope = envelope.map(|e| e.to_record());
        // The index: trusted inputs, plan literals.
        let key = self.session_key(&session_id)?;
        let mut index = SourceIndex::with_limits(key, self.index_limits());
        for (i, input) in request.trusted_inputs.iter().enumerate() {
            let id = SourceId::parse(&format!("input-{i}"))
                .map_err(|e| EngineError::internal(format!("source id: {e}")))?;
            index
                .record_user(id, input)
                .map_err(|e| EngineError::input(format!("trusted_inputs[{i}]"), e))?;
        }
        if let Some(plan) = &plan {
            let literals: Vec<Value> = plan.literals().into_iter().map(|(_, v)| v).collect();
            let id = SourceId::parse("plan")
                .map_err(|e| EngineError::internal(format!("source id: {e}")))?;
            index
                .record_plan(id, &Value::Array(literals))
                .map_err(|e| EngineError::input("plan", e))?;
        }
        let record = SessionRecord {
            session_id: session_id.clone(),
            agent: agent.clone(),
            opened_by: caller.clone(),
            created_at: now,
            policy_version: self.policy().version.clone(),
            status: SessionStatus::Open,
            closure: None,
            envelope_id: envelope.as_ref().map(|e| e.envelope_id.clone()),
            plan: plan.as_ref().map(|p| StoredPlan {
                plan: p.to_json(),
                hash: p.hash(),
                used_by: vec![None; p.steps().len()],
            }),
            imported: import.clone(),
            trusted_inputs_hash,
            revision: 1,
        };
        let d = self.decision(
            caller,
            Verdict::Allow,
            sr::SESSION_OPENED,
            ops::SESSION_OPEN,
            resource.clone(),
            now,
        );
        let details = json!({
            "agent_id": agent,
            "trusted_inputs": request.trusted_inputs.len(),
            "trusted_inputs_hash": trusted_inputs_hash.to_hex(),
            "plan_hash": plan_hash.map(|h| h.to_hex()),
            "envelope_id": record.envelope_id,
            "imported": import.as_ref().map(|i| json!({
                "issuer": i.issuer, "envelope_id": i.envelope_id, "version": i.version,
            })),
        });
        let mut drafts: Vec<AuditDraft> = envelope_draft.into_iter().collect();
        drafts.push(self.draft(&d).with_details(details));
        let refused = self.draft(&refuse(sr::ENVELOPE_REPLAYED));
        let downgraded = self.draft(&refuse(sr::ENVELOPE_DOWNGRADED));
        let state = SessionState {
            session: record,
            sources: index.to_bytes(),
            calls: Vec::new(),
        };
        let outcome = self
            .inner
            .store
            .create_session(
                state,
                envelope,
                import,
                Box::new(move |o| match o {
                    CreateSession::Created => drafts,
                    CreateSession::Existing(_) => Vec::new(),
                    CreateSession::ImportRefused(ImportRefusal::Replayed { session_id }) => {
                        vec![refused.with_details(json!({"first_session_id": session_id}))]
                    }
                    CreateSession::ImportRefused(ImportRefusal::Downgraded { seen_version }) => {
                        vec![downgraded.with_details(json!({"seen_version": seen_version}))]
                    }
                }),
            )
            .await?;
        match outcome {
            CreateSession::Created => {
                let state = self.session_for(caller, &session_id, true).await?;
                Ok(SessionOpening::Opened {
                    decision: d,
                    session: Box::new(self.view_of(state).await?),
                    existing: false,
                })
            }
            CreateSession::Existing(existing) => {
                self.reopen(
                    caller,
                    *existing,
                    &agent,
                    trusted_inputs_hash,
                    plan_hash,
                    now,
                )
                .await
            }
            CreateSession::ImportRefused(r) => {
                let reason = match r {
                    ImportRefusal::Replayed { .. } => sr::ENVELOPE_REPLAYED,
                    ImportRefusal::Downgraded { .. } => sr::ENVELOPE_DOWNGRADED,
                };
                Ok(SessionOpening::Refused {
                    decision: refuse(reason),
                    refusal: SessionRefusal::Import,
                })
            }
        }
    }

    /// A repeated open of an existing session: the same agent, trusted
    /// inputs and plan find it (recorded); anything else is a conflict.
    async fn reopen(
        &self,
        caller: &Caller,
        existing: SessionState,
        agent: &AgentId,
        trusted_inputs_hash: warden_core::audit::Digest,
        plan_hash: Option<warden_core::audit::Digest>,
        now: warden_core::time::Timestamp,
    ) -> Result<SessionOpening, EngineError> {
        let s = &existing.session;
        let same = &s.agent == agent
            && s.trusted_inputs_hash == trusted_inputs_hash
            && s.plan.as_ref().map(|p| p.hash) == plan_hash
            && &s.opened_by == caller;
        if !same {
            return Err(EngineError::Conflict {
                kind: ConflictKind::SessionId,
                id: s.session_id.to_string(),
            });
        }
        let d = self.decision(
            caller,
            Verdict::Allow,
            sr::SESSION_OPENED,
            ops::SESSION_OPEN,
            s.session_id.to_string(),
            now,
        );
        self.inner
            .store
            .append_audit(vec![self.draft(&d).with_details(json!({"existing": true}))])
            .await?;
        Ok(SessionOpening::Opened {
            decision: d,
            session: Box::new(self.view_of(existing).await?),
            existing: true,
        })
    }

    /// The session's first envelope (with a `context:` policy): the child
    /// of a verified imported envelope, else of the agent's inherited
    /// envelope, else a new root. `Err((reason, details))` refuses the
    /// session.
    async fn open_session_envelope(
        &self,
        caller: &Caller,
        agent: &AgentId,
        session_id: &SessionId,
        imported: Option<SignedEnvelope>,
        now: warden_core::time::Timestamp,
    ) -> Result<
        Result<(Option<Envelope>, Option<EnvelopeImport>, Option<AuditDraft>), (Reason, Value)>,
        EngineError,
    > {
        let Some(policy) = self.context_policy() else {
            if imported.is_some() {
                return Ok(Err((
                    sr::ENVELOPE_WITHOUT_CONTEXT,
                    json!({"agent_id": agent}),
                )));
            }
            return Ok(Ok((None, None, None)));
        };
        let id = crate::context::new_envelope_id()?;
        let extra = json!({"session_id": session_id});
        if let Some(token) = imported {
            let verified = match warden_core::envelope::sign::verify_signature(
                &token,
                self.policy().trusted_issuers(),
            ) {
                Ok(v) => v,
                Err(e) => {
                    return Ok(Err((
                        e.reason(),
                        json!({"issuer": token.issuer, "envelope_id": token.envelope.envelope_id}),
                    )));
                }
            };
            let source = match Envelope::restore(&verified.envelope, policy) {
                Ok(e) => e,
                Err(e) => {
                    return Ok(Err((
                        e.reason(),
                        json!({"issuer": verified.issuer, "envelope_id": verified.envelope.envelope_id}),
                    )));
                }
            };
            let (envelope, t) = source.delegate(policy, agent.clone(), id, &[], false)?;
            let mut details = extra;
            if let Value::Object(m) = &mut details {
                m.insert("imported_from".into(), json!(verified.issuer));
            }
            let draft = self.transition_draft(caller, ops::CONTEXT_OPEN, &t, details, now);
            let import = EnvelopeImport {
                issuer: verified.issuer.to_string(),
                envelope_id: verified.envelope.envelope_id.clone(),
                version: verified.envelope.version,
                restrictions: verified.envelope.restrictions.clone(),
                sensitivity: verified.envelope.aggregate_sensitivity,
                session_id: session_id.clone(),
                at: now,
            };
            return Ok(Ok((Some(envelope), Some(import), Some(draft))));
        }
        let workflow = WorkflowId::parse(session_id.as_str())
            .map_err(|e| EngineError::input("session_id", e))?;
        let opened = self
            .open_workflow_envelope(caller, agent, workflow, extra, now)
            .await?;
        Ok(Ok(match opened {
            Some((envelope, draft)) => (Some(envelope), None, Some(draft)),
            None => (None, None, None),
        }))
    }

    /// Every reason the plan's admission refuses (empty: admitted): its
    /// static checks, and with `run` every step against the session's
    /// starting envelope (`restricted_by:<label>`), as a run's admission
    /// does.
    fn plan_preflight(
        &self,
        agent: &AgentId,
        plan: &Plan,
        run: Option<RunContext<'_>>,
    ) -> Result<Vec<Reason>, EngineError> {
        let now = self.now();
        let state = self.read_state()?;
        let ctx = warden_core::preflight::PreflightContext {
            hierarchy: &state.hierarchy,
            catalogue: &self.policy().catalogue,
            policy_version: &self.policy().version,
        };
        let preflight = warden_core::plan::admit_plan(&ctx, agent, plan, run, now);
        let mut out = Vec::new();
        for step in preflight.rejected() {
            for r in &step.violations {
                if !out.contains(r) {
                    out.push(r.clone());
                }
            }
        }
        Ok(out)
    }
}
