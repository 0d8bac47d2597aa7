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
//! Tickets live in this engine's memory (a server's process); a ticket older
//! than the run TTL ([`Engine::set_run_ttl`]) is dropped.

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
use warden_store::{RecordStep, RunRecord, RunState, RunStep, StepOutcome, StepStatus, Store};

use crate::context::{ContextGate, Folded};
use crate::engine::{Engine, engine_reasons as er, ops};
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

    /// The per-step gate (see the module docs).
    pub async fn begin_step(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
    ) -> Result<StepGate, EngineError> {
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
            let d = self.decision(
                &caller,
                Verdict::Allow,
                er::STEP_REPLAYED,
                ops::STEP_BEGIN,
                resource,
                now,
            );
            self.record(&d).await?;
            return Ok(StepGate::Replay {
                decision: d,
                outcome: outcome.clone(),
            });
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
        // The step's arguments, read once: decided by the gate, then handed
        // to the caller.
        let arguments = Value::Object(step_arguments(&state.run, step_id));
        let (decision, draft, gated) = match self
            .gate_step(actor, &state.run, &step, &arguments, now)
            .await?
        {
            ContextGate::Denied(decision) => {
                return Ok(StepGate::Refused {
                    decision,
                    refusal: StepRefusal::Denied,
                });
            }
            ContextGate::Escalated {
                decision,
                escalation_id,
            } => {
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
        let ticket = Ticket {
            actor: actor.clone(),
            gated,
            run: Arc::new(state.run),
            step,
            issued_at: now,
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
            let outcome = self
                .finish_step(
                    actor,
                    &ticket.run,
                    &ticket.step,
                    ticket.gated.as_deref(),
                    result,
                )
                .await?;
            return Ok(StepGate::Executed {
                decision,
                operation_id,
                action,
                arguments,
                outcome,
            });
        }
        if let Some(draft) = draft {
            self.inner.store.append_audit(vec![draft]).await?;
        }
        self.inner.tickets.insert(ticket, now, self.run_ttl_ms())?;
        Ok(StepGate::Proceed {
            decision,
            operation_id,
            action,
            arguments,
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
        if let Some(t) = self
            .inner
            .tickets
            .take(actor, run_id, step_id, now, self.run_ttl_ms())?
        {
            return self
                .finish_step(actor, &t.run, &t.step, t.gated.as_deref(), result)
                .await;
        }
        let state = self.run_of(actor, run_id).await?;
        let Some(step) = state.run.steps.iter().find(|s| &s.step_id == step_id) else {
            return Err(EngineError::not_found(
                Missing::Step,
                format!("{run_id}:{step_id}"),
            ));
        };
        if let Some(first) = state.outcomes.get(step_id) {
            // Recorded before: nothing to fold again.
            return Ok(first.clone());
        }
        self.finish_step(actor, &state.run, step, None, result)
            .await
    }

    /// Record the outcome of a step the gate let proceed: like
    /// [`Engine::complete_step`], but a step with no valid ticket (never
    /// begun, begun by another process, or begun longer ago than the run
    /// TTL) is [`Completion::NotBegun`] unless its outcome is recorded
    /// already (then that outcome is returned).
    pub async fn complete_begun_step(
        &self,
        actor: &AgentId,
        run_id: &RunId,
        step_id: &StepId,
        result: StepResult,
    ) -> Result<Completion, EngineError> {
        let now = self.now();
        if let Some(t) = self
            .inner
            .tickets
            .take(actor, run_id, step_id, now, self.run_ttl_ms())?
        {
            return self
                .finish_step(actor, &t.run, &t.step, t.gated.as_deref(), result)
                .await
                .map(Completion::Recorded);
        }
        let state = self.run_of(actor, run_id).await?;
        if !state.run.steps.iter().any(|s| &s.step_id == step_id) {
            return Err(EngineError::not_found(
                Missing::Step,
                format!("{run_id}:{step_id}"),
            ));
        }
        Ok(match state.outcomes.get(step_id) {
            Some(outcome) => Completion::Recorded(outcome.clone()),
            None => Completion::NotBegun,
        })
    }

    /// Fold and record a step's outcome (`gated`: what its gate decided).
    async fn finish_step(
        &self,
        actor: &AgentId,
        run: &RunRecord,
        step: &RunStep,
        gated: Option<&Gated>,
        result: StepResult,
    ) -> Result<StepOutcome, EngineError> {
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
            .record_step(
                run.run_id.clone(),
                step.step_id.clone(),
                outcome.clone(),
                vec![draft],
            )
            .await?
        {
            RecordStep::Recorded => Ok(outcome),
            RecordStep::AlreadyRecorded(first) => Ok(first),
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
