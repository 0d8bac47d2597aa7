//! Context envelopes over HTTP: reading a run's envelope, declassifying it,
//! exporting it signed, receipts, the signing key, and the escalation queue.
//!
//! Who may touch a run's envelope: the run's agent and the operator (and,
//! for a declassification, an active ancestor of the run's agent: the
//! engine then checks the bundle's `context.declassifiers`). Anyone else,
//! and a run that does not exist, answer the same 404 `not_found`; an
//! existing run the caller may not see is recorded as a denial.
//!
//! Nothing here ever returns data: envelopes are label, restriction and
//! rule names, levels, ids and versions.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde_json::json;
use warden::{Caller, EngineError, EnvelopeRead, Missing, ReviewOutcome, RunAccess, RunVisibility};
use warden_core::envelope::ContextPolicy;
use warden_core::envelope::sign::SignedEnvelope;
use warden_core::ids::{Label, RunId};
use warden_core::time::Timestamp;
use warden_store::Store;

use super::PathParams;
use super::memory::invalid_query;
use crate::auth::{AgentCaller, AnyCaller, OperatorCaller};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::signing::EnvelopeKeySource;
use crate::state::AppState;
use crate::wire::{
    DecisionBody, DeclassifyRequest, DeclassifyResponse, EnvelopeKeyResponse, EnvelopeResponse,
    EscalationBody, EscalationListResponse, EscalationQuery, ReceiptResponse,
    RejectEscalationRequest, Reply, ReviewResponse, VerifyingKeyBody,
};

/// Whether `caller` may act on the run under `access` (decided and, if
/// not, recorded by the engine). A missing run and one the caller may not
/// see answer the same 404.
async fn visible_run<S: Store>(
    st: &AppState<S>,
    caller: &Caller,
    run_id: &RunId,
    operation: &str,
    access: RunAccess,
) -> ApiResult<()> {
    match st
        .engine()
        .run_visibility(caller, run_id, operation, access)
        .await?
    {
        RunVisibility::Visible(_) => Ok(()),
        RunVisibility::Hidden { .. } => Err(ApiError::not_found()),
    }
}

fn run_id(path: &PathParams) -> ApiResult<RunId> {
    path.ident("run", RunId::parse)
}

/// 404 `no_envelope`: the run exists and is visible but carries no envelope
/// (the policy has no `context:` section, or the run predates it).
fn no_envelope(run_id: &RunId) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_envelope",
        format!("run `{run_id}` has no context envelope"),
    )
}

/// Context-specific mapping of engine errors: a run without an envelope is
/// 404 `no_envelope`; everything else keeps its usual mapping.
fn context_error(run_id: &RunId) -> impl Fn(EngineError) -> ApiError + '_ {
    move |e| match e {
        EngineError::NotFound {
            what: Missing::RunEnvelope,
            ..
        } => no_envelope(run_id),
        other => other.into(),
    }
}

/// `GET /v1/runs/{run}/envelope` (the run's agent, or the operator): the
/// latest version of the run's envelope. Recorded (`context.read`).
pub(crate) async fn envelope<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<EnvelopeResponse>> {
    let run_id = run_id(&path)?;
    match st
        .engine()
        .read_envelope(&caller, &run_id)
        .await
        .map_err(context_error(&run_id))?
    {
        EnvelopeRead::Read { envelope, .. } => Ok(Reply(
            StatusCode::OK,
            EnvelopeResponse::new(run_id, *envelope),
        )),
        EnvelopeRead::Hidden { .. } => Err(ApiError::not_found()),
    }
}

/// Every label to remove is one the policy knows (422 `unknown_label`
/// otherwise, before anything is decided or recorded).
fn check_remove_labels<S: Store>(st: &AppState<S>, labels: &[Label]) -> ApiResult<()> {
    if labels.len() > ContextPolicy::MAX_LABELS {
        return Err(ApiError::invalid(
            "limit_exceeded",
            format!(
                "`remove_labels` has more than {} entries",
                ContextPolicy::MAX_LABELS
            ),
        )
        .with_details(json!({"field": "remove_labels", "max": ContextPolicy::MAX_LABELS})));
    }
    let policy = st.engine().context_policy();
    let known = |l: &Label| policy.is_some_and(|p| p.labels().any(|k| k == l));
    if let Some((i, unknown)) = labels.iter().enumerate().find(|(_, l)| !known(l)) {
        return Err(ApiError::invalid(
            "unknown_label",
            format!("label `{unknown}` is not declared in the policy's `context:` section"),
        )
        .with_details(json!({"field": format!("remove_labels[{i}]")})));
    }
    Ok(())
}

