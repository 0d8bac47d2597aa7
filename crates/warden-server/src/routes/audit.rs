//! The decision log: paging and verification (operator).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use warden_core::audit::ChainVerifier;
use warden_store::Store;

use super::memory::invalid_query;
use crate::auth::OperatorCaller;
use crate::error::ApiResult;
use crate::state::AppState;
use crate::wire::{AuditEntryBody, AuditPageResponse, AuditQuery, Reply, VerifyResponse};

/// Default page size.
const DEFAULT_PAGE: usize = 100;
/// Entries read per step while verifying.
const VERIFY_BATCH: usize = 10_000;

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
    let entries = st
        .engine()
        .store()
        .audit_page(q.after.unwrap_or(0), limit)
        .await?;
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
    let store = st.engine().store();
    let head = store.audit_head().await?;
    let mut verifier = ChainVerifier::new();
    let mut after = 0;
    loop {
        let batch = store.audit_page(after, VERIFY_BATCH).await?;
        for entry in &batch {
            if let Err(e) = verifier.push(entry) {
                let so_far = verifier.finish();
                return Ok(Reply(
                    StatusCode::OK,
                    VerifyResponse {
                        valid: false,
                        count: so_far.count,
                        head_seq: so_far.seq,
                        head_hash: so_far.hash.to_hex(),
                        first_bad_seq: Some(e.seq()),
                        problem: Some(e.to_string()),
                    },
                ));
            }
        }
        match batch.last() {
            Some(last) if batch.len() == VERIFY_BATCH => after = last.seq,
            _ => break,
        }
    }
    let so_far = verifier.clone().finish();
    Ok(Reply(
        StatusCode::OK,
        match verifier.finish_against(head.seq, &head.hash) {
            Ok(h) => VerifyResponse {
                valid: true,
                count: h.count,
                head_seq: h.seq,
                head_hash: h.hash.to_hex(),
                first_bad_seq: None,
                problem: None,
            },
            Err(e) => VerifyResponse {
                valid: false,
                count: so_far.count,
                head_seq: so_far.seq,
                head_hash: so_far.hash.to_hex(),
                first_bad_seq: Some(e.seq()),
                problem: Some(e.to_string()),
            },
        },
    ))
}
