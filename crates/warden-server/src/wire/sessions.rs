//! Tool-call sessions: open, gate a call, record its result, cancel.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden::{CallAnswer, SessionView};
use warden_core::envelope::Sensitivity;
use warden_core::ids::{ActionName, AgentId, CallId, Label, SessionId, StepId};
use warden_store::{CallRecord, CallStatus, SessionStatus};

use super::{DecisionBody, VerdictBody};

/// `POST /v1/sessions`: open a session.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenSessionRequest {
    /// Idempotency key: the same id with the same content returns the same
    /// session.
    #[serde(default)]
    pub session_id: Option<SessionId>,
    /// The agent whose calls it decides (default: the caller); an ancestor
    /// or the operator opens one for a descendant.
    #[serde(default)]
    pub agent_id: Option<AgentId>,
    /// The user's request and values the runtime vouches for (origin
    /// `user`); never model output.
    #[serde(default)]
    pub trusted_inputs: Vec<Value>,
    /// A plan: an SOP whose arguments may hold bindings
    /// `{"$bind": {"step"?, "from"?, "otherwise"?, "match"?}}`.
    #[serde(default)]
    pub plan: Option<Value>,
    /// A signed envelope from an issuer the bundle trusts, as
    /// `GET /v1/runs/{run}/envelope/signed` answers it:
    /// `{envelope, issuer, signature}`.
    #[serde(default)]
    pub from_envelope: Option<Value>,
}

/// `POST /v1/sessions/{id}/calls`: decide one tool call before it runs.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCallRequest {
    /// Idempotency key. When absent, a call whose action and arguments
    /// equal those of this session's approved held call (an escalation
    /// approved and not yet used) takes up that call, once; otherwise an
    /// id is generated.
    #[serde(default)]
    pub call_id: Option<CallId>,
    /// The action (tool) name.
    pub action: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

/// `POST /v1/sessions/{id}/calls/{call}/result`: what the tool returned.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallResultRequest {
    /// The result (structured results keep per-field trust).
    #[serde(default)]
    pub result: Value,
    /// The tool's error, if it failed.
    #[serde(default)]
    pub error: Option<String>,
    /// Labels the result carries.
    #[serde(default)]
    pub labels: Vec<Label>,
}

/// `POST /v1/sessions/{id}/cancel`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelSessionRequest {
    /// Why (shown to reviewers; checked free text).
    pub reason: String,
}

/// Where a call is.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallStatusBody {
    /// Allowed; result not recorded yet.
    Allowed,
    /// Refused.
    Denied,
    /// Waiting for review.
    Escalated,
    /// Result recorded.
    Completed,
    /// The tool reported an error.
    Failed,
}

impl From<CallStatus> for CallStatusBody {
    fn from(s: CallStatus) -> Self {
        match s {
            CallStatus::Allowed => Self::Allowed,
            CallStatus::Denied => Self::Denied,
            CallStatus::Escalated => Self::Escalated,
            CallStatus::Completed => Self::Completed,
            CallStatus::Failed => Self::Failed,
        }
    }
}

/// One call as decided.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CallBody {
    /// The call id.
    pub call_id: CallId,
    /// Position in the session.
    pub seq: u64,
    /// The action.
    pub action: ActionName,
    /// The verdict.
    pub verdict: VerdictBody,
    /// The reason (the first of the winning verdict).
    pub reason: String,
    /// Every reason found, in check order.
    pub reasons: Vec<String>,
    /// Where the call is.
    pub status: CallStatusBody,
    /// The planned step it used.
    pub plan_step: Option<StepId>,
    /// The escalation holding it.
    pub escalation_id: Option<String>,
    /// Obligations of a `constrain` verdict.
    pub obligations: Vec<Value>,
    /// Per value a provenance rule guards: `{path, rule, from, origins,
    /// sources: [{origin, source, field}], vouched, confusable_with, ...}`.
    pub provenance: Vec<Value>,
    /// The envelope the call was decided against.
    pub context: Option<Value>,
    /// Labels folded from the result.
    pub result_labels: Vec<Label>,
    /// When it was decided (ms since the epoch).
    pub decided_at: i64,
    /// When its result was recorded.
    pub completed_at: Option<i64>,
}

