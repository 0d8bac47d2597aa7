//! Runs: per-step gating, exactly-once outcomes and in-process execution
//! through registered handlers.
//!
//! A run is an admitted SOP. Each step passes through [`Engine::begin_step`]
//! (the per-step gate: the agent must still be active and hold the
//! capability, earlier steps must have completed) and
//! [`Engine::complete_step`] (the outcome is recorded exactly once). A step
//! whose outcome is recorded is never executed again: a retry or a re-run
//! after a crash gets the recorded result back.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use warden_core::decision::{Decision, Reason, Subject, Verdict};
use warden_core::envelope::reasons as context_reasons;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::preflight::{MEMORY_READ, MEMORY_WRITE, Preflight};
use warden_core::sop::Sop;
use warden_store::{RecordStep, RunRecord, RunState, StepOutcome, StepStatus, Store};

use crate::admission::Admission;
use crate::context::Folded;
use crate::engine::{Engine, capability_reason, engine_reasons as er, ops};
use crate::error::EngineError;
use crate::memory::WriteRequest;

/// Everything a handler gets for one call.
#[derive(Debug, Clone)]
pub struct HandlerCall {
    /// The stable operation id (idempotency key for the effect).
    pub operation_id: String,
    /// The action.
    pub action: ActionName,
    /// The step's arguments.
    pub arguments: Map<String, Value>,
    /// The acting agent.
    pub agent: AgentId,
}

/// A handler's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

/// The future a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, HandlerError>> + Send>>;

/// Executes one action.
pub trait Handler: Send + Sync {
    /// Perform the action. Dropping the future cancels it.
    fn call(&self, call: HandlerCall) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(HandlerCall) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
{
    fn call(&self, call: HandlerCall) -> HandlerFuture {
        Box::pin(self(call))
    }
}

/// Registered handlers by action name.
#[derive(Default, Clone)]
pub struct Handlers {
    map: HashMap<ActionName, Arc<dyn Handler>>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.map.keys()).finish()
    }
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register `handler` for `action`.
    pub fn register(&mut self, action: ActionName, handler: impl Handler + 'static) -> &mut Self {
        self.map.insert(action, Arc::new(handler));
        self
    }

    /// Whether `action` has a handler.
    pub fn contains(&self, action: &str) -> bool {
        self.map.contains_key(action)
    }

    fn get(&self, action: &str) -> Option<Arc<dyn Handler>> {
        self.map.get(action).cloned()
    }
}

/// What the gate says about a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "gate", rename_all = "snake_case")]
pub enum StepGate {
    /// Run it (allow or constrain); the decision carries any obligations.
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

/// What happened to one step during [`Engine::execute_sop`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    /// Step id.
    pub step_id: StepId,
    /// The gate's decision.
    pub decision: Decision,
    /// The recorded outcome (absent if the gate refused it).
    pub outcome: Option<StepOutcome>,
    /// Whether this call executed the handler (false for a replay).
    pub executed: bool,
}

/// The result of executing an SOP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The run id, if admitted.
    pub run_id: Option<RunId>,
    /// Whether the SOP was admitted.
    pub admitted: bool,
    /// Preflight decisions.
    pub preflight: Preflight,
    /// Per-step reports, in order, up to where the run stopped.
    pub steps: Vec<StepReport>,
    /// Whether every step completed.
    pub completed: bool,
}

impl<S: Store> Engine<S> {
    async fn run_of(&self, actor: &AgentId, run_id: &RunId) -> Result<RunState, EngineError> {
        match self.inner.store.get_run(run_id.clone()).await? {
            Some(state) if &state.run.agent == actor => Ok(state),
            _ => Err(EngineError::UnknownRun(run_id.to_string())),
        }
    }

