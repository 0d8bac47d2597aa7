//! The audit log: appends, pages and the head.

use warden_core::audit::{AuditDraft, AuditEntry, ChainHead};
use warden_store::{Store, StoreError};

use crate::codec::audit_out;

use crate::sql;
use crate::store::PgStore;
use crate::tx::*;

pub(crate) async fn append_audit(
    store: &PgStore,
    drafts: Vec<AuditDraft>,
) -> Result<ChainHead, StoreError> {
    if drafts.is_empty() {
        return store.audit_head().await;
    }
    store.inner.writers.append(drafts).await
}

pub(crate) async fn audit_page(
    store: &PgStore,
    after: u64,
    limit: usize,
) -> Result<Vec<AuditEntry>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let Ok(after) = i64::try_from(after) else {
        return Ok(Vec::new());
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    store
        .read(sql::AUDIT_PAGE, &[&after, &limit], audit_out)
        .await
}

pub(crate) async fn audit_head(store: &PgStore) -> Result<ChainHead, StoreError> {
    store
        .read(sql::HEAD, &[], head_out)
        .await?
        .into_iter()
        .next()
        .ok_or_else(missing_head)
}
