//! Memory records inside the writer's transaction: the put decision with
//! its storage quota, deletes and usage.

use rusqlite::{Connection, OptionalExtension, params};
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    Delete, DeleteOutcome, PutOutcome, StorageQuota, StoreError, Usage, decide_put,
};

use crate::codec::{self, seq_to_sql};
use crate::error::SqlResultExt;
use crate::writer::Tx;

pub(crate) fn select_record(
    conn: &Connection,
    owner: &AgentId,
    namespace: &Namespace,
    key: &Key,
) -> Result<Option<MemoryRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {} FROM memory WHERE owner = ?1 AND namespace = ?2 AND key = ?3",
            codec::MEMORY_COLUMNS
        ))
        .store()?;
    let mut rows = stmt
        .query(params![owner.as_str(), namespace.as_str(), key.as_str()])
        .store()?;
    match rows.next().store()? {
        Some(row) => Ok(Some(codec::record_from_row(row)?)),
        None => Ok(None),
    }
}

pub(crate) fn write_record(
    conn: &Connection,
    record: &MemoryRecord,
    expected: Option<u64>,
) -> Result<bool, StoreError> {
    let class = codec::class_to_sql(&record.class)?;
    let value = codec::json_text(&record.value)?;
    let revision = seq_to_sql(record.revision)?;
    let changed = match expected {
        None => conn
            .prepare_cached(
                "INSERT INTO memory (owner, namespace, key, value, visibility, class, combine, \
                 grants, expires_at, revision, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
                 ON CONFLICT (owner, namespace, key) DO NOTHING",
            )
            .store()?
            .execute(params![
                record.owner.as_str(),
                record.namespace.as_str(),
                record.key.as_str(),
                value,
                record.visibility.as_str(),
                class.class,
                class.combine,
                class.grants,
                class.expires_at,
                revision,
                record.created_at.0,
                record.updated_at.0,
            ])
            .store()?,
        // The lab document's conditional update: zero rows is a conflict.
        Some(current) => conn
            .prepare_cached(
                "UPDATE memory SET value = ?4, visibility = ?5, class = ?6, combine = ?7, \
                 grants = ?8, expires_at = ?9, revision = ?10, updated_at = ?11 \
                 WHERE owner = ?1 AND namespace = ?2 AND key = ?3 AND revision = ?12",
            )
            .store()?
            .execute(params![
                record.owner.as_str(),
                record.namespace.as_str(),
                record.key.as_str(),
                value,
                record.visibility.as_str(),
                class.class,
                class.combine,
                class.grants,
                class.expires_at,
                revision,
                record.updated_at.0,
                seq_to_sql(current)?,
            ])
            .store()?,
    };
    Ok(changed == 1)
}

/// What `owner` holds, read in the caller's transaction.
pub(crate) fn usage_in(conn: &Connection, owner: &AgentId) -> Result<Usage, StoreError> {
    let (records, bytes): (i64, i64) = conn
        .prepare_cached(
            "SELECT count(*), coalesce(sum(length(CAST(value AS BLOB))), 0) \
             FROM memory WHERE owner = ?1",
        )
        .store()?
        .query_row([owner.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .store()?;
    Ok(Usage {
        records: codec::to_u64("usage", records)?,
        bytes: codec::to_u64("usage", bytes)?,
    })
}

/// Decide and make a put in the writer's transaction: the current row and
/// the owner's usage are read under the write lock, so the quota is exact.
pub(crate) fn put_in(
    tx: &mut Tx<'_>,
    put: Put,
    now: Timestamp,
    quota: StorageQuota,
) -> Result<PutOutcome, StoreError> {
    let conn = tx.conn();
    let current = select_record(conn, &put.owner, &put.namespace, &put.key)?;
    let usage = if quota.is_unlimited() {
        Usage::default()
    } else {
        usage_in(conn, &put.owner)?
    };
    let mut outcome = decide_put(current.as_ref(), &put, now, quota, usage);
    if let PutOutcome::Written { record, .. } = &outcome {
        let expected = current.as_ref().map(|c| c.revision);
        if !write_record(conn, record, expected)? {
            // Unreachable with one writer holding the write lock; kept so
            // a lost race can never be reported as a write.
            let now_current = select_record(conn, &put.owner, &put.namespace, &put.key)?;
            outcome = PutOutcome::Conflict {
                current: now_current.map(|r| r.revision),
            };
        }
    }
    Ok(outcome)
}

pub(crate) fn delete_in(conn: &Connection, delete: &Delete) -> Result<DeleteOutcome, StoreError> {
    let current: Option<i64> = conn
        .prepare_cached(
            "SELECT revision FROM memory WHERE owner = ?1 AND namespace = ?2 AND key = ?3",
        )
        .store()?
        .query_row(
            params![
                delete.owner.as_str(),
                delete.namespace.as_str(),
                delete.key.as_str()
            ],
            |r| r.get(0),
        )
        .optional()
        .store()?;
    let Some(current) = current else {
        return Ok(DeleteOutcome::NotFound);
    };
    let current = codec::to_u64("memory revision", current)?;
    if delete.expected_revision.is_some_and(|e| e != current) {
        return Ok(DeleteOutcome::Conflict { current });
    }
    let changed = conn
        .prepare_cached(
            "DELETE FROM memory WHERE owner = ?1 AND namespace = ?2 AND key = ?3 AND revision = ?4",
        )
        .store()?
        .execute(params![
            delete.owner.as_str(),
            delete.namespace.as_str(),
            delete.key.as_str(),
            seq_to_sql(current)?
        ])
        .store()?;
    Ok(if changed == 1 {
        DeleteOutcome::Deleted { revision: current }
    } else {
        DeleteOutcome::Conflict { current }
    })
}