/// `POST /v1/runs/{run}/declassify` (agent: the run's, or an ancestor of
/// it): lower the run's envelope. The engine allows it only to the bundle's
/// `context.declassifiers` and records it either way.
pub(crate) async fn declassify<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    JsonBody(req): JsonBody<DeclassifyRequest>,
) -> ApiResult<Reply<DeclassifyResponse>> {
    let run_id = run_id(&path)?;
    warden::check_text("justification", &req.justification)?;
    check_remove_labels(&st, &req.remove_labels)?;
    let caller = Caller::Agent(me.clone());
    visible_run(
        &st,
        &caller,
        &run_id,
        warden::ops::CONTEXT_DECLASSIFY,
        RunAccess::OwnerOrAncestor,
    )
    .await?;
    let out = st
        .engine()
        .declassify(
            &me,
            &run_id,
            req.to.into(),
            &req.remove_labels,
            &req.justification,
        )
        .await
        .map_err(context_error(&run_id))?;
    match out.envelope {
        Some(record) => Ok(Reply(
            StatusCode::OK,
            DeclassifyResponse {
                decision: (&out.decision).into(),
                envelope: EnvelopeResponse::new(run_id, record),
            },
        )),
        None => {
            // `declassification_not_authorized`, `declassification_invalid`
            // (a target above the current level, or below what the labels
            // left imply), `agent_revoked`: recorded by the engine.
            let reason = out.decision.reason.kind().to_owned();
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                reason,
                format!("declassification refused: {}", out.decision.reason),
            )
            .with_details(json!({"decision": DecisionBody::from(&out.decision)})))
        }
    }
}

/// `GET /v1/runs/{run}/envelope/signed` (the run's agent, or the
/// operator): the latest envelope signed with the server's Ed25519 key, as
/// a token `{envelope, issuer, signature}` that
/// `warden_core::envelope::Verifier` checks against `GET /v1/envelope-key`.
/// Recorded (`envelope_exported`).
pub(crate) async fn signed<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<SignedEnvelope>> {
    let run_id = run_id(&path)?;
    visible_run(
        &st,
        &caller,
        &run_id,
        warden::ops::CONTEXT_EXPORT,
        RunAccess::Owner,
    )
    .await?;
    let signer = st.signer();
    let token = st
        .engine()
        .export_envelope(&caller, &run_id, signer.issuer(), signer.key())
        .await
        .map_err(context_error(&run_id))?;
    Ok(Reply(StatusCode::OK, token))
}

/// `GET /v1/runs/{run}/receipt` (the run's agent, or the operator): an
/// opaque receipt for the latest envelope. Recorded (`receipt_issued`).
pub(crate) async fn receipt<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<ReceiptResponse>> {
    let run_id = run_id(&path)?;
    visible_run(
        &st,
        &caller,
        &run_id,
        warden::ops::CONTEXT_RECEIPT,
        RunAccess::Owner,
    )
    .await?;
    let ttl = i64::try_from(st.config().receipt_ttl.as_millis()).unwrap_or(i64::MAX);
    let until = Timestamp(st.now_ms().saturating_add(ttl));
    let receipt = st
        .engine()
        .receipt(&caller, &run_id, st.signer().issuer(), until)
        .await
        .map_err(context_error(&run_id))?;
    Ok(Reply(StatusCode::OK, receipt.into()))
}

/// `GET /v1/envelope-key` (anyone): the issuer id and public key that
/// verify exported envelopes.
pub(crate) async fn envelope_key<S: Store>(
    State(st): State<AppState<S>>,
) -> Reply<EnvelopeKeyResponse> {
    let keys = st.envelope_keys();
    let signer = keys.signer();
    let generation = match signer.source() {
        EnvelopeKeySource::Stored { generation } => Some(generation),
        _ => None,
    };
    Reply(
        StatusCode::OK,
        EnvelopeKeyResponse {
            issuer: signer.issuer().to_string(),
            public_key: signer.public_key_hex(),
            algorithm: "ed25519".to_owned(),
            key_source: signer.source().as_str().to_owned(),
            generation,
            verifying_keys: keys
                .verifying()
                .iter()
                .map(|k| VerifyingKeyBody {
                    issuer: k.issuer.to_string(),
                    public_key: hex::encode(k.public_key),
                    generation: k.generation,
                })
                .collect(),
        },
    )
}

