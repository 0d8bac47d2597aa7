//! SOPs and runs: preflight, admission, the per-step gate and outcomes.
//!
//! A run's tool steps are executed by the caller's adapter between `begin`
//! and `complete`; its memory steps are executed by the server inside
//! `begin` (the server owns memory), which answers `gate: executed` with the
//! recorded outcome. `complete` is accepted only for a step whose gate said
//! `proceed` (409 `step_not_begun` otherwise), or returns the outcome already
//! recorded.

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use warden::{Admission, Caller, StepGate, StepResult};
use warden_core::ids::{AgentId, Key, Namespace, RunId, StepId};
use warden_core::preflight::{MEMORY_READ, MEMORY_WRITE};
use warden_core::sop::{Sop, sop_from_value};
use warden_store::{StepStatus, Store};

use super::PathParams;
use super::memory::check_storage_quota;
use crate::auth::AgentCaller;
use crate::body::{JsonBody, sop_error};
use crate::error::{ApiError, ApiResult};
use crate::quota::QUOTA_MAX_RUNS_IN_FLIGHT;
use crate::state::AppState;
use crate::wire::{
    AdmitRunRequest, CompleteStepRequest, DecisionBody, GateBody, GateResponse, OutcomeBody, Reply,
    RunAdmittedResponse, RunStepBody, ValidateResponse, ValidateSopRequest, step_decisions,
};

/// Most result labels on one outcome.
const MAX_RESULT_LABELS: usize = 64;
/// Longest error message on one outcome, in bytes.
const MAX_ERROR_BYTES: usize = 4096;

fn parse_sop<S: Store>(st: &AppState<S>, v: &Value) -> ApiResult<Sop> {
    sop_from_value(v, &st.engine().policy().sop_limits).map_err(|e| sop_error(&e))
}

