//! SOP validation, runs and steps.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use warden_core::decision::SmolStr;
use warden_core::ids::{ActionName, Label, RunId, StepId};
use warden_core::plan::{
    ConstraintBy, Fill, PlanExplanation, PositionExplanation, StepExplanation,
};
use warden_core::preflight::{Preflight, StepCheck};
use warden_core::provenance::{MatchMode, Origin, Otherwise, Within};
use warden_store::{StepOutcome, StepStatus};

use super::DecisionBody;

/// `POST /v1/sops/validate`: preflight an SOP or a plan.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateSopRequest {
    /// The SOP: `{sop_id, version, steps: [{step_id, action, arguments}]}`,
    /// parsed strictly. Or a plan: the same format, any argument value may
    /// be a binding `{"$bind": {step?, from?, otherwise?, match?}}`,
    /// admitted as a session admits its plan.
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
    /// The lease id `begin` answered (or the one it was given): only the
    /// holder of the step's lease records its outcome. Optional on the
    /// server that answered the `begin` (its ticket names the holder);
    /// needed on another server sharing the database.
    #[serde(default)]
    pub lease_id: Option<String>,
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
    pub step_id: SmolStr,
    /// Action as written.
    pub action: SmolStr,
    /// The decision (its reason is the first violation).
    pub decision: DecisionBody,
    /// Every violation, in check order.
    pub violations: Vec<String>,
}

impl StepDecisionBody {
    /// The body of `s`, one of `p`'s steps.
    pub fn new(p: &Preflight, s: &StepCheck) -> Self {
        Self {
            step_id: s.step_id.clone(),
            action: s.action.clone(),
            decision: (&p.decision(s)).into(),
            violations: s.violations.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Every step's decision.
pub fn step_decisions(p: &Preflight) -> Vec<StepDecisionBody> {
    p.steps
        .iter()
        .map(|s| StepDecisionBody::new(p, s))
        .collect()
}

/// The answer of `POST /v1/sops/validate`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ValidateResponse {
    /// Whether every step is allowed.
    pub admitted: bool,
    /// One decision per step, in order.
    pub decisions: Vec<StepDecisionBody>,
    /// Whether the document binds any argument (a plan rather than an SOP).
    pub plan: bool,
    /// One provenance explanation per step, in order: how each argument
    /// the action's provenance rules guard will be vouched for.
    pub provenance: Vec<StepProvenanceBody>,
}

/// What provenance one step's guarded arguments will meet.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StepProvenanceBody {
    /// Step id as written.
    pub step_id: SmolStr,
    /// Action as written.
    pub action: SmolStr,
    /// Whether the catalogue has the action.
    pub known_action: bool,
    /// Whether the action is an outbound read.
    pub outbound_read: bool,
    /// The origins the action's results can get (by its `output:` trust).
    pub result_origins: Vec<Origin>,
    /// Per provenance rule of the action, in bundle order.
    pub rules: Vec<RuleProvenanceBody>,
    /// Bound arguments no provenance rule guards.
    pub unguarded: Vec<PositionBody>,
    /// The reasons worth attention (`binding_needs_review:<path>`,
    /// `binding_denied:<path>`, `binding_unguarded:<path>`,
    /// `rule_path_mismatch:<path>`), in order.
    pub findings: Vec<String>,
}

/// One provenance rule and how the step meets it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RuleProvenanceBody {
    /// The rule's argument path (`recipients[*]`).
    pub argument: String,
    /// The origins it accepts.
    pub from: Vec<Origin>,
    /// What an unvouched value gets.
    pub otherwise: Otherwise,
    /// How values are compared.
    #[serde(rename = "match")]
    pub matching: MatchMode,
    /// The embedded targets it checks instead of the whole value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within: Option<Within>,
    /// What the rule does, in one line.
    pub rule: String,
    /// Every position the rule reaches in the step.
    pub positions: Vec<PositionBody>,
}

/// What fills a position of a step's arguments.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FillBody {
    /// A literal of the plan (origin `plan`).
    Literal,
    /// A binding, filled at call time.
    Binding,
    /// Nothing: the step puts no value at the rule's path.
    Absent,
    /// The plan's structure does not fit the rule's path.
    Mismatch,
}

