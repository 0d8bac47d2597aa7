//! In-process execution of admitted runs through registered handlers (the
//! embedded engine's way to run an SOP; a server's caller executes tool
//! steps itself between `begin` and `complete`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use warden_core::decision::{Decision, Subject, Verdict};
use warden_core::ids::{ActionName, AgentId, RunId, StepId};
use warden_core::preflight::{MEMORY_READ, MEMORY_WRITE, Preflight};
use warden_core::sop::Sop;
use warden_store::{StepOutcome, StepStatus, Store};

use crate::admission::Admission;
use crate::engine::{Engine, engine_reasons as er, ops};
use crate::error::EngineError;
use crate::steps::{StepGate, StepResult};

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
    /// Why an SOP the preflight admitted was not admitted as a run (a
    /// quota), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Decision>,
}

impl<S: Store> Engine<S> {
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
                    refusal: None,
                });
            }
            Admission::OverQuota {
                decision,
                preflight,
                ..
            } => {
                return Ok(RunReport {
                    run_id: None,
                    admitted: false,
                    preflight,
                    steps: Vec::new(),
                    completed: false,
                    refusal: Some(decision),
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
                StepGate::Executed {
                    decision, outcome, ..
                } => (decision, Some(outcome), true),
                StepGate::Refused { decision, .. }
                | StepGate::Escalated { decision, .. }
                | StepGate::InProgress { decision, .. } => {
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
                    ..
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
            refusal: None,
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
}