fn list(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

impl From<&CallRecord> for CallBody {
    fn from(c: &CallRecord) -> Self {
        Self {
            call_id: c.call_id.clone(),
            seq: c.seq,
            action: c.action.clone(),
            verdict: c.verdict.into(),
            reason: c.reason.to_string(),
            reasons: list(&c.detail, "reasons")
                .into_iter()
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect(),
            status: c.status.into(),
            plan_step: c.plan_step.clone(),
            escalation_id: c.escalation_id.clone(),
            obligations: list(&c.detail, "obligations"),
            provenance: list(&c.detail, "provenance"),
            context: c.detail.get("context").filter(|v| !v.is_null()).cloned(),
            result_labels: c.result_labels.clone(),
            decided_at: c.decided_at.0,
            completed_at: c.completed_at.map(|t| t.0),
        }
    }
}

/// The answer to a call or a result.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CallResponse {
    /// The call.
    #[serde(flatten)]
    pub call: CallBody,
    /// Whether this answer came from the call's record.
    pub replayed: bool,
    /// The decision recorded for this request.
    pub decision: DecisionBody,
    /// For a call the engine executed itself (`memory.read`,
    /// `memory.write`): the resolved value, or the written record's owner
    /// and revision. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

impl From<&CallAnswer> for CallResponse {
    fn from(a: &CallAnswer) -> Self {
        Self {
            call: (&a.call).into(),
            replayed: a.replayed,
            decision: (&a.decision).into(),
            result: a.result.clone(),
        }
    }
}

/// A session's envelope, as a summary.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionEnvelopeBody {
    /// Its id.
    pub envelope_id: String,
    /// Its version.
    pub version: u64,
    /// Its aggregate sensitivity.
    pub sensitivity: Sensitivity,
    /// Labels folded in.
    pub labels: Vec<Label>,
    /// Restrictions.
    pub restrictions: Vec<Label>,
}

/// One planned step.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PlanStepBody {
    /// The step id.
    pub step_id: Option<String>,
    /// The action.
    pub action: Option<String>,
    /// The call that used it.
    pub used_by: Option<CallId>,
}

/// A session's plan.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionPlanBody {
    /// Hash of its canonical JSON.
    pub hash: String,
    /// The steps.
    pub steps: Vec<PlanStepBody>,
}

/// What the session's index holds (sizes only).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct IndexBody {
    /// Bytes of recorded text.
    pub recorded_bytes: u64,
    /// Sources recorded.
    pub sources: usize,
    /// Fields recorded.
    pub fields: usize,
    /// Whether some content was past the bounds (it vouches for nothing).
    pub unsearchable: bool,
}

/// A session.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionBody {
    /// The id.
    pub session_id: SessionId,
    /// The agent whose calls it decides.
    pub agent_id: AgentId,
    /// `open` or `cancelled`.
    pub status: String,
    /// Who opened it.
    pub opened_by: String,
    /// When (ms since the epoch).
    pub created_at: i64,
    /// Who cancelled it, when and why.
    pub closure: Option<Value>,
    /// Its envelope.
    pub envelope: Option<SessionEnvelopeBody>,
    /// Its plan.
    pub plan: Option<SessionPlanBody>,
    /// The envelope it was opened from: `{issuer, envelope_id, version}`.
    pub imported: Option<Value>,
    /// Its index.
    pub index: IndexBody,
    /// Its calls, in order.
    pub calls: Vec<CallBody>,
    /// Whether an open request found it existing.
    pub existing: bool,
}

impl SessionBody {
    /// The body of a view.
    pub fn of(v: &SessionView, existing: bool) -> Self {
        let s = &v.state.session;
        Self {
            session_id: s.session_id.clone(),
            agent_id: s.agent.clone(),
            status: match s.status {
                SessionStatus::Open => "open",
                SessionStatus::Cancelled => "cancelled",
            }
            .to_owned(),
            opened_by: s.opened_by.to_string(),
            created_at: s.created_at.0,
            closure: s.closure.as_ref().map(|c| {
                serde_json::json!({"by": c.by.to_string(), "at": c.at.0, "reason": c.reason})
            }),
            envelope: v.envelope.as_ref().map(|e| SessionEnvelopeBody {
                envelope_id: e.envelope_id.to_string(),
                version: e.version,
                sensitivity: e.aggregate_sensitivity,
                labels: e.labels.iter().cloned().collect(),
                restrictions: e.restrictions.iter().cloned().collect(),
            }),
            plan: s.plan.as_ref().map(|p| SessionPlanBody {
                hash: p.hash.to_hex(),
                steps: p
                    .plan
                    .get("steps")
                    .and_then(Value::as_array)
                    .map(|steps| {
                        steps
                            .iter()
                            .enumerate()
                            .map(|(i, st)| PlanStepBody {
                                step_id: st.get("step_id").and_then(Value::as_str).map(str::to_owned),
                                action: st.get("action").and_then(Value::as_str).map(str::to_owned),
                                used_by: p.used_by.get(i).cloned().flatten(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            imported: s.imported.as_ref().map(|i| {
                serde_json::json!({"issuer": i.issuer, "envelope_id": i.envelope_id, "version": i.version})
            }),
            index: IndexBody {
                recorded_bytes: v.index.recorded_bytes,
                sources: v.index.sources,
                fields: v.index.fields,
                unsearchable: v.index.unsearchable,
            },
            calls: v.state.calls.iter().map(Into::into).collect(),
            existing,
        }
    }
}
