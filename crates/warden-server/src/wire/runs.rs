//! SOP validation, runs and steps.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use warden_core::ids::{ActionName, Label, RunId, StepId};
use warden_core::preflight::{Preflight, StepCheck};
use warden_store::{StepOutcome, StepStatus};

use super::DecisionBody;

/// `POST /v1/sops/validate`: preflight an SOP.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateSopRequest {
    /// The SOP: `{sop_id, version, steps: [{step_id, action, arguments}]}`,
    /// parsed strictly.
    pub sop: Value,
}

/// `POST /v1/runs`: admit an SOP as a run.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmitRunRequest {
    /// The SOP.
    pub sop: Value,
    /// Idempotency key: the same id with the same SOP returns the same run.
    #[serde(default)]
    pub run_id: Option<RunId>,
}

/// `POST /v1/runs/{run}/steps/{step}/complete`: a step's outcome.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteStepRequest {
    /// The result value.
    #[serde(default)]
    pub result: Option<Value>,
    /// Labels the result carries.
    #[serde(default)]
    pub result_labels: Vec<Label>,
    /// An error message: the step failed and the run stops.
    #[serde(default)]
    pub error: Option<String>,
}

/// One step's preflight decision.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StepDecisionBody {
    /// Step id as written.
    pub step_id: String,
    /// Action as written.
    pub action: String,
    /// The decision (its reason is the first violation).
    pub decision: DecisionBody,
    /// Every violation, in check order.
    pub violations: Vec<String>,
}

impl From<&StepCheck> for StepDecisionBody {
    fn from(s: &StepCheck) -> Self {
        Self {
            step_id: s.step_id.clone(),
            action: s.action.clone(),
            decision: (&s.decision).into(),
            violations: s.violations.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Every step's decision.
pub fn step_decisions(p: &Preflight) -> Vec<StepDecisionBody> {
    p.steps.iter().map(Into::into).collect()
}

/// The answer of `POST /v1/sops/validate`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ValidateResponse {
    /// Whether every step is allowed.
    pub admitted: bool,
    /// One decision per step, in order.
    pub decisions: Vec<StepDecisionBody>,
}

/// One step of an admitted run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunStepBody {
    /// Step id.
    pub step_id: StepId,
    /// Its action.
    pub action: ActionName,
    /// Stable operation id (idempotency key of the effect).
    pub operation_id: String,
}

/// An admitted run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunAdmittedResponse {
    /// Run id.
    pub run_id: RunId,
    /// Whether the run existed already (same id, same SOP).
    pub existing: bool,
    /// Steps in order.
    pub steps: Vec<RunStepBody>,
    /// Every step's preflight decision.
    pub decisions: Vec<StepDecisionBody>,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StepStatusBody {
    /// Completed.
    Completed,
    /// Failed; the run stops.
    Failed,
    /// Denied mid-run; the run stops.
    Denied,
}

/// A recorded step outcome.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OutcomeBody {
    /// How it ended.
    pub status: StepStatusBody,
    /// The result.
    pub result: Option<Value>,
    /// The error.
    pub error: Option<String>,
    /// Labels of the result.
    pub labels: Vec<Label>,
    /// When it was recorded (ms since the epoch).
    pub recorded_at: i64,
}

impl From<&StepOutcome> for OutcomeBody {
    fn from(o: &StepOutcome) -> Self {
        Self {
            status: match o.status {
                StepStatus::Completed => StepStatusBody::Completed,
                StepStatus::Failed => StepStatusBody::Failed,
                StepStatus::Denied => StepStatusBody::Denied,
            },
            result: o.result.clone(),
            error: o.error.clone(),
            labels: o.labels.clone(),
            recorded_at: o.recorded_at.0,
        }
    }
}

/// What the gate said.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GateBody {
    /// Run the tool now, then report with `complete`.
    Proceed,
    /// Already done: here is the recorded outcome; do not run it again.
    Replay,
    /// A memory step: the server ran it; here is the outcome.
    Executed,
}

/// The answer of `POST /v1/runs/{run}/steps/{step}/begin` when the step may
/// (or did) run. A refused step is a 403 `step_denied` instead.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct GateResponse {
    /// What to do.
    pub gate: GateBody,
    /// The decision.
    pub decision: DecisionBody,
    /// The operation id (idempotency key for the effect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// The action to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionName>,
    /// Its arguments, as admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Map<String, Value>>,
    /// The outcome, for `replay` and `executed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeBody>,
}
