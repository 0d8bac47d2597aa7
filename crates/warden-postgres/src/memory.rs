//! Memory records: the put decision in the database, deletes, usage and the storage quota.

use std::collections::HashMap;

use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, Delete, DeleteOutcome, PutOutcome, StorageQuota, StoreError, Usage, decide_put,
};

use crate::codec::{class_in, json_in, record_out, u64_in, u64_out};
use crate::pool::Tx;

use crate::sql;
use crate::store::PgStore;
use crate::tx::*;
use crate::writer::{Done, Route};

/// Decide a put inside `tx`. The outcome is final in this transaction:
/// a `Written` outcome's row change is made, a conflict or rejection
/// changed nothing. `None` means a concurrent writer changed the row
/// between the read and the conditional statement and the put must be
/// decided again.
pub(crate) async fn put_in(
    tx: &mut Tx<'_>,
    put: &Put,
    now: Timestamp,
    quota: StorageQuota,
) -> Result<Option<PutOutcome>, StoreError> {
    let [owner, namespace, key] = record_key(&put.owner, &put.namespace, &put.key);
    let (usage, current) = if quota.is_unlimited() {
        let row = tx
            .query_opt(sql::SELECT_RECORD, &[&owner, &namespace, &key])
            .await?;
        (Usage::default(), row)
    } else {
        // The lock is taken before anything is read (the three are
        // pipelined, and run in order): the owner's other quota-checked
        // writes (on any server) wait until this commits.
        let [_, usage, mut current] = tx
            .query3(
                (sql::QUOTA_LOCK, &[&QUOTA_LOCK_RECORDS, &owner]),
                (sql::OWNER_USAGE, &[&owner]),
                (sql::SELECT_RECORD, &[&owner, &namespace, &key]),
            )
            .await?;
        if current.len() > 1 {
            return Err(StoreError::corrupt(format!(
                "{} records stored at one key",
                current.len()
            )));
        }
        (usage_out(&usage)?, current.pop())
    };
    let current = match current {
        Some(row) => Some(record_out(&row)?),
        None => None,
    };
    let outcome = decide_put(current.as_ref(), put, now, quota, usage);
    let PutOutcome::Written { record, .. } = &outcome else {
        return Ok(Some(outcome));
    };
    let value = json_in(&record.value)?;
    let class = class_in(&record.class);
    let visibility = record.visibility.as_str();
    let changed = match &current {
        None => {
            tx.execute(
                sql::INSERT_RECORD,
                &[
                    &owner,
                    &namespace,
                    &key,
                    &value,
                    &visibility,
                    &class.class,
                    &class.combine,
                    &class.grants,
                    &class.expires_at,
                    &now.0,
                ],
            )
            .await?
        }
        Some(c) => {
            let expected = u64_in(c.revision, "revision")?;
            tx.execute(
                sql::UPDATE_RECORD,
                &[
                    &owner,
                    &namespace,
                    &key,
                    &value,
                    &visibility,
                    &class.class,
                    &class.combine,
                    &class.grants,
                    &class.expires_at,
                    &now.0,
                    &expected,
                ],
            )
            .await?
        }
    };
    if changed == 1 {
        return Ok(Some(outcome));
    }
    // Zero rows: another writer committed first. For a compare-and-set
    // on a revision that is a conflict, decided here against the
    // revision now stored; a create-only put that lost the race to
    // create is a conflict too. An unconditional put is decided again
    // against the new row.
    match put.expected_revision {
        Some(_) => {
            let current = tx
                .query_opt(sql::SELECT_REVISION, &[&owner, &namespace, &key])
                .await?
                .map(|row| {
                    let rev: i64 = row.try_get(0).map_err(crate::error::column)?;
                    u64_out(rev, "revision")
                })
                .transpose()?;
            match (current, put.expected_revision) {
                // The record vanished and the put may create it:
                // decide again.
                (None, Some(0)) => Ok(None),
                _ => Ok(Some(PutOutcome::Conflict { current })),
            }
        }
        None => Ok(None),
    }
}

