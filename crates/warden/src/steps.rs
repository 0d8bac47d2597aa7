//! Steps of a run: the per-step gate, the ticket that carries the gate's
//! decision to the completion, and exactly-once outcomes.
//!
//! A run is an admitted SOP: a plan-bound session whose plan is fully
//! literal. Each step passes through [`Engine::begin_step`]: the run's own
//! checks (earlier steps completed, the run not stopped), then the one gate
//! every tool call passes (`warden_core::gate::assess`: the agent still
//! active and holding the capability, the catalogue's schema and rules, the
//! planned step, every argument vouched for by the plan, the run's
//! envelope). It is completed once: its outcome is recorded exactly once. A
//! step whose outcome is recorded is never executed again: a retry or a
//! re-run after a crash gets the recorded result back.
//!
//! # One pass per step
//!
//! `begin` loads the run once, decides the step once (structure, capability,
//! then the envelope) and, when the step may proceed, keeps a *ticket*: the
//! loaded run, the step, the envelope the gate decided against and the
//! gate's obligations. The completion consumes the ticket instead of
//! loading the run again and re-deciding the step: it folds the result's
//! labels onto the envelope the gate saw (reloading only if something else
//! wrote it meanwhile) and records the outcome.
//!
//! Memory steps (`memory.read`, `memory.write`) are executed by the engine
//! itself inside `begin` (it owns memory): the gate's decision is recorded in
//! the same transaction as the memory operation, and `begin` answers
//! [`StepGate::Executed`] with the recorded outcome. Every other step is
//! executed by the caller between `begin` ([`StepGate::Proceed`]) and
//! [`Engine::complete_step`] or [`Engine::complete_begun_step`].
//!
//! # One worker per step
//!
//! The first `begin` that the gate lets proceed takes the step's *lease* in
//! the store (`Store::lease_step`, a compare-and-set on the run's step, so
//! it holds across servers sharing a database and across restarts), for
//! the bundle's `limits.step_lease_ms` (five minutes by default). Until it
//! lapses every other `begin` answers [`StepGate::InProgress`] with its
//! expiry and runs nothing, and only the holder may record the outcome (the
//! store refuses anyone else's in the same compare-and-set). The holder is
//! named by its lease id: the one `begin` answered, or one the caller chose
//! and presents again (so a worker that restarts re-begins its own step).
//! After the lease lapses anyone may take the step over; a step whose
//! outcome is recorded is never begun again. So a retried step never runs
//! its effect twice while its lease holds; a worker that outlives its
//! lease without completing can be overtaken, and the step's
//! `operation_id` is the idempotency key its effect should carry.
//!
//! Tickets live in this engine's memory (a server's process); a ticket older
//! than the run TTL ([`Engine::set_run_ttl`]) is dropped. A completion on
//! another server than the `begin` presents the lease id instead.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Reason, Subject, Verdict};
use warden_core::envelope::reasons as context_reasons;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::memory::Visibility;
use warden_core::preflight::{MEMORY_READ, MEMORY_WRITE};
use warden_core::time::Timestamp;
use warden_store::{
    LeaseStep, RecordStep, RunRecord, RunState, RunStep, StepLease, StepOutcome, StepStatus, Store,
};

use crate::context::{ContextGate, Folded};
use crate::engine::{Engine, engine_reasons as er, ops, random_id};
use crate::error::{EngineError, Missing};
use crate::memory::{ReadStatus, WriteRequest};
use crate::tickets::{Gated, Ticket};