/// `POST /v1/sops/validate` (agent): every step's decision; nothing runs.
pub(crate) async fn validate<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    JsonBody(req): JsonBody<ValidateSopRequest>,
) -> ApiResult<Reply<ValidateResponse>> {
    let sop = parse_sop(&st, &req.sop)?;
    let result = st.engine().validate_sop(&me, &sop).await?;
    Ok(Reply(
        StatusCode::OK,
        ValidateResponse {
            admitted: result.admitted,
            decisions: step_decisions(&result),
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
    let max_runs = st
        .engine()
        .policy()
        .quota_for(&me)
        .and_then(|q| q.max_runs_in_flight);
    let _guard = match max_runs {
        None => None,
        Some(max) => {
            let lock = st.shared.quotas.writer(&me);
            let guard = lock.lock_owned().await;
            let ttl = i64::try_from(st.config().run_ttl.as_millis()).unwrap_or(i64::MAX);
            let in_flight = st.shared.quotas.runs_in_flight(&me, st.now_ms(), ttl);
            let reused = match &req.run_id {
                Some(id) => st
                    .engine()
                    .store()
                    .get_run(id.clone())
                    .await?
                    .is_some_and(|r| r.run.agent == me),
                None => false,
            };
            if !reused && in_flight >= max as usize {
                let err = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    QUOTA_MAX_RUNS_IN_FLIGHT,
                    format!("the agent already has {in_flight} runs in flight (limit {max})"),
                )
                .with_details(json!({"limit": max, "in_flight": in_flight}));
                return Err(st
                    .deny(
                        &Caller::Agent(me.clone()),
                        warden::ops::RUN_ADMIT,
                        sop.sop_id.to_string(),
                        QUOTA_MAX_RUNS_IN_FLIGHT,
                        err,
                    )
                    .await);
            }
            Some(guard)
        }
    };
    match st.engine().admit_run(&me, &sop, req.run_id).await? {
        Admission::Rejected(preflight) => Err(ApiError::forbidden(
            "sop_rejected",
            format!(
                "sop rejected: {}",
                preflight
                    .rejected()
                    .map(|s| s.decision.reason.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .with_details(json!({
            "admitted": false,
            "decisions": step_decisions(&preflight),
        }))),
        Admission::Admitted {
            run,
            preflight,
            existing,
        } => {
            if !existing {
                st.shared.quotas.run_admitted(&me, &run.run_id, st.now_ms());
            }
            Ok(Reply(
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
            ))
        }
    }
}

fn run_step(path: &PathParams) -> ApiResult<(RunId, StepId)> {
    Ok((
        path.ident("run", RunId::parse)?,
        path.ident("step", StepId::parse)?,
    ))
}

/// Forget a finished run in the in-flight count.
async fn refresh_run<S: Store>(st: &AppState<S>, agent: &AgentId, run: &RunId) -> ApiResult<()> {
    let Some(state) = st.engine().store().get_run(run.clone()).await? else {
        return Ok(());
    };
    let stopped = state
        .outcomes
        .values()
        .any(|o| o.status != StepStatus::Completed);
    let all_done = state
        .run
        .steps
        .iter()
        .all(|s| state.outcomes.contains_key(&s.step_id));
    if stopped || all_done {
        st.shared.quotas.run_finished(agent, run);
    }
    Ok(())
}

/// `POST /v1/runs/{run}/steps/{step}/begin` (agent): the per-step gate.
pub(crate) async fn begin<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
) -> ApiResult<Reply<GateResponse>> {
    let (run, step) = run_step(&path)?;
    let gate = st.engine().begin_step(&me, &run, &step).await?;
    match gate {
        StepGate::Replay { decision, outcome } => Ok(Reply(
            StatusCode::OK,
            GateResponse {
                gate: GateBody::Replay,
                decision: (&decision).into(),
                operation_id: None,
                action: None,
                arguments: None,
                outcome: Some((&outcome).into()),
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
        StepGate::Refused { decision } => {
            refresh_run(&st, &me, &run).await?;
            let reason = decision.reason.kind().to_owned();
            let (status, code) = match reason.as_str() {
                "step_out_of_order" | "run_stopped" => (StatusCode::CONFLICT, reason.clone()),
                _ if decision.verdict == warden_core::decision::Verdict::Escalate => {
                    (StatusCode::FORBIDDEN, "step_escalated".to_owned())
                }
                _ => (StatusCode::FORBIDDEN, "step_denied".to_owned()),
            };
            Err(
                ApiError::new(status, code, format!("the gate refused the step: {reason}"))
                    .with_details(json!({"decision": DecisionBody::from(&decision)})),
            )
        }
        StepGate::Proceed {
            decision,
            operation_id,
            action,
            arguments,
        } if action.as_str() == MEMORY_READ || action.as_str() == MEMORY_WRITE => {
            let result = execute_memory_step(&st, &me, action.as_str(), &arguments).await?;
            let outcome = st.engine().complete_step(&me, &run, &step, result).await?;
            refresh_run(&st, &me, &run).await?;
            Ok(Reply(
                StatusCode::OK,
                GateResponse {
                    gate: GateBody::Executed,
                    decision: (&decision).into(),
                    operation_id: Some(operation_id),
                    action: Some(action),
                    arguments: Some(arguments),
                    outcome: Some((&outcome).into()),
                },
            ))
        }
        StepGate::Proceed {
            decision,
            operation_id,
            action,
            arguments,
        } => {
            let ttl = i64::try_from(st.config().run_ttl.as_millis()).unwrap_or(i64::MAX);
            st.shared.quotas.step_begun(&run, &step, st.now_ms(), ttl);
            Ok(Reply(
                StatusCode::OK,
                GateResponse {
                    gate: GateBody::Proceed,
                    decision: (&decision).into(),
                    operation_id: Some(operation_id),
                    action: Some(action),
                    arguments: Some(arguments),
                    outcome: None,
                },
            ))
        }
    }
}

/// Run a memory step for `agent`, within its storage quota.
async fn execute_memory_step<S: Store>(
    st: &AppState<S>,
    agent: &AgentId,
    action: &str,
    arguments: &serde_json::Map<String, Value>,
) -> ApiResult<StepResult> {
    if action == MEMORY_WRITE {
        let ns = arguments
            .get("namespace")
            .and_then(Value::as_str)
            .and_then(|s| Namespace::parse(s).ok());
        let key = arguments
            .get("key")
            .and_then(Value::as_str)
            .and_then(|s| Key::parse(s).ok());
        if let (Some(ns), Some(key)) = (ns, key) {
            let len = arguments
                .get("value")
                .and_then(|v| serde_json::to_vec(v).ok())
                .map_or(0, |b| b.len() as u64);
            let lock = st.shared.quotas.writer(agent);
            let _guard = lock.lock_owned().await;
            match check_storage_quota(st, agent, &ns, &key, len).await {
                Ok(()) => {}
                // Over quota: the step fails (recorded), nothing is written.
                Err(e) if e.status == StatusCode::TOO_MANY_REQUESTS => {
                    return Ok(StepResult {
                        error: Some(e.code.to_string()),
                        ..StepResult::default()
                    });
                }
                Err(e) => return Err(e),
            }
            return Ok(st.engine().execute_memory(agent, action, arguments).await?);
        }
    }
    Ok(st.engine().execute_memory(agent, action, arguments).await?)
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
    if !st.shared.quotas.is_begun(&run, &step) {
        let state = st
            .engine()
            .store()
            .get_run(run.clone())
            .await?
            .filter(|s| s.run.agent == me)
            .ok_or_else(ApiError::not_found)?;
        if !state.run.steps.iter().any(|s| s.step_id == step) {
            return Err(ApiError::not_found());
        }
        return match state.outcomes.get(&step) {
            Some(outcome) => Ok(Reply(StatusCode::OK, outcome.into())),
            None => Err(ApiError::new(
                StatusCode::CONFLICT,
                "step_not_begun",
                "the gate has not let this step proceed: call `begin` first",
            )),
        };
    }
    let outcome = st
        .engine()
        .complete_step(
            &me,
            &run,
            &step,
            StepResult {
                result: req.result,
                result_labels: req.result_labels,
                error: req.error,
            },
        )
        .await?;
    st.shared.quotas.step_done(&run, &step);
    refresh_run(&st, &me, &run).await?;
    Ok(Reply(StatusCode::OK, (&outcome).into()))
}
