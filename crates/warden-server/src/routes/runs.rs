//! SOPs and runs: preflight, admission, the per-step gate and outcomes.
//!
//! A run's tool steps are executed by the caller's adapter between `begin`
//! and `complete`; its memory steps are executed by the server inside
//! `begin` (the server owns memory), which answers `gate: executed` with the
//! recorded outcome. `complete` is accepted only for a step whose gate said
//! `proceed` (409 `step_not_begun` otherwise), or returns the outcome already
//! recorded.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use warden::{Admission, Completion, EngineError, StepGate, StepRefusal, StepResult};
use warden_core::ids::{RunId, StepId};
use warden_core::plan::{PlanError, parse_document};
use warden_core::sop::{Sop, sop_from_value};
use warden_store::Store;

use super::PathParams;
use super::memory::invalid_query;
use crate::auth::AgentCaller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult, sop_error};
use crate::state::AppState;
use crate::wire::{
    AdmitRunRequest, BeginStepQuery, CompleteStepRequest, DecisionBody, GateBody, GateResponse,
    OutcomeBody, Reply, RunAdmittedResponse, RunStepBody, ValidateResponse, ValidateSopRequest,
    step_decisions, step_provenance,
};
use warden::engine_reasons::QUOTA_MAX_RUNS_IN_FLIGHT;

/// Most result labels on one outcome.
const MAX_RESULT_LABELS: usize = 64;
/// Longest error message on one outcome, in bytes.
const MAX_ERROR_BYTES: usize = 4096;

fn parse_sop<S: Store>(st: &AppState<S>, v: &Value) -> ApiResult<Sop> {
    sop_from_value(v, &st.engine().policy().sop_limits).map_err(|e| sop_error(&e))
}

/// `POST /v1/sops/validate` (agent): every step's decision and the
/// provenance its guarded arguments will meet; nothing runs. A plan (an
/// SOP with `$bind`s) is admitted as a session admits it; an SOP gets the
/// decisions its preflight always gave.
pub(crate) async fn validate<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    JsonBody(req): JsonBody<ValidateSopRequest>,
) -> ApiResult<Reply<ValidateResponse>> {
    let document =
        parse_document(&req.sop, &st.engine().policy().sop_limits).map_err(|e| match e {
            PlanError::Sop(s) => sop_error(&s),
            other => ApiError::from(EngineError::Plan(other)),
        })?;
    let result = st.engine().validate_document(&me, &document).await?;
    Ok(Reply(
        StatusCode::OK,
        ValidateResponse {
            admitted: result.preflight.admitted,
            decisions: step_decisions(&result.preflight),
            plan: document.has_bindings(),
            provenance: step_provenance(&result.provenance),
        },
    ))
}