/// What the gate says about a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "gate", rename_all = "snake_case")]
pub enum StepGate {
    /// Run it (allow or constrain); the decision carries any obligations.
    /// Complete it with [`Engine::complete_step`].
    Proceed {
        /// The decision.
        decision: Decision,
        /// The operation id.
        operation_id: String,
        /// The action.
        action: ActionName,
        /// The arguments.
        arguments: Map<String, Value>,
        /// The lease this caller now holds on the step (present it to
        /// complete the step, or to begin it again after a crash).
        lease_id: String,
        /// When the lease lapses: after it anyone may take the step over.
        lease_expires_at: Timestamp,
    },
    /// Do not run it: another worker began the step and holds its lease
    /// until `lease_expires_at`; nothing was decided for this caller.
    InProgress {
        /// The decision (`step_in_progress`, verdict deny).
        decision: Decision,
        /// When the holder's lease lapses.
        lease_expires_at: Timestamp,
    },
    /// A memory step: the engine executed it and recorded its outcome.
    Executed {
        /// The gate's decision.
        decision: Decision,
        /// The operation id.
        operation_id: String,
        /// The action.
        action: ActionName,
        /// The arguments.
        arguments: Map<String, Value>,
        /// The recorded outcome.
        outcome: StepOutcome,
    },
    /// Its outcome was recorded before: here it is; do not run it again.
    Replay {
        /// The decision (`step_replayed`).
        decision: Decision,
        /// The recorded outcome.
        outcome: StepOutcome,
    },
    /// Do not run it (deny); the run is stopped if the step was recorded
    /// denied.
    Refused {
        /// The decision.
        decision: Decision,
        /// Why.
        refusal: StepRefusal,
    },
    /// Do not run it yet: it is held for human review. Once the escalation
    /// is approved, the next `begin_step` of this step proceeds (once); if
    /// it is rejected, the step is recorded denied and the run stops.
    Escalated {
        /// The decision (verdict `escalate`).
        decision: Decision,
        /// The pending escalation.
        escalation_id: String,
    },
}

/// Why the gate refused a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepRefusal {
    /// An earlier step has no outcome yet; nothing was recorded for this
    /// step (it may begin later).
    OutOfOrder,
    /// The run stopped at an earlier step (failed or denied).
    RunStopped,
    /// Denied (a lost capability, a revoked agent, the envelope's
    /// restrictions); the step is recorded denied and the run stops.
    Denied,
}

/// The outcome a caller reports for a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    /// The result value.
    #[serde(default)]
    pub result: Option<Value>,
    /// Labels the result carries.
    #[serde(default)]
    pub result_labels: Vec<Label>,
    /// An error: the step failed and the run stops.
    #[serde(default)]
    pub error: Option<String>,
}

/// The outcome of [`Engine::complete_begun_step`].
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// The step's outcome as recorded (now, or by an earlier completion).
    Recorded(StepOutcome),
    /// The gate has not let this step proceed (no `begin`, or its ticket
    /// expired); nothing was recorded.
    NotBegun,
    /// Another worker holds the step's live lease; nothing was recorded.
    LeaseHeld {
        /// When that lease lapses.
        lease_expires_at: Timestamp,
    },
}

/// A memory step's effect, read from its arguments once.
#[derive(Debug, Clone)]
pub(crate) enum MemoryCall {
    Read { namespace: Namespace, key: Key },
    Write(WriteRequest),
}

impl MemoryCall {
    /// The call a memory step's arguments describe (the preflight checked
    /// them against the built-in schema); an error names what is wrong.
    pub(crate) fn parse(action: &str, args: &Map<String, Value>) -> Result<Self, String> {
        let text = |name: &str| args.get(name).and_then(Value::as_str).unwrap_or_default();
        let namespace = Namespace::parse(text("namespace")).map_err(|e| e.to_string())?;
        let key = Key::parse(text("key")).map_err(|e| e.to_string())?;
        if action == MEMORY_READ {
            return Ok(MemoryCall::Read { namespace, key });
        }
        Ok(MemoryCall::Write(WriteRequest {
            namespace,
            key,
            value: args.get("value").cloned().unwrap_or(Value::Null),
            owner_agent_id: None,
            expected_revision: args.get("expected_revision").and_then(Value::as_u64),
            visibility: args
                .get("visibility")
                .and_then(Value::as_str)
                .and_then(Visibility::parse),
            class: None,
        }))
    }
}

