//! Agents and tokens.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::json;
use warden::{
    AgentRead, AgentVisibility, Caller, DelegationOptions, RegisterAgent, Registration,
    RegistrationRefusal, Revocation, TokenRevocation,
};
use warden_core::envelope::ContextPolicy;
use warden_core::envelope::sign::SignedEnvelope;
use warden_core::ids::{ActionName, AgentId, Label, check_identifier};
use warden_store::{Store, TokenSubject};

use super::PathParams;
use crate::auth::{AgentCaller, AnyCaller, OperatorCaller};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult, registration_refused};
use crate::state::AppState;
use crate::wire::{
    AgentCreatedResponse, AgentResponse, DecisionBody, DelegateRequest, RegisterAgentRequest,
    Reply, RevokedResponse, TokenIssuedResponse, TokenRevokedResponse,
};

/// The reserved path word for "the calling agent".
pub const SELF: &str = "self";

fn limit_exceeded(field: &str, max: usize) -> ApiError {
    ApiError::invalid(
        "limit_exceeded",
        format!("`{field}` has more than {max} entries or bytes"),
    )
    .with_details(json!({"field": field, "max": max}))
}

/// Checks of a registration that need no state: reserved id, known action
/// names, per-field limits.
fn check_registration<S: Store>(
    st: &AppState<S>,
    id: &AgentId,
    capabilities: &[ActionName],
    tools: Option<&[String]>,
) -> ApiResult<()> {
    let limits = &st.config().limits;
    if id.as_str() == SELF {
        return Err(ApiError::invalid(
            "reserved_agent_id",
            "`self` is reserved: it names the calling agent in paths",
        )
        .with_details(json!({"field": "agent_id"})));
    }
    if capabilities.len() > limits.max_capabilities {
        return Err(limit_exceeded("capabilities", limits.max_capabilities));
    }
    let policy = st.engine().policy();
    if let Some((i, unknown)) = capabilities
        .iter()
        .enumerate()
        .find(|(_, c)| policy.action_index(c).is_none())
    {
        return Err(ApiError::invalid(
            "unknown_capability",
            format!("capability `{unknown}` is not an action of the policy's catalogue"),
        )
        .with_details(json!({"field": format!("capabilities[{i}]")})));
    }
    if let Some(tools) = tools {
        if tools.len() > limits.max_tools {
            return Err(limit_exceeded("tools", limits.max_tools));
        }
        if tools.iter().any(|t| t.len() > limits.max_tool_name_bytes) {
            return Err(limit_exceeded("tools[]", limits.max_tool_name_bytes));
        }
    }
    Ok(())
}

async fn created<S: Store>(
    st: &AppState<S>,
    view: warden::AgentView,
    issuer: &Caller,
) -> ApiResult<Reply<AgentCreatedResponse>> {
    let token = st
        .issue_token(TokenSubject::Agent(view.agent_id.clone()), issuer)
        .await?;
    Ok(Reply(
        StatusCode::CREATED,
        AgentCreatedResponse {
            agent_id: view.agent_id,
            parent_id: view.parent_id,
            token: token.secret,
            token_id: token.token_id,
            effective_capabilities: view.effective_capabilities,
        },
    ))
}

/// `POST /v1/agents` (operator).
pub(crate) async fn register<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
    JsonBody(req): JsonBody<RegisterAgentRequest>,
) -> ApiResult<Reply<AgentCreatedResponse>> {
    check_registration(&st, &req.agent_id, &req.capabilities, req.tools.as_deref())?;
    let view = st
        .engine()
        .register_agent(
            &Caller::Operator,
            RegisterAgent {
                id: req.agent_id,
                parent: req.parent_id,
                capabilities: req.capabilities.into_iter().collect::<BTreeSet<_>>(),
                tools: req.tools,
                config: req.config,
            },
        )
        .await?;
    match view {
        Registration::Registered { agent, .. } => created(&st, *agent, &Caller::Operator).await,
        other => Err(delegation_error(other)),
    }
}

/// Checks of a delegation's context options that need no state: every
/// declared restriction is one the policy knows (a policy without a
/// `context:` section knows none), within the policy's limit.
fn check_delegation_options<S: Store>(st: &AppState<S>, restrictions: &[Label]) -> ApiResult<()> {
    if restrictions.len() > ContextPolicy::MAX_RESTRICTIONS {
        return Err(limit_exceeded(
            "restrictions",
            ContextPolicy::MAX_RESTRICTIONS,
        ));
    }
    let known = |r: &Label| {
        st.engine()
            .context_policy()
            .is_some_and(|p| p.restrictions().any(|k| k == r))
    };
    if let Some((i, unknown)) = restrictions.iter().enumerate().find(|(_, r)| !known(r)) {
        return Err(ApiError::invalid(
            "unknown_restriction",
            format!("restriction `{unknown}` is not declared in the policy's `context:` section"),
        )
        .with_details(json!({"field": format!("restrictions[{i}]")})));
    }
    Ok(())
}

/// The answer for a registration that did not go through (its decision was
/// recorded and it created nothing): 403 `delegation_denied` with the
/// decision when the context envelope refuses it, 403
/// `delegation_escalated` with the decision and the escalation to review
/// when it is held, and the refusal's own answer otherwise.
fn delegation_error(outcome: Registration) -> ApiError {
    match outcome {
        Registration::Refused {
            decision,
            refusal: RegistrationRefusal::Context,
        } => ApiError::forbidden(
            "delegation_denied",
            format!(
                "the context envelope refuses the delegation: {}",
                decision.reason
            ),
        )
        .with_details(json!({
            "reason": decision.reason.as_str(),
            "decision": DecisionBody::from(&decision),
        })),
        Registration::Refused { decision, refusal } => registration_refused(&decision, &refusal),
        Registration::Escalated {
            decision,
            escalation_id,
        } => ApiError::forbidden(
            "delegation_escalated",
            format!(
                "the delegation awaits human review (escalation `{escalation_id}`): {}",
                decision.reason
            ),
        )
        .with_details(json!({
            "reason": decision.reason.as_str(),
            "decision": DecisionBody::from(&decision),
            "escalation_id": escalation_id,
        })),
        Registration::Registered { .. } => {
            ApiError::internal(&"a registration reported as refused")
        }
    }
}