/// `POST /v1/runs` (agent): admit, or 403 `sop_rejected` with every step's
/// decision.
pub(crate) async fn admit<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    JsonBody(req): JsonBody<AdmitRunRequest>,
) -> ApiResult<Reply<RunAdmittedResponse>> {
    let sop = parse_sop(&st, &req.sop)?;
    match st.engine().admit_run(&me, &sop, req.run_id).await? {
        Admission::Rejected(preflight) => Err(ApiError::forbidden(
            "sop_rejected",
            format!(
                "sop rejected: {}",
                preflight
                    .rejected()
                    .map(|s| s.reason().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .with_details(json!({
            "admitted": false,
            "decisions": step_decisions(&preflight),
        }))),
        Admission::OverQuota {
            limit, in_flight, ..
        } => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            QUOTA_MAX_RUNS_IN_FLIGHT.as_str().to_owned(),
            format!("the agent already has {in_flight} runs in flight (limit {limit})"),
        )
        .with_details(json!({"limit": limit, "in_flight": in_flight}))),
        Admission::Admitted {
            run,
            preflight,
            existing,
        } => Ok(Reply(
            if existing {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            },
            RunAdmittedResponse {
                run_id: run.run_id,
                existing,
                steps: run
                    .steps
                    .into_iter()
                    .map(|s| RunStepBody {
                        step_id: s.step_id,
                        action: s.action,
                        operation_id: s.operation_id,
                    })
                    .collect(),
                decisions: step_decisions(&preflight),
            },
        )),
    }
}

fn run_step(path: &PathParams) -> ApiResult<(RunId, StepId)> {
    Ok((
        path.ident("run", RunId::parse)?,
        path.ident("step", StepId::parse)?,
    ))
}

/// `POST /v1/runs/{run}/steps/{step}/begin?lease_id=…` (agent): the
/// per-step gate; a step another worker holds is 409 `step_in_progress`.
pub(crate) async fn begin<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    query: Result<Query<BeginStepQuery>, QueryRejection>,
) -> ApiResult<Reply<GateResponse>> {
    let (run, step) = run_step(&path)?;
    let Query(q) = query.map_err(|e| invalid_query(&e))?;
    let gate = st
        .engine()
        .begin_step_as(&me, &run, &step, q.lease_id.as_deref())
        .await?;
    match gate {
        StepGate::InProgress {
            decision,
            lease_expires_at,
        } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "step_in_progress",
            "another worker began this step and holds its lease: do not run it",
        )
        .with_details(json!({
            "decision": DecisionBody::from(&decision),
            "lease_expires_at": lease_expires_at.0,
        }))),
        StepGate::Replay { decision, outcome } => Ok(Reply(
            StatusCode::OK,
            GateResponse {
                gate: GateBody::Replay,
                decision: (&decision).into(),
                operation_id: None,
                action: None,
                arguments: None,
                outcome: Some((&outcome).into()),
                lease_id: None,
                lease_expires_at: None,
            },
        )),
        StepGate::Escalated {
            decision,
            escalation_id,
        } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "step_escalated",
            format!(
                "the step awaits human review (escalation `{escalation_id}`): {}",
                decision.reason
            ),
        )
        .with_details(json!({
            "decision": DecisionBody::from(&decision),
            "escalation_id": escalation_id,
        }))),
        StepGate::Refused { decision, refusal } => {
            let reason = decision.reason.kind().to_owned();
            let (status, code) = match refusal {
                StepRefusal::OutOfOrder | StepRefusal::RunStopped => {
                    (StatusCode::CONFLICT, reason.clone())
                }
                StepRefusal::Denied => (StatusCode::FORBIDDEN, "step_denied".to_owned()),
            };
            Err(
                ApiError::new(status, code, format!("the gate refused the step: {reason}"))
                    .with_details(json!({"decision": DecisionBody::from(&decision)})),
            )
        }
        StepGate::Executed {
            decision,
            operation_id,
            action,
            arguments,
            outcome,
        } => Ok(Reply(
            StatusCode::OK,
            GateResponse {
                gate: GateBody::Executed,
                decision: (&decision).into(),
                operation_id: Some(operation_id),
                action: Some(action),
                arguments: Some(arguments),
                outcome: Some((&outcome).into()),
                lease_id: None,
                lease_expires_at: None,
            },
        )),
        StepGate::Proceed {
            decision,
            operation_id,
            action,
            arguments,
            lease_id,
            lease_expires_at,
        } => Ok(Reply(
            StatusCode::OK,
            GateResponse {
                gate: GateBody::Proceed,
                decision: (&decision).into(),
                operation_id: Some(operation_id),
                action: Some(action),
                arguments: Some(arguments),
                outcome: None,
                lease_id: Some(lease_id),
                lease_expires_at: Some(lease_expires_at.0),
            },
        )),
    }
}

/// `POST /v1/runs/{run}/steps/{step}/complete` (agent): record the outcome
/// once; a repeat returns the first outcome.
pub(crate) async fn complete<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    JsonBody(req): JsonBody<CompleteStepRequest>,
) -> ApiResult<Reply<OutcomeBody>> {
    let (run, step) = run_step(&path)?;
    if req.result_labels.len() > MAX_RESULT_LABELS {
        return Err(ApiError::invalid(
            "limit_exceeded",
            format!("`result_labels` has more than {MAX_RESULT_LABELS} entries"),
        )
        .with_details(json!({"field": "result_labels", "max": MAX_RESULT_LABELS})));
    }
    if req
        .error
        .as_ref()
        .is_some_and(|e| e.len() > MAX_ERROR_BYTES)
    {
        return Err(ApiError::invalid(
            "limit_exceeded",
            format!("`error` is longer than {MAX_ERROR_BYTES} bytes"),
        )
        .with_details(json!({"field": "error", "max": MAX_ERROR_BYTES})));
    }
    let completion = st
        .engine()
        .complete_begun_step_as(
            &me,
            &run,
            &step,
            req.lease_id.as_deref(),
            StepResult {
                result: req.result,
                result_labels: req.result_labels,
                error: req.error,
            },
        )
        .await?;
    match completion {
        Completion::Recorded(outcome) => Ok(Reply(StatusCode::OK, (&outcome).into())),
        Completion::NotBegun => Err(ApiError::new(
            StatusCode::CONFLICT,
            "step_not_begun",
            "the gate has not let this step proceed: call `begin` first",
        )),
        Completion::LeaseHeld { lease_expires_at } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "step_lease_held",
            "another worker holds this step's lease: only its holder records the outcome",
        )
        .with_details(json!({"lease_expires_at": lease_expires_at.0}))),
    }
}