/// The arguments of `step_id` in the run's admitted SOP.
pub(crate) fn step_arguments(run: &RunRecord, step_id: &StepId) -> Map<String, Value> {
    run.sop
        .get("steps")
        .and_then(Value::as_array)
        .and_then(|steps| {
            steps
                .iter()
                .find(|s| s.get("step_id").and_then(Value::as_str) == Some(step_id.as_str()))
        })
        .and_then(|s| s.get("arguments"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

impl<S: Store> Engine<S> {
    /// How long a begun step's ticket (and an unfinished run, for the
    /// `max_runs_in_flight` quota) is kept. Default: an hour.
    pub fn set_run_ttl(&self, ttl: Duration) {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.inner
            .run_ttl_ms
            .store(ms.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn run_ttl_ms(&self) -> i64 {
        self.inner
            .run_ttl_ms
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) async fn run_of(
        &self,
        actor: &AgentId,
        run_id: &RunId,
    ) -> Result<RunState, EngineError> {
        match self.inner.store.get_run(run_id.clone()).await? {
            Some(state) if &state.run.agent == actor => Ok(state),
            _ => Err(EngineError::not_found(Missing::Run, run_id)),
        }
    }

    /// The per-step gate (see the module docs), for a caller that names no
    /// lease: [`Engine::begin_step_as`] with none.
    pub async fn begin_step(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
    ) -> Result<StepGate, EngineError> {
        self.begin_step_as(actor, run_id, step_id, None).await
    }

    /// The per-step gate (see the module docs) as the holder `lease_id`
    /// (an identifier the caller chose, or `None`: a new one is made): a
    /// step whose live lease another holder has is
    /// [`StepGate::InProgress`]; one that proceeds is leased to `lease_id`.
    pub async fn begin_step_as(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
        lease_id: Option<&str>,
    ) -> Result<StepGate, EngineError> {
        if let Some(l) = lease_id {
            warden_core::ids::check_identifier(l).map_err(|e| {
                EngineError::input("lease_id", format!("is not a valid identifier: {e}"))
            })?;
        }
        let now = self.now();
        let caller = Subject::Agent(actor.clone());
        let state = self.run_of(actor, run_id).await?;
        let resource = format!("{run_id}:{step_id}");
        let Some(position) = state.run.steps.iter().position(|s| &s.step_id == step_id) else {
            return Err(EngineError::not_found(
                Missing::Step,
                format!("{run_id}:{step_id}"),
            ));
        };
        if let Some(outcome) = state.outcomes.get(step_id) {
            return self.replay_step(&caller, resource, outcome, now).await;
        }
        let Some(step) = state.run.steps.get(position).cloned() else {
            return Err(EngineError::not_found(
                Missing::Step,
                format!("{run_id}:{step_id}"),
            ));
        };
        if let Some(refused) = self
            .structural_refusal(actor, &state, position, &resource, now)
            .await?
        {
            return Ok(refused);
        }
        let engine_executed =
            step.action.as_str() == MEMORY_READ || step.action.as_str() == MEMORY_WRITE;
        if !engine_executed
            && let Some(lease) = state.leases.get(step_id)
            && !lease.yields_to(lease_id.unwrap_or_default(), now)
        {
            // Another worker is running it: decide nothing, run nothing.
            let d = self.in_progress(&caller, resource, now);
            self.inner
                .store
                .append_audit(vec![self.draft(&d).with_details(json!({
                    "lease_expires_at": lease.expires_at,
                }))])
                .await?;
            return Ok(StepGate::InProgress {
                decision: d,
                lease_expires_at: lease.expires_at,
            });
        }
        // The step's arguments, read once: decided by the gate, then handed
        // to the caller.
        let arguments = Value::Object(step_arguments(&state.run, step_id));
        let (decision, draft, gated) = match self
            .gate_step(actor, &state.run, &step, &arguments, now)
            .await?
        {
            ContextGate::Denied(decision) => {
                // The step is recorded denied: a ticket this process still
                // holds from an earlier `begin` (whose lease lapsed) is void.
                self.inner.tickets.forget(run_id, step_id)?;
                return Ok(StepGate::Refused {
                    decision,
                    refusal: StepRefusal::Denied,
                });
            }
            ContextGate::Escalated {
                decision,
                escalation_id,
                created,
            } => {
                if created
                    && let Some(now_state) = self.inner.store.get_run(run_id.clone()).await?
                    && let Some(outcome) = now_state.outcomes.get(step_id)
                {
                    // Another worker ran the step meanwhile (its approval,
                    // perhaps on another server): this escalation can never
                    // be used, so it is not left for a reviewer, and the
                    // step's outcome is the answer, as for any later begin.
                    self.withdraw_step_slot(&caller, &state.run, step_id, now)
                        .await?;
                    return self.replay_step(&caller, resource, outcome, now).await;
                }
                return Ok(StepGate::Escalated {
                    decision,
                    escalation_id,
                });
            }
            ContextGate::Open {
                decision,
                draft,
                gated,
            } => (decision, draft, gated),
        };
        let Value::Object(arguments) = arguments else {
            return Err(EngineError::internal("a step's arguments are an object"));
        };
        let holder = match lease_id {
            Some(l) => l.to_owned(),
            None => random_id("lease")?,
        };
        let ticket = Ticket {
            actor: actor.clone(),
            gated,
            run: Arc::new(state.run),
            step,
            issued_at: now,
            holder,
        };
        let action = ticket.step.action.clone();
        let operation_id = ticket.step.operation_id.clone();
        if action.as_str() == MEMORY_READ || action.as_str() == MEMORY_WRITE {
            // The gate's entry commits with the memory operation.
            let pre: Vec<AuditDraft> = draft.into_iter().collect();
            let result = match MemoryCall::parse(action.as_str(), &arguments) {
                Ok(call) => self.execute_memory_call(actor, call, pre).await?,
                Err(problem) => {
                    self.inner.store.append_audit(pre).await?;
                    StepResult {
                        error: Some(problem),
                        ..StepResult::default()
                    }
                }
            };
            let outcome = match self
                .finish_step(
                    actor,
                    &ticket.run,
                    &ticket.step,
                    ticket.gated.as_deref(),
                    None,
                    result,
                )
                .await?
            {
                Completion::Recorded(outcome) => outcome,
                Completion::NotBegun | Completion::LeaseHeld { .. } => {
                    return Err(EngineError::internal("a memory step is never leased"));
                }
            };
            return Ok(StepGate::Executed {
                decision,
                operation_id,
                action,
                arguments,
                outcome,
            });
        }
        // Take the step's lease; the gate's entry commits with it.
        let expires_at = Timestamp(
            now.0
                .saturating_add(i64::try_from(self.policy().step_lease_ms).unwrap_or(i64::MAX)),
        );
        let lease = StepLease {
            holder: ticket.holder.clone(),
            acquired_at: now,
            expires_at,
        };
        let held = self.in_progress(&caller, resource.clone(), now);
        let held_draft = self.draft(&held);
        let replayed = self.decision(
            &caller,
            Verdict::Allow,
            er::STEP_REPLAYED,
            ops::STEP_BEGIN,
            resource,
            now,
        );
        let replay_draft = self.draft(&replayed);
        let leased = self
            .inner
            .store
            .lease_step(
                run_id.clone(),
                step_id.clone(),
                lease,
                Box::new(move |o| match o {
                    LeaseStep::Granted => draft
                        .map(|d| d.with_details(json!({"lease_expires_at": expires_at})))
                        .into_iter()
                        .collect(),
                    LeaseStep::Held(l) => {
                        vec![held_draft.with_details(json!({"lease_expires_at": l.expires_at}))]
                    }
                    LeaseStep::Recorded(_) => vec![replay_draft],
                }),
            )
            .await?;
        match leased {
            LeaseStep::Granted => {}
            LeaseStep::Held(l) => {
                return Ok(StepGate::InProgress {
                    decision: held,
                    lease_expires_at: l.expires_at,
                });
            }
            LeaseStep::Recorded(outcome) => {
                return Ok(StepGate::Replay {
                    decision: replayed,
                    outcome,
                });
            }
        }
        let lease_id = ticket.holder.clone();
        self.inner.tickets.insert(ticket, now, self.run_ttl_ms())?;
        Ok(StepGate::Proceed {
            decision,
            operation_id,
            action,
            arguments,
            lease_id,
            lease_expires_at: expires_at,
        })
    }

    /// The decision of a `begin` that finds another holder's live lease.
    fn in_progress(&self, caller: &Subject, resource: String, now: Timestamp) -> Decision {
        self.decision(
            caller,
            Verdict::Deny,
            er::STEP_IN_PROGRESS,
            ops::STEP_BEGIN,
            resource,
            now,
        )
    }

    /// The answer to a begin of a step whose outcome is recorded: the
    /// outcome, with the replay recorded.
    async fn replay_step(
        &self,
        caller: &Subject,
        resource: String,
        outcome: &StepOutcome,
        now: Timestamp,
    ) -> Result<StepGate, EngineError> {
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::STEP_REPLAYED,
            ops::STEP_BEGIN,
            resource,
            now,
        );
        self.record(&d).await?;
        Ok(StepGate::Replay {
            decision: d,
            outcome: outcome.clone(),
        })
    }

    /// The refusal of a step by the run's own state (the run stopped, an
    /// earlier step open), recorded; nothing is recorded for the step (it
    /// may begin later, or never). Everything else is the gate's.
    async fn structural_refusal(
        &self,
        actor: &AgentId,
        state: &RunState,
        position: usize,
        resource: &str,
        now: Timestamp,
    ) -> Result<Option<StepGate>, EngineError> {
        let stopped = state
            .outcomes
            .values()
            .any(|o| o.status != StepStatus::Completed);
        let earlier_open = state
            .run
            .steps
            .iter()
            .take(position)
            .any(|s| !state.outcomes.contains_key(&s.step_id));
        let (reason, refusal) = if stopped {
            (er::RUN_STOPPED, StepRefusal::RunStopped)
        } else if earlier_open {
            (er::STEP_OUT_OF_ORDER, StepRefusal::OutOfOrder)
        } else {
            return Ok(None);
        };
        let d = self.decision(
            &Subject::Agent(actor.clone()),
            Verdict::Deny,
            reason,
            ops::STEP_BEGIN,
            resource.to_owned(),
            now,
        );
        self.record(&d).await?;
        Ok(Some(StepGate::Refused {
            decision: d,
            refusal,
        }))
    }

    /// Record a step's outcome, exactly once. A second report returns the
    /// first outcome unchanged.
    ///
    /// A step begun through [`Engine::begin_step`] completes from its
    /// ticket. A step completed without passing the gate is decided now:
    /// if the run's restrictions deny it (the gate was bypassed), its
    /// labels are still folded but the step is recorded `Denied`
    /// (`completed_without_gate`) and the run stops.
    ///
    /// With a `context:` policy the step's labels (reported and the
    /// action's catalogue `output_labels`) are folded into the run's
    /// envelope first, so the next step is gated by them; an unknown label
    /// records the step `Failed` (`unknown_label:<label>`) and changes
    /// nothing else.
    pub async fn complete_step(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
        result: StepResult,
    ) -> Result<StepOutcome, EngineError> {
        let now = self.now();
        let resource = format!("{run_id}:{step_id}");
        let completion = if let Some(t) =
            self.inner
                .tickets
                .take(actor, run_id, step_id, None, now, self.run_ttl_ms())?
        {
            self.finish_ticket(actor, t, result).await?
        } else {
            let state = self.run_of(actor, run_id).await?;
            let Some(step) = state.run.steps.iter().find(|s| &s.step_id == step_id) else {
                return Err(EngineError::not_found(Missing::Step, resource));
            };
            if let Some(first) = state.outcomes.get(step_id) {
                // Recorded before: nothing to fold again.
                return Ok(first.clone());
            }
            if let Some(lease) = state.leases.get(step_id)
                && lease.is_live(now)
            {
                self.refuse_completion(actor, &resource, lease.expires_at, now)
                    .await?;
                return Err(EngineError::Conflict {
                    kind: crate::error::ConflictKind::StepInProgress,
                    id: resource,
                });
            }
            self.finish_step(actor, &state.run, step, None, None, result)
                .await?
        };
        match completion {
            Completion::Recorded(outcome) => Ok(outcome),
            Completion::LeaseHeld { lease_expires_at } => {
                self.refuse_completion(actor, &resource, lease_expires_at, now)
                    .await?;
                Err(EngineError::Conflict {
                    kind: crate::error::ConflictKind::StepInProgress,
                    id: resource,
                })
            }
            Completion::NotBegun => Err(EngineError::internal("a completion without a gate")),
        }
    }

    /// Record the outcome of a step the gate let proceed: like
    /// [`Engine::complete_step`], but a step with no valid ticket (never
    /// begun, begun by another process, or begun longer ago than the run
    /// TTL) is [`Completion::NotBegun`] unless its outcome is recorded
    /// already (then that outcome is returned). [`Engine::complete_begun_step_as`]
    /// with no lease id: the ticket's holder.
    pub async fn complete_begun_step(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
        result: StepResult,
    ) -> Result<Completion, EngineError> {
        self.complete_begun_step_as(actor, run_id, step_id, None, result)
            .await
    }

    /// [`Engine::complete_begun_step`] by the holder `lease_id`: only the
    /// holder of the step's lease records its outcome. With this process's
    /// ticket (the `begin` was here) the ticket's holder is the one (a
    /// `lease_id` that is not it finds no ticket); without one (the `begin`
    /// was on another server sharing the database), `lease_id` must be the
    /// stored lease's holder. Another holder's live lease is
    /// [`Completion::LeaseHeld`] and records nothing (the refusal is
    /// recorded).
    pub async fn complete_begun_step_as(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
        lease_id: Option<&str>,
        result: StepResult,
    ) -> Result<Completion, EngineError> {
        let now = self.now();
        let resource = format!("{run_id}:{step_id}");
        let completion = if let Some(t) =
            self.inner
                .tickets
                .take(actor, run_id, step_id, lease_id, now, self.run_ttl_ms())?
        {
            self.finish_ticket(actor, t, result).await?
        } else {
            let state = self.run_of(actor, run_id).await?;
            let Some(step) = state.run.steps.iter().find(|s| &s.step_id == step_id) else {
                return Err(EngineError::not_found(Missing::Step, resource));
            };
            if let Some(outcome) = state.outcomes.get(step_id) {
                return Ok(Completion::Recorded(outcome.clone()));
            }
            match (state.leases.get(step_id), lease_id) {
                // Begun on another server by this holder: its completion.
                (Some(lease), Some(l)) if lease.holder == l => {
                    self.finish_step(actor, &state.run, step, None, Some(l.to_owned()), result)
                        .await?
                }
                (Some(lease), _) if lease.is_live(now) => Completion::LeaseHeld {
                    lease_expires_at: lease.expires_at,
                },
                _ => Completion::NotBegun,
            }
        };
        if let Completion::LeaseHeld { lease_expires_at } = &completion {
            self.refuse_completion(actor, &resource, *lease_expires_at, now)
                .await?;
        }
        Ok(completion)
    }

    /// Record the refusal of a completion by someone other than the holder
    /// of the step's live lease.
    async fn refuse_completion(
        &self,
        actor: &AgentId,
        resource: &str,
        lease_expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), EngineError> {
        let d = self.decision(
            &Subject::Agent(actor.clone()),
            Verdict::Deny,
            er::STEP_LEASE_HELD,
            ops::STEP_COMPLETE,
            resource.to_owned(),
            now,
        );
        self.inner
            .store
            .append_audit(vec![
                self.draft(&d)
                    .with_details(json!({"lease_expires_at": lease_expires_at})),
            ])
            .await?;
        Ok(())
    }

    /// Fold and record the outcome of the step `ticket` holds (its gate's
    /// decision, as its lease's holder).
    async fn finish_ticket(
        &self,
        actor: &AgentId,
        ticket: Ticket,
        result: StepResult,
    ) -> Result<Completion, EngineError> {
        self.finish_step(
            actor,
            &ticket.run,
            &ticket.step,
            ticket.gated.as_deref(),
            Some(ticket.holder),
            result,
        )
        .await
    }

    /// Fold and record a step's outcome (`gated`: what its gate decided).
    async fn finish_step(
        &self,
        actor: &AgentId,
        run: &RunRecord,
        step: &RunStep,
        gated: Option<&Gated>,
        holder: Option<String>,
        result: StepResult,
    ) -> Result<Completion, EngineError> {
        let now = self.now();
        let caller = Subject::Agent(actor.clone());
        let limit = self
            .policy()
            .catalogue
            .by_name(step.action.as_str())
            .map_or(u64::MAX, |a| a.limits().max_output_bytes);
        let size = result.result.as_ref().map_or(0, |v| {
            serde_json::to_string(v).map_or(0, |s| s.len() as u64)
        });
        let (mut status, mut error, mut value) = match (result.error, size > limit) {
            (Some(e), _) => (StepStatus::Failed, Some(e), None),
            (None, true) => (
                StepStatus::Failed,
                Some(format!(
                    "output of {size} bytes exceeds the limit of {limit}"
                )),
                None,
            ),
            (None, false) => (StepStatus::Completed, None, result.result),
        };
        let mut labels = result.result_labels;
        let mut reason = None;
        let mut context = Value::Null;
        match self
            .fold_step(actor, run, step, &labels, gated, now)
            .await?
        {
            None => {}
            Some(Folded::Unknown(unknown)) => {
                let first = unknown.first().map_or("", |l| l.as_str());
                let r = Reason::with_param(context_reasons::UNKNOWN_LABEL.as_str(), first);
                status = StepStatus::Failed;
                error = Some(r.to_string());
                value = None;
                context = json!({"unknown_labels": unknown});
                reason = Some(r);
            }
            Some(Folded::Done {
                after,
                transition,
                labels: all,
                bypassed,
            }) => {
                labels = all;
                if bypassed {
                    status = StepStatus::Denied;
                    error = Some(er::COMPLETED_WITHOUT_GATE.to_string());
                    value = None;
                    reason = Some(er::COMPLETED_WITHOUT_GATE);
                }
                context = json!({
                    "envelope_id": after.envelope_id(),
                    "envelope_version": after.version(),
                    "classification": after.aggregate_sensitivity(),
                    "result_sensitivity": transition.result_sensitivity(),
                });
            }
        }
        let outcome = StepOutcome {
            status,
            result: value,
            error,
            labels,
            recorded_at: now,
        };
        let (verdict, reason) = match (status, reason) {
            (_, Some(r)) => (Verdict::Deny, r),
            (StepStatus::Completed, None) => (Verdict::Allow, er::STEP_RECORDED),
            _ => (Verdict::Deny, er::STEP_FAILED),
        };
        let d = self.decision(
            &caller,
            verdict,
            reason,
            ops::STEP_COMPLETE,
            format!("{}:{}", run.run_id, step.step_id),
            now,
        );
        let draft = self
            .draft(&d)
            .with_details(json!({"operation_id": step.operation_id, "status": status}))
            .with_details(context);
        match self
            .inner
            .store
            .record_step_as(
                run.run_id.clone(),
                step.step_id.clone(),
                outcome.clone(),
                holder,
                vec![draft],
            )
            .await?
        {
            RecordStep::Recorded => {
                // A begin that escalated while this one ran the step was
                // decided against the same envelope, so as this one was:
                // escalated (this one then proceeded on the approval). A
                // step whose gate is not known here (completed on another
                // server, or without a begin) is looked at too. Not looked
                // at: an operator declassifying the run's envelope between
                // two concurrent begins, the first escalated and the second
                // allowed; the escalated one still looks after its insert.
                if gated.is_none_or(|g| g.gate.verdict == Verdict::Escalate) {
                    self.withdraw_step_slot(&caller, run, &step.step_id, now)
                        .await?;
                }
                Ok(Completion::Recorded(outcome))
            }
            RecordStep::AlreadyRecorded(first) => Ok(Completion::Recorded(first)),
            RecordStep::LeaseHeld(lease) => Ok(Completion::LeaseHeld {
                lease_expires_at: lease.expires_at,
            }),
        }
    }

    /// Execute a memory step's effect for `actor`, recording `pre` (the
    /// gate's entry) with it. Denials come back as a `StepResult` with an
    /// error, not as `Err`.
    pub(crate) async fn execute_memory_call(
        &self,
        actor: &AgentId,
        call: MemoryCall,
        pre: Vec<AuditDraft>,
    ) -> Result<StepResult, EngineError> {
        match call {
            MemoryCall::Read { namespace, key } => {
                let out = self.read_recorded(actor, &namespace, &key, pre).await?;
                Ok(match (out.status, out.value) {
                    (ReadStatus::Found, Some(v)) => StepResult {
                        result: serde_json::to_value(v).ok(),
                        ..StepResult::default()
                    },
                    _ => StepResult {
                        error: Some(out.decision.reason.to_string()),
                        ..StepResult::default()
                    },
                })
            }
            MemoryCall::Write(req) => {
                let out = self.write_recorded(actor, req, pre).await?;
                Ok(match out.record {
                    Some(r) => StepResult {
                        result: Some(json!({"owner_agent_id": r.owner, "revision": r.revision})),
                        ..StepResult::default()
                    },
                    None => StepResult {
                        error: Some(out.decision.reason.to_string()),
                        ..StepResult::default()
                    },
                })
            }
        }
    }
}