/// First key of the advisory lock of quota-checked memory writes ("WQmr").
pub(crate) const QUOTA_LOCK_RECORDS: i32 = 0x5751_6d72;
/// First key of the advisory lock of limited run creation ("WQrn").
pub(crate) const QUOTA_LOCK_RUNS: i32 = 0x5751_726e;

/// The single row of [`sql::OWNER_USAGE`].
pub(crate) fn usage_out(rows: &[tokio_postgres::Row]) -> Result<Usage, StoreError> {
    let Some(row) = rows.first() else {
        return Ok(Usage::default());
    };
    let records: i64 = row.try_get(0).map_err(crate::error::column)?;
    let bytes: i64 = row.try_get(1).map_err(crate::error::column)?;
    Ok(Usage {
        records: u64_out(records, "record count")?,
        bytes: u64_out(bytes, "byte count")?,
    })
}

pub(crate) async fn get_records(
    store: &PgStore,
    namespace: Namespace,
    key: Key,
    owners: Vec<AgentId>,
) -> Result<Vec<MemoryRecord>, StoreError> {
    if owners.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = owners.iter().map(AgentId::as_str).collect();
    let found = store
        .read(
            sql::GET_RECORDS,
            &[&namespace.as_str(), &key.as_str(), &names],
            record_out,
        )
        .await?;
    // In the order of `owners`, as the resolver walks the lineage.
    let by_owner: HashMap<AgentId, MemoryRecord> =
        found.into_iter().map(|r| (r.owner.clone(), r)).collect();
    Ok(owners
        .iter()
        .filter_map(|owner| by_owner.get(owner).cloned())
        .collect())
}

pub(crate) async fn put_record(
    store: &PgStore,
    put: Put,
    now: Timestamp,
    quota: StorageQuota,
    audit: AuditFn<PutOutcome>,
) -> Result<PutOutcome, StoreError> {
    let route = put.owner.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                for _ in 0..PUT_ATTEMPTS {
                    // A lost race changed nothing: decide again (each
                    // statement sees what committed before it).
                    if let Some(outcome) = put_in(tx, &put, now, quota).await? {
                        let drafts = audit(&outcome);
                        return Ok(Done::new(outcome, drafts, None));
                    }
                }
                Err(StoreError::backend(format!(
                    "the write to `{}.{}` lost {PUT_ATTEMPTS} races with concurrent writers",
                    put.namespace, put.key
                )))
            })
        })
        .await
}

pub(crate) async fn delete_record(
    store: &PgStore,
    delete: Delete,
    audit: AuditFn<DeleteOutcome>,
) -> Result<DeleteOutcome, StoreError> {
    let route = delete.owner.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                let [owner, namespace, key] =
                    record_key(&delete.owner, &delete.namespace, &delete.key);
                let deleted = match delete.expected_revision {
                    None => {
                        tx.query_opt(sql::DELETE_RECORD, &[&owner, &namespace, &key])
                            .await?
                    }
                    Some(expected) => {
                        let expected = u64_in(expected, "revision")?;
                        tx.query_opt(
                            sql::DELETE_RECORD_AT,
                            &[&owner, &namespace, &key, &expected],
                        )
                        .await?
                    }
                };
                let revision_of = |row: tokio_postgres::Row| -> Result<u64, StoreError> {
                    let rev: i64 = row.try_get(0).map_err(crate::error::column)?;
                    u64_out(rev, "revision")
                };
                let outcome = match deleted {
                    Some(row) => DeleteOutcome::Deleted {
                        revision: revision_of(row)?,
                    },
                    None => match tx
                        .query_opt(sql::SELECT_REVISION, &[&owner, &namespace, &key])
                        .await?
                    {
                        None => DeleteOutcome::NotFound,
                        Some(row) => DeleteOutcome::Conflict {
                            current: revision_of(row)?,
                        },
                    },
                };
                let drafts = audit(&outcome);
                Ok(Done::new(outcome, drafts, None))
            })
        })
        .await
}

pub(crate) async fn owner_usage(store: &PgStore, owner: AgentId) -> Result<Usage, StoreError> {
    let mut conn = store.inner.pool.get().await?;
    usage_out(&conn.query(sql::OWNER_USAGE, &[&owner.as_str()]).await?)
}
