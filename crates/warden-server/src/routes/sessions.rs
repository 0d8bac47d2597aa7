//! Tool-call sessions: every handler translates one engine operation.
//!
//! A decided call answers 200 whatever its verdict (the verdict, reason and
//! per-argument provenance are the body); refusals to open a session answer
//! 403 (`session_refused`, with the decision) and nothing is created.

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::json;
use warden::{CallResult, OpenSession, ProposedCall, SessionOpening, SessionRefusal};
use warden_core::envelope::sign::SignedEnvelope;
use warden_core::ids::{CallId, SessionId};
use warden_store::Store;

use super::PathParams;
use crate::auth::{AgentCaller, AnyCaller};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::wire::{
    CallResponse, CallResultRequest, CancelSessionRequest, DecisionBody, OpenSessionRequest, Reply,
    SessionBody, SessionCallRequest,
};

/// `POST /v1/sessions`: open a session (201), or find the same one (200).
pub(crate) async fn open<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    JsonBody(req): JsonBody<OpenSessionRequest>,
) -> ApiResult<Reply<SessionBody>> {
    let from_envelope = match req.from_envelope {
        None => None,
        Some(v) => Some(serde_json::from_value::<SignedEnvelope>(v).map_err(|e| {
            ApiError::invalid("invalid_value", format!("`from_envelope` {e}"))
                .with_details(json!({"field": "from_envelope"}))
        })?),
    };
    let request = OpenSession {
        session_id: req.session_id,
        agent: req.agent_id,
        trusted_inputs: req.trusted_inputs,
        plan: req.plan,
        from_envelope,
    };
    match st.engine().open_session(&caller, request).await? {
        SessionOpening::Opened {
            session, existing, ..
        } => Ok(Reply(
            if existing {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            },
            SessionBody::of(&session, existing),
        )),
        SessionOpening::Refused { decision, refusal } => {
            let reasons: Vec<String> = match &refusal {
                SessionRefusal::Plan { reasons } => {
                    reasons.iter().map(ToString::to_string).collect()
                }
                SessionRefusal::NotPermitted | SessionRefusal::Import => {
                    vec![decision.reason.to_string()]
                }
            };
            Err(ApiError::forbidden(
                "session_refused",
                format!("session refused: {}", reasons.join(", ")),
            )
            .with_details(json!({
                "reason": decision.reason.to_string(),
                "reasons": reasons,
                "decision": DecisionBody::from(&decision),
            })))
        }
    }
}

fn session_id(path: &PathParams) -> ApiResult<SessionId> {
    path.ident("id", SessionId::parse)
}

/// `GET /v1/sessions/{id}`: the session, its envelope, plan and calls.
pub(crate) async fn get<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<SessionBody>> {
    let id = session_id(&path)?;
    let view = st.engine().session(&caller, &id).await?;
    Ok(Reply(StatusCode::OK, SessionBody::of(&view, false)))
}

/// `POST /v1/sessions/{id}/calls`: decide one call before it runs.
pub(crate) async fn call<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    JsonBody(req): JsonBody<SessionCallRequest>,
) -> ApiResult<Reply<CallResponse>> {
    let id = session_id(&path)?;
    let answer = st
        .engine()
        .session_call(
            &warden::Caller::Agent(me),
            &id,
            ProposedCall {
                call_id: req.call_id,
                action: req.action,
                arguments: req.arguments,
            },
        )
        .await?;
    Ok(Reply(StatusCode::OK, (&answer).into()))
}

/// `POST /v1/sessions/{id}/calls/{call}/result`: record what the tool
/// returned.
pub(crate) async fn result<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    JsonBody(req): JsonBody<CallResultRequest>,
) -> ApiResult<Reply<CallResponse>> {
    let id = session_id(&path)?;
    let call = path.ident("call", CallId::parse)?;
    let answer = st
        .engine()
        .record_call_result(
            &warden::Caller::Agent(me),
            &id,
            &call,
            CallResult {
                result: req.result,
                error: req.error,
                labels: req.labels,
            },
        )
        .await?;
    Ok(Reply(StatusCode::OK, (&answer).into()))
}

/// `POST /v1/sessions/{id}/cancel`: later calls refused, pending
/// escalations withdrawn.
pub(crate) async fn cancel<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
    JsonBody(req): JsonBody<CancelSessionRequest>,
) -> ApiResult<Reply<SessionBody>> {
    let id = session_id(&path)?;
    let view = st
        .engine()
        .cancel_session(&caller, &id, &req.reason)
        .await?;
    Ok(Reply(StatusCode::OK, SessionBody::of(&view, false)))
}