/// One guarded (or bound) position and what the gate will make of it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PositionBody {
    /// The argument path (`recipient`, `cc[1]`).
    pub path: String,
    /// What fills it.
    pub fill: FillBody,
    /// `literal_vouched`, `argument_absent`, `rule_path_mismatch`,
    /// `binding_checked`, `binding_needs_review`, `binding_denied` or
    /// `binding_unguarded`, with the path: `binding_needs_review:recipient`.
    pub reason: String,
    /// The binding, for a bound position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingBody>,
    /// One line saying it.
    pub explain: String,
}

/// A binding and what the step it names can vouch for.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BindingBody {
    /// The earlier step whose result must hold the value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepId>,
    /// That step's action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_action: Option<ActionName>,
    /// The origins that step's results can get.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_origins: Option<Vec<Origin>>,
    /// The binding's own `from`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<Origin>>,
    /// The binding's own `otherwise`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otherwise: Option<Otherwise>,
    /// The binding's `match`.
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matching: Option<MatchMode>,
    /// The constraints (the rule's, the binding's own `from`) the named
    /// step's results cannot meet: the value must also occur in a source
    /// of an origin each accepts, or the call gets its `otherwise`.
    pub unmet: Vec<UnmetBody>,
}

/// A constraint the named step's results cannot meet.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct UnmetBody {
    /// `rule` or `binding`.
    pub by: String,
    /// The origins it accepts.
    pub from: Vec<Origin>,
    /// What the call gets when no such source holds the value.
    pub otherwise: Otherwise,
}

fn position_body(p: &PositionExplanation) -> PositionBody {
    PositionBody {
        path: p.path.clone(),
        fill: match p.fill {
            Fill::Literal => FillBody::Literal,
            Fill::Binding => FillBody::Binding,
            Fill::Absent => FillBody::Absent,
            Fill::Mismatch => FillBody::Mismatch,
        },
        reason: p.reason.to_string(),
        binding: p.binding.as_ref().map(|b| BindingBody {
            step: b.step.clone(),
            step_action: b.step_action.clone(),
            step_origins: b.step_origins.clone(),
            from: b.from.clone(),
            otherwise: b.otherwise,
            matching: b.matching,
            unmet: b
                .unmet
                .iter()
                .map(|u| UnmetBody {
                    by: match u.by {
                        ConstraintBy::Rule => "rule",
                        ConstraintBy::Binding => "binding",
                    }
                    .to_owned(),
                    from: u.from.clone(),
                    otherwise: u.otherwise,
                })
                .collect(),
        }),
        explain: p.explain.clone(),
    }
}

impl From<&StepExplanation> for StepProvenanceBody {
    fn from(s: &StepExplanation) -> Self {
        Self {
            step_id: s.step_id.as_str().into(),
            action: s.action.as_str().into(),
            known_action: s.known_action,
            outbound_read: s.outbound_read,
            result_origins: s.result_origins.clone(),
            rules: s
                .rules
                .iter()
                .map(|r| RuleProvenanceBody {
                    argument: r.argument.clone(),
                    from: r.from.clone(),
                    otherwise: r.otherwise,
                    matching: r.matching,
                    within: r.within,
                    rule: r.rule.clone(),
                    positions: r.positions.iter().map(position_body).collect(),
                })
                .collect(),
            unguarded: s.unguarded.iter().map(position_body).collect(),
            findings: s.findings.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Every step's provenance explanation.
pub fn step_provenance(p: &PlanExplanation) -> Vec<StepProvenanceBody> {
    p.steps.iter().map(Into::into).collect()
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
    /// For `proceed`: the lease this caller now holds on the step; present
    /// it to `complete` (and to `begin` again after a crash).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// For `proceed`: when the lease lapses (ms since the epoch); until
    /// then every other `begin` is a 409 `step_in_progress`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<i64>,
}

/// Query of `POST /v1/runs/{run}/steps/{step}/begin`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginStepQuery {
    /// The lease id to hold the step as (an identifier the caller chose):
    /// the same id begins its own step again; absent, the server makes one.
    #[serde(default)]
    pub lease_id: Option<String>,
}
