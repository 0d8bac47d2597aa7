//! Memory: resolve, write, delete, in the caller's terms.
//!
//! A read that finds nothing and a read of a record the caller may not see
//! answer the same 404 `not_found`; the audit log keeps the true reason
//! (`record_not_found`, `not_visible_from:<owner>`, `secret_not_granted`,
//! `record_expired`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use warden::{ReadStatus, WriteRequest, WriteStatus};
use warden_core::bundle::ClassName;
use warden_core::decision::Decision;
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::RecordClass;
use warden_core::time::Timestamp;
use warden_store::Store;

use super::PathParams;
use crate::auth::AgentCaller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::quota::{QUOTA_MAX_BYTES, QUOTA_MAX_RECORDS};
use crate::state::AppState;
use crate::wire::{
    DeleteMemoryQuery, MemoryDeletedResponse, MemoryValueResponse, MemoryWrittenResponse,
    PutMemoryRequest, Reply,
};

/// The error for a write or delete that did not go through (its decision
/// was recorded).
pub(crate) fn write_refused(
    status: WriteStatus,
    d: &Decision,
    current_revision: Option<u64>,
) -> ApiError {
    match status {
        WriteStatus::NotFound => ApiError::not_found(),
        WriteStatus::Conflict => ApiError::new(
            StatusCode::CONFLICT,
            "revision_conflict",
            "the record is not at the expected revision; nothing changed",
        )
        .with_details(json!({"current_revision": current_revision})),
        WriteStatus::InvalidRecord => ApiError::invalid(
            "invalid_record",
            format!("the record would be invalid: {}", d.reason),
        )
        .with_details(json!({"reason": d.reason.as_str()})),
        WriteStatus::OverQuota { limit, used, .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            d.reason.kind().to_owned(),
            format!("the write would exceed the agent's quota ({})", d.reason),
        )
        .with_details(json!({"limit": limit, "used": used})),
        WriteStatus::Done | WriteStatus::Denied => denied(d),
    }
}

/// 403 with the decision's reason as the code.
fn denied(d: &Decision) -> ApiError {
    let kind = d.reason.kind();
    ApiError::forbidden(kind.to_owned(), format!("denied: {kind}"))
        .with_details(json!({"reason": kind}))
}

fn path_key(path: &PathParams) -> ApiResult<(Namespace, Key)> {
    Ok((
        path.ident("namespace", Namespace::parse)?,
        path.ident("key", Key::parse)?,
    ))
}

/// `GET /v1/memory/{namespace}/{key}` (agent).
pub(crate) async fn read<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
) -> ApiResult<Reply<MemoryValueResponse>> {
    let (ns, key) = path_key(&path)?;
    let out = st.engine().read(&me, &ns, &key).await?;
    match (out.status, out.value) {
        (ReadStatus::Found, Some(v)) => Ok(Reply(
            StatusCode::OK,
            MemoryValueResponse::new(ns, key, v, out.decision.reason.to_string()),
        )),
        (ReadStatus::Hidden, _) => Err(ApiError::not_found()),
        _ => Err(denied(&out.decision)),
    }
}

/// The record class a write asks for, checked for consistency.
fn requested_class(req: &PutMemoryRequest) -> ApiResult<Option<RecordClass>> {
    let stray = |field: &str, class: &str| {
        Err(ApiError::invalid(
            "invalid_value",
            format!("`{field}` applies only to class `{class}`"),
        )
        .with_details(json!({"field": field})))
    };
    let class = req.class;
    if req.combine.is_some() && class != Some(ClassName::Policy) {
        return stray("combine", "policy");
    }
    if req.grants.is_some() && class != Some(ClassName::Secret) {
        return stray("grants", "secret");
    }
    if req.expires_at.is_some() && class != Some(ClassName::Task) {
        return stray("expires_at", "task");
    }
    Ok(match class {
        None => None,
        Some(ClassName::Preference) => Some(RecordClass::Preference),
        Some(ClassName::Policy) => {
            let Some(combine) = req.combine else {
                return Err(ApiError::invalid(
                    "missing_field",
                    "a `policy` record needs `combine` (all, any, min, max, intersection)",
                )
                .with_details(json!({"field": "combine"})));
            };
            Some(RecordClass::Policy { combine })
        }
        Some(ClassName::Secret) => Some(RecordClass::Secret {
            grants: req.grants.clone().unwrap_or_default(),
        }),
        Some(ClassName::Task) => Some(RecordClass::Task {
            expires_at: req.expires_at.map(Timestamp),
        }),
    })
}

fn encoded_len(v: &Value) -> u64 {
    serde_json::to_vec(v).map_or(u64::MAX, |b| b.len() as u64)
}