/// `POST /v1/agents/self/children` (agent): delegation. The context
/// options go to `register_agent_with`, so the child's envelope is built
/// from the source run's (or the caller's inherited) envelope and the
/// delegation is decided against it.
pub(crate) async fn delegate<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    JsonBody(req): JsonBody<DelegateRequest>,
) -> ApiResult<Reply<AgentCreatedResponse>> {
    check_registration(&st, &req.agent_id, &req.capabilities, req.tools.as_deref())?;
    check_delegation_options(&st, &req.restrictions)?;
    let caller = Caller::Agent(me.clone());
    // A `parent_id` naming anyone but the caller goes to the engine as is:
    // it refuses it (`not_own_child`) and records the attempt.
    let parent = req.parent_id.unwrap_or(me);
    let from_envelope = match req.from_envelope {
        None => None,
        Some(v) => Some(serde_json::from_value::<SignedEnvelope>(v).map_err(|e| {
            ApiError::invalid("invalid_value", format!("`from_envelope` {e}"))
                .with_details(json!({"field": "from_envelope"}))
        })?),
    };
    let options = DelegationOptions {
        from_run: req.from_run,
        from_session: req.from_session,
        from_envelope,
        zone: req.zone.map(Into::into),
        restrictions: req.restrictions,
        redact_labels: req.redact_labels,
    };
    let view = st
        .engine()
        .register_agent_with(
            &caller,
            RegisterAgent {
                id: req.agent_id,
                parent: Some(parent),
                capabilities: req.capabilities.into_iter().collect(),
                tools: req.tools,
                config: req.config,
            },
            options,
        )
        .await?;
    match view {
        Registration::Registered { agent, .. } => created(&st, *agent, &caller).await,
        other => Err(delegation_error(other)),
    }
}

/// The view of `id` if `caller` may see it (recorded either way by the
/// engine). A missing agent and one the caller may not see give the same
/// 404.
async fn view<S: Store>(
    st: &AppState<S>,
    caller: &Caller,
    id: &AgentId,
) -> ApiResult<Reply<AgentResponse>> {
    match st.engine().read_agent(caller, id).await? {
        AgentRead::Visible { agent, .. } => Ok(Reply(StatusCode::OK, (*agent).into())),
        AgentRead::Hidden { .. } => Err(ApiError::not_found()),
    }
}

/// `GET /v1/agents/{id}` (operator, the agent, its ancestors).
pub(crate) async fn get<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<AgentResponse>> {
    let id = path.ident("id", AgentId::parse)?;
    view(&st, &caller, &id).await
}

/// `GET /v1/agents/self` (agent): the caller itself.
pub(crate) async fn get_self<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
) -> ApiResult<Reply<AgentResponse>> {
    view(&st, &Caller::Agent(me.clone()), &me).await
}

/// `DELETE /v1/agents/{id}` (operator, an ancestor): revoke with
/// descendants.
pub(crate) async fn revoke<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<RevokedResponse>> {
    let id = path.ident("id", AgentId::parse)?;
    // An agent that cannot even see the target learns nothing: 404. The
    // agent itself sees itself, and the engine refuses (and records) a
    // self-revocation with 403 `not_an_ancestor`.
    if let AgentVisibility::Hidden { .. } = st
        .engine()
        .agent_visibility(&caller, &id, warden::ops::AGENT_REVOKE)
        .await?
    {
        return Err(ApiError::not_found());
    }
    match st.engine().revoke_agent(&caller, &id).await? {
        Revocation::Revoked { agents, .. } => {
            Ok(Reply(StatusCode::OK, RevokedResponse { revoked: agents }))
        }
        Revocation::Refused { decision } => Err(ApiError::forbidden(
            decision.reason.kind().to_owned(),
            format!("denied: {}", decision.reason),
        )
        .with_details(json!({"reason": decision.reason.as_str()}))),
    }
}

/// `POST /v1/agents/{id}/tokens` (operator).
pub(crate) async fn issue_token<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
    path: PathParams,
) -> ApiResult<Reply<TokenIssuedResponse>> {
    let id = path.ident("id", AgentId::parse)?;
    let token = st
        .issue_token(TokenSubject::Agent(id.clone()), &Caller::Operator)
        .await?;
    Ok(Reply(
        StatusCode::CREATED,
        TokenIssuedResponse {
            agent_id: id,
            token_id: token.token_id,
            token: token.secret,
        },
    ))
}

/// `DELETE /v1/tokens/{token_id}` (operator): revoke one token; the agent
/// stays active.
pub(crate) async fn revoke_token<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
    path: PathParams,
) -> ApiResult<Reply<TokenRevokedResponse>> {
    let token_id = path
        .ident("token_id", |s| check_identifier(s).map(|()| s.to_owned()))
        .map_err(|_| ApiError::not_found())?;
    match st
        .engine()
        .revoke_token(&Caller::Operator, &token_id)
        .await?
    {
        TokenRevocation::Revoked { .. } => Ok(Reply(
            StatusCode::OK,
            TokenRevokedResponse {
                token_id,
                revoked: true,
            },
        )),
        TokenRevocation::Unknown { .. } => Err(ApiError::not_found()),
    }
}
