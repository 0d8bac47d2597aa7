//! The decision log: paging and verification (operator).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use warden_store::Store;

use super::memory::invalid_query;
use crate::auth::OperatorCaller;
use crate::error::ApiResult;
use crate::state::AppState;
use crate::wire::{AuditEntryBody, AuditPageResponse, AuditQuery, Reply, VerifyResponse};

/// Default page size.
const DEFAULT_PAGE: usize = 100;

/// `GET /v1/audit?after=SEQ&limit=N` (operator). `limit` is clamped to
/// 1..=the server's maximum.
pub(crate) async fn page<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> ApiResult<Reply<AuditPageResponse>> {
    let Query(q) = query.map_err(|e| invalid_query(&e))?;
    let max = st.config().limits.max_audit_page.max(1);
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).clamp(1, max);
    let entries = st.engine().audit_page(q.after.unwrap_or(0), limit).await?;
    let next_after = if entries.len() == limit {
        entries.last().map(|e| e.seq)
    } else {
        None
    };
    Ok(Reply(
        StatusCode::OK,
        AuditPageResponse {
            entries: entries.iter().map(AuditEntryBody::from).collect(),
            next_after,
        },
    ))
}

/// `GET /v1/audit/verify` (operator): recompute the whole chain and check it
/// reaches the store's recorded head.
pub(crate) async fn verify<S: Store>(
    State(st): State<AppState<S>>,
    _: OperatorCaller,
) -> ApiResult<Reply<VerifyResponse>> {
    let report = st.engine().verify_audit().await?;
    let (first_bad_seq, problem) = match report.problem {
        Some(p) => (Some(p.seq), Some(p.message)),
        None => (None, None),
    };
    Ok(Reply(
        StatusCode::OK,
        VerifyResponse {
            valid: first_bad_seq.is_none(),
            count: report.head.count,
            head_seq: report.head.seq,
            head_hash: report.head.hash.to_hex(),
            first_bad_seq,
            problem,
        },
    ))
}