    /// The per-step gate.
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
            return Err(EngineError::UnknownStep {
                run: run_id.to_string(),
                step: step_id.to_string(),
            });
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
        let step =
            state
                .run
                .steps
                .get(position)
                .cloned()
                .ok_or_else(|| EngineError::UnknownStep {
                    run: run_id.to_string(),
                    step: step_id.to_string(),
                })?;
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
        let reason = if stopped {
            Some(er::RUN_STOPPED)
        } else if earlier_open {
            Some(er::STEP_OUT_OF_ORDER)
        } else {
            let r = capability_reason(
                &self.read_state()?.hierarchy,
                self.policy(),
                actor,
                step.action.as_str(),
            );
            (r != warden_core::decision::reasons::CAPABILITY_GRANTED).then_some(r)
        };
        if let Some(reason) = reason {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                reason.clone(),
                ops::STEP_BEGIN,
                resource,
                now,
            );
            if reason == er::STEP_OUT_OF_ORDER || reason == er::RUN_STOPPED {
                self.record(&d).await?;
            } else {
                // A mid-run refusal (revocation, lost capability) stops the
                // run: record the step as denied together with the decision.
                let outcome = StepOutcome {
                    status: StepStatus::Denied,
                    result: None,
                    error: Some(reason.to_string()),
                    labels: Vec::new(),
                    recorded_at: now,
                };
                self.inner
                    .store
                    .record_step(
                        run_id.clone(),
                        step_id.clone(),
                        outcome,
                        vec![self.draft(&d)],
                    )
                    .await?;
            }
            return Ok(StepGate::Refused { decision: d });
        }
        if let Some(gate) = self.gate_step(actor, &state.run, &step, now).await? {
            return Ok(gate);
        }
        let arguments = step_arguments(&state.run, step_id);
        let d = self.decision(
            &caller,
            Verdict::Allow,
            warden_core::decision::reasons::STEP_ALLOWED,
            ops::STEP_BEGIN,
            resource,
            now,
        );
        self.record(&d).await?;
        Ok(StepGate::Proceed {
            decision: d,
            operation_id: step.operation_id,
            action: step.action,
            arguments,
        })
    }

    /// Record a step's outcome, exactly once. A second report returns the
    /// first outcome unchanged.
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
        let caller = Subject::Agent(actor.clone());
        let state = self.run_of(actor, run_id).await?;
        let Some(step) = state.run.steps.iter().find(|s| &s.step_id == step_id) else {
            return Err(EngineError::UnknownStep {
                run: run_id.to_string(),
                step: step_id.to_string(),
            });
        };
        if let Some(first) = state.outcomes.get(step_id) {
            // Recorded before: nothing to fold again.
            return Ok(first.clone());
        }
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
            .fold_step(actor, &state.run, step, &labels, now)
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
            format!("{run_id}:{step_id}"),
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
                run_id.clone(),
                step_id.clone(),
                outcome.clone(),
                vec![draft],
            )
            .await?
        {
            RecordStep::Recorded => Ok(outcome),
            RecordStep::AlreadyRecorded(first) => Ok(first),
        }
    }

    /// Admit and execute `sop` through `handlers`. Memory steps are executed
    /// by the engine itself; every other action needs a handler, and missing
    /// handlers are reported before any step runs. Re-executing with the same
    /// `run_id` replays recorded outcomes and runs only the steps that never
    /// completed.
    pub async fn execute_sop(
        &self,
        actor: &AgentId,
        sop: &Sop,
        handlers: &Handlers,
        run_id: Option<RunId>,
    ) -> Result<RunReport, EngineError> {
        let (run, preflight) = match self.admit_run(actor, sop, run_id).await? {
            Admission::Rejected(preflight) => {
                return Ok(RunReport {
                    run_id: None,
                    admitted: false,
                    preflight,
                    steps: Vec::new(),
                    completed: false,
                });
            }
            Admission::Admitted { run, preflight, .. } => (run, preflight),
        };
        let mut missing: Vec<String> = run
            .steps
            .iter()
            .map(|s| s.action.as_str())
            .filter(|a| *a != MEMORY_READ && *a != MEMORY_WRITE && !handlers.contains(a))
            .map(str::to_owned)
            .collect();
        missing.sort();
        missing.dedup();
        if !missing.is_empty() {
            let d = self.decision(
                &Subject::Agent(actor.clone()),
                Verdict::Deny,
                er::MISSING_HANDLERS,
                ops::RUN_ADMIT,
                run.run_id.to_string(),
                self.now(),
            );
            let draft = self.draft(&d).with_details(json!({"missing": missing}));
            self.inner.store.append_audit(vec![draft]).await?;
            return Err(EngineError::MissingHandlers(missing));
        }
        let mut reports = Vec::new();
        let mut completed = true;
        for step in &run.steps {
            let gate = self.begin_step(actor, &run.run_id, &step.step_id).await?;
            let (decision, outcome, executed) = match gate {
                StepGate::Replay { decision, outcome } => (decision, Some(outcome), false),
                StepGate::Refused { decision } | StepGate::Escalated { decision, .. } => {
                    reports.push(StepReport {
                        step_id: step.step_id.clone(),
                        decision,
                        outcome: None,
                        executed: false,
                    });
                    completed = false;
                    break;
                }
                StepGate::Proceed {
                    decision,
                    operation_id,
                    action,
                    arguments,
                } => {
                    let result = self
                        .execute_one(actor, &operation_id, &action, arguments, handlers)
                        .await?;
                    let outcome = self
                        .complete_step(actor, &run.run_id, &step.step_id, result)
                        .await?;
                    (decision, Some(outcome), true)
                }
            };
            let ok = outcome
                .as_ref()
                .is_some_and(|o| o.status == StepStatus::Completed);
            reports.push(StepReport {
                step_id: step.step_id.clone(),
                decision,
                outcome,
                executed,
            });
            if !ok {
                completed = false;
                break;
            }
        }
        Ok(RunReport {
            run_id: Some(run.run_id),
            admitted: true,
            preflight,
            steps: reports,
            completed,
        })
    }

    async fn execute_one(
        &self,
        actor: &AgentId,
        operation_id: &str,
        action: &ActionName,
        arguments: Map<String, Value>,
        handlers: &Handlers,
    ) -> Result<StepResult, EngineError> {
        let labels = self
            .policy()
            .catalogue
            .by_name(action.as_str())
            .map(|a| a.output_labels().to_vec())
            .unwrap_or_default();
        if action.as_str() == MEMORY_READ || action.as_str() == MEMORY_WRITE {
            return self
                .execute_memory(actor, action.as_str(), &arguments)
                .await;
        }
        let Some(handler) = handlers.get(action.as_str()) else {
            return Ok(StepResult {
                error: Some(format!("no handler for `{action}`")),
                ..StepResult::default()
            });
        };
        let timeout_ms = self
            .policy()
            .catalogue
            .by_name(action.as_str())
            .map_or(30_000, |a| a.limits().timeout_ms);
        let call = HandlerCall {
            operation_id: operation_id.to_owned(),
            action: action.clone(),
            arguments,
            agent: actor.clone(),
        };
        Ok(
            match tokio::time::timeout(Duration::from_millis(timeout_ms), handler.call(call)).await
            {
                Err(_) => StepResult {
                    error: Some(format!("timed out after {timeout_ms} ms")),
                    ..StepResult::default()
                },
                Ok(Err(e)) => StepResult {
                    error: Some(e.0),
                    ..StepResult::default()
                },
                Ok(Ok(v)) => StepResult {
                    result: Some(v),
                    result_labels: labels,
                    error: None,
                },
            },
        )
    }

    /// Execute a `memory.read` or `memory.write` step's effect for `actor`
    /// (the server owns memory, so it runs these steps itself between the
    /// gate and the outcome). The write is always in the actor's own scope.
    /// Denials come back as a `StepResult` with an error, not as `Err`.
    pub async fn execute_memory(
        &self,
        actor: &AgentId,
        action: &str,
        args: &Map<String, Value>,
    ) -> Result<StepResult, EngineError> {
        let field = |name: &str| {
            args.get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let invalid = |e: warden_core::ids::IdentifierError| StepResult {
            error: Some(e.to_string()),
            ..StepResult::default()
        };
        let namespace = match Namespace::parse(&field("namespace")) {
            Ok(n) => n,
            Err(e) => return Ok(invalid(e)),
        };
        let key = match Key::parse(&field("key")) {
            Ok(k) => k,
            Err(e) => return Ok(invalid(e)),
        };
        if action == MEMORY_READ {
            let out = self.read(actor, &namespace, &key).await?;
            return Ok(match out.value {
                Some(v) => StepResult {
                    result: serde_json::to_value(v).ok(),
                    ..StepResult::default()
                },
                None => StepResult {
                    error: Some(out.decision.reason.to_string()),
                    ..StepResult::default()
                },
            });
        }
        let req = WriteRequest {
            namespace,
            key,
            value: args.get("value").cloned().unwrap_or(Value::Null),
            owner_agent_id: None,
            expected_revision: args.get("expected_revision").and_then(Value::as_u64),
            visibility: args
                .get("visibility")
                .and_then(Value::as_str)
                .and_then(warden_core::memory::Visibility::parse),
            class: None,
        };
        let out = self.write(actor, req).await?;
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