/// Check `max_records` / `max_bytes` before a write of `value` at
/// `namespace.key` in `agent`'s own scope. Call with the agent's writer
/// lock held.
pub(crate) async fn check_storage_quota<S: Store>(
    st: &AppState<S>,
    agent: &AgentId,
    namespace: &Namespace,
    key: &Key,
    value_len: u64,
) -> ApiResult<()> {
    let Some(quota) = st.engine().policy().quota_for(agent) else {
        return Ok(());
    };
    if quota.max_records.is_none() && quota.max_bytes.is_none() {
        return Ok(());
    }
    let store = st.engine().store();
    let usage = store.owner_usage(agent.clone()).await?;
    let existing = store
        .get_records(namespace.clone(), key.clone(), vec![agent.clone()])
        .await?;
    let old_len = existing.first().map(|r| encoded_len(&r.value));
    let resource = format!("{agent}:{namespace}.{key}");
    let caller = warden::Caller::Agent(agent.clone());
    let refuse = |reason: &'static str, limit: u64, used: u64| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            reason,
            format!("the write would exceed the agent's quota ({reason})"),
        )
        .with_details(json!({"limit": limit, "used": used}))
    };
    if let (None, Some(max)) = (old_len, quota.max_records)
        && usage.records.saturating_add(1) > max
    {
        let err = refuse(QUOTA_MAX_RECORDS, max, usage.records);
        return Err(
            match st
                .engine()
                .record_refusal(
                    &caller,
                    warden::ops::MEMORY_WRITE,
                    resource,
                    warden::engine_reasons::QUOTA_MAX_RECORDS,
                )
                .await
            {
                Ok(_) => err,
                Err(e) => e.into(),
            },
        );
    }
    let old = old_len.unwrap_or(0);
    if let Some(max) = quota.max_bytes
        && value_len > old
        && usage.bytes.saturating_sub(old).saturating_add(value_len) > max
    {
        let err = refuse(QUOTA_MAX_BYTES, max, usage.bytes);
        return Err(
            match st
                .engine()
                .record_refusal(
                    &caller,
                    warden::ops::MEMORY_WRITE,
                    resource,
                    warden::engine_reasons::QUOTA_MAX_BYTES,
                )
                .await
            {
                Ok(_) => err,
                Err(e) => e.into(),
            },
        );
    }
    Ok(())
}

/// Whether `agent` holds `action` (a pure lookup, not recorded).
pub(crate) fn holds<S: Store>(st: &AppState<S>, agent: &AgentId, action: &str) -> ApiResult<bool> {
    Ok(st.engine().check_capability(agent, action)?.permits())
}

/// `PUT /v1/memory/{namespace}/{key}` (agent).
pub(crate) async fn write<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    JsonBody(req): JsonBody<PutMemoryRequest>,
) -> ApiResult<Reply<MemoryWrittenResponse>> {
    let (ns, key) = path_key(&path)?;
    let max = st.config().limits.max_value_bytes;
    let value_len = encoded_len(&req.value);
    if value_len > max as u64 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "value_too_large",
            format!("the value encodes to more than {max} bytes"),
        )
        .with_details(json!({"field": "value", "max_bytes": max})));
    }
    let class = requested_class(&req)?;
    let own_scope = req.owner_agent_id.as_ref().is_none_or(|o| o == &me);
    // Quotas apply to writes that would otherwise go ahead.
    let _guard = if own_scope && holds(&st, &me, warden::ops::MEMORY_WRITE)? {
        let lock = st.shared.quotas.writer(&me);
        let guard = lock.lock_owned().await;
        check_storage_quota(&st, &me, &ns, &key, value_len).await?;
        Some(guard)
    } else {
        None
    };
    let out = st
        .engine()
        .write(
            &me,
            WriteRequest {
                namespace: ns,
                key,
                value: req.value,
                owner_agent_id: req.owner_agent_id,
                expected_revision: req.expected_revision,
                visibility: req.visibility,
                class,
            },
        )
        .await?;
    match &out.record {
        Some(r) if out.decision.permits() => {
            let status = if r.revision == 1 {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(Reply(status, r.into()))
        }
        _ => Err(write_refused(
            out.status,
            &out.decision,
            out.current_revision,
        )),
    }
}

/// `DELETE /v1/memory/{namespace}/{key}?expected_revision=N` (agent).
pub(crate) async fn delete<S: Store>(
    State(st): State<AppState<S>>,
    AgentCaller(me): AgentCaller,
    path: PathParams,
    query: Result<Query<DeleteMemoryQuery>, QueryRejection>,
) -> ApiResult<Reply<MemoryDeletedResponse>> {
    let (ns, key) = path_key(&path)?;
    let Query(query) = query.map_err(|e| invalid_query(&e))?;
    let out = st
        .engine()
        .delete(&me, None, ns.clone(), key.clone(), query.expected_revision)
        .await?;
    match out.revision {
        Some(revision) if out.decision.permits() => Ok(Reply(
            StatusCode::OK,
            MemoryDeletedResponse {
                namespace: ns,
                key,
                owner_agent_id: me,
                revision,
            },
        )),
        _ => Err(write_refused(
            out.status,
            &out.decision,
            out.current_revision,
        )),
    }
}

/// 400 `invalid_query`.
pub(crate) fn invalid_query(e: &QueryRejection) -> ApiError {
    ApiError::bad_request(
        "invalid_query",
        format!("invalid query string: {}", e.body_text()),
    )
}