/// `GET /v1/escalations?status=…` (operator): the queue, oldest first.
pub(crate) async fn list_escalations<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
    query: Result<Query<EscalationQuery>, QueryRejection>,
) -> ApiResult<Reply<EscalationListResponse>> {
    let Query(q) = query.map_err(|e| invalid_query(&e))?;
    let list = st
        .engine()
        .list_escalations(q.status.map(Into::into))
        .await?;
    Ok(Reply(
        StatusCode::OK,
        EscalationListResponse {
            escalations: list.into_iter().map(Into::into).collect(),
        },
    ))
}

fn escalation_id(path: &PathParams) -> ApiResult<String> {
    path.ident("id", |s| {
        warden_core::ids::check_identifier(s).map(|()| s.to_owned())
    })
}

/// `GET /v1/escalations/{id}` (operator).
pub(crate) async fn get_escalation<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
    path: PathParams,
) -> ApiResult<Reply<EscalationBody>> {
    let id = escalation_id(&path)?;
    let e = st.engine().escalation(&id).await?;
    Ok(Reply(StatusCode::OK, e.into()))
}

/// The answer for a review: 200 with the escalation when this call resolved
/// it; 409 `escalation_not_pending` when it was resolved before; for a
/// reviewer the engine refuses, 403 `escalation_reviewer_not_authorized`
/// to the requester itself and 404 to anyone else (who may not see it; the
/// refusal is recorded either way).
fn review_reply(caller: &Caller, out: ReviewOutcome) -> ApiResult<Reply<ReviewResponse>> {
    use warden::engine_reasons as er;
    let reason = out.decision.reason.clone();
    if reason == er::ESCALATION_APPROVED || reason == er::ESCALATION_REJECTED {
        return Ok(Reply(
            StatusCode::OK,
            ReviewResponse {
                decision: (&out.decision).into(),
                escalation: out.escalation.into(),
            },
        ));
    }
    let details = json!({"decision": DecisionBody::from(&out.decision)});
    if reason == er::ESCALATION_NOT_PENDING {
        let status = out.escalation.status.as_str();
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "escalation_not_pending",
            format!("the escalation is already {status}"),
        )
        .with_details(details)
        .with_details(json!({"status": status})));
    }
    if reason == er::ESCALATION_UNBOUND {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "escalation_unbound",
            "the escalation binds no request (stored before approvals were bound): reject it; the request escalates afresh",
        )
        .with_details(details));
    }
    if reason == er::ESCALATION_REVIEWER_NOT_AUTHORIZED {
        return if *caller == out.escalation.requested_by {
            Err(ApiError::forbidden(
                "escalation_reviewer_not_authorized",
                "the requester may not review its own escalation",
            )
            .with_details(details))
        } else {
            Err(ApiError::not_found())
        };
    }
    Err(
        ApiError::forbidden(reason.kind().to_owned(), format!("denied: {reason}"))
            .with_details(details),
    )
}

/// `POST /v1/escalations/{id}/approve` (the operator, or an active ancestor
/// of the requesting agent): the held request proceeds once, the next time
/// it is made.
pub(crate) async fn approve<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
) -> ApiResult<Reply<ReviewResponse>> {
    let id = escalation_id(&path)?;
    let out = st.engine().approve_escalation(&id, &caller).await?;
    review_reply(&caller, out)
}

/// `POST /v1/escalations/{id}/reject` `{reason}` (the operator, or an
/// active ancestor of the requesting agent): the held request is denied; a
/// held step is recorded `Denied` and its run stops.
pub(crate) async fn reject<S: Store>(
    State(st): State<AppState<S>>,
    AnyCaller(caller): AnyCaller,
    path: PathParams,
    JsonBody(req): JsonBody<RejectEscalationRequest>,
) -> ApiResult<Reply<ReviewResponse>> {
    let id = escalation_id(&path)?;
    let out = st
        .engine()
        .reject_escalation(&id, &caller, &req.reason)
        .await?;
    review_reply(&caller, out)
}
