//! Delegation: the envelope a child inherits, decided against its source.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::Verdict;
use warden_core::envelope::{
    ActionRef, ContextRequest, Envelope, TrustZone, WorkflowId, decide,
    effective_delegated_authority,
};
use warden_core::hierarchy::HierarchyError;
use warden_core::ids::ActionName;
use warden_core::time::Timestamp;
use warden_store::{EscalationTarget, Store};

use crate::agents::{RegisterAgent, Registration, RegistrationRefusal};
use crate::engine::{Caller, Engine, engine_reasons as er, ops, random_id};
use crate::error::{EngineError, Missing};

use super::escalation::BoundRequest;
use super::*;

/// The delegation request a reviewer approves: everything that shapes the
/// child (its id, parent, declared capabilities, tools, config) and its
/// envelope (the source run or session, the zone, the restrictions, the
/// redaction). An imported envelope is named by its carrier session, whose
/// id derives from the envelope's id and version.
fn delegation_request(
    req: &RegisterAgent,
    options: &DelegationOptions,
    zone: TrustZone,
) -> BoundRequest {
    BoundRequest::new(json!({
        "child": req.id,
        "parent": req.parent,
        "capabilities": req.capabilities,
        "tools": req.tools,
        "config": req.config,
        "from_run": options.from_run,
        "from_session": options.from_session,
        "zone": zone,
        "restrictions": options.restrictions,
        "redact_labels": options.redact_labels,
    }))
}

impl<S: Store> Engine<S> {
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
    ) -> Result<Result<Option<ChildContext>, Registration>, EngineError> {
        let Some(parent) = req.parent.clone() else {
            if *options != DelegationOptions::default() {
                return Err(EngineError::input(
                    "delegation",
                    "delegation options need a parent",
                ));
            }
            return Ok(Ok(None));
        };
        let resource = req.id.to_string();
        // The source run must be the delegator's own.
        let run_envelope = match (&options.from_run, &options.from_session) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(EngineError::input(
                    "from_session",
                    "a child inherits from one run or one session, not both",
                ));
            }
            (Some(run_id), None) => match self.inner.store.get_run(run_id.clone()).await? {
                Some(state) if state.run.agent == parent => state.run.envelope_id,
                _ => return Err(EngineError::not_found(Missing::Run, run_id.to_string())),
            },
            (None, Some(session_id)) => {
                match self.inner.store.get_session(session_id.clone()).await? {
                    Some(state) if state.session.agent == parent => state.session.envelope_id,
                    _ => {
                        return Err(EngineError::not_found(
                            Missing::Session,
                            session_id.to_string(),
                        ));
                    }
                }
            }
        };
        let Some(policy) = self.context_policy() else {
            return Ok(Ok(None));
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
            None => return Ok(Ok(None)),
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
            d.insert("from_session".into(), json!(options.from_session));
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
                return Ok(Err(Registration::Refused {
                    decision: d,
                    refusal: RegistrationRefusal::Context,
                }));
            }
            Verdict::Escalate => {
                // The approval binds this exact request: any other one for
                // the same child escalates afresh.
                let request = delegation_request(req, options, zone);
                let target = EscalationTarget::Delegation {
                    parent: parent.clone(),
                    child: req.id.clone(),
                    from_run: options.from_run.clone(),
                    request_digest: Some(request.digest),
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
                    let (decision, escalation_id, created) = self
                        .open_escalation(
                            target.clone(),
                            caller,
                            ops::AGENT_REGISTER,
                            resource.clone(),
                            &source,
                            &cd,
                            request,
                            now,
                        )
                        .await?;
                    if created && self.registered_now(&req.id).await? {
                        // The child id was registered meanwhile (another
                        // request's approval, perhaps on another server):
                        // this request can never proceed, so it is not
                        // left for a reviewer.
                        self.withdraw_slot(caller, &target, now).await?;
                        let e = HierarchyError::DuplicateAgent(req.id.clone());
                        let d = self.decision(
                            caller,
                            Verdict::Deny,
                            e.reason(),
                            ops::AGENT_REGISTER,
                            resource,
                            now,
                        );
                        self.record(&d).await?;
                        return Ok(Err(Registration::Refused {
                            decision: d,
                            refusal: RegistrationRefusal::Hierarchy(e),
                        }));
                    }
                    return Ok(Err(Registration::Escalated {
                        decision,
                        escalation_id,
                    }));
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
                return Ok(Err(Registration::Refused {
                    decision: d,
                    refusal: RegistrationRefusal::Envelope(e),
                }));
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
        Ok(Ok(Some(ChildContext {
            records,
            envelope_id: child_id,
            verdict,
            obligations,
            details,
        })))
    }
}
