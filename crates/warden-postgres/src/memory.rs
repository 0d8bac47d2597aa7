//! Memory records: the put decision in the database, deletes, usage and the storage quota.

use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, Delete, DeleteOutcome, PutAuditFn, PutOutcome, StorageQuota, StoreError, Usage,
    decide_put,
};

use tokio_postgres::types::ToSql;

use crate::codec::{ClassColumns, class_in, json_in, record_out, u64_in, u64_out};
use crate::pool::{Stmt, Tx};

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
    let read = if quota.is_unlimited() {
        let row = tx
            .query(sql::SELECT_RECORD, &[&owner, &namespace, &key])
            .await?;
        Read::unlimited(row)
    } else {
        // The lock is taken before anything is read (the three are
        // pipelined, and run in order): the owner's other quota-checked
        // writes (on any server) wait until this commits.
        let [_, usage, current] = tx
            .query3(
                (sql::QUOTA_LOCK, &[&QUOTA_LOCK_RECORDS, &owner]),
                (sql::OWNER_USAGE, &[&owner]),
                (sql::SELECT_RECORD, &[&owner, &namespace, &key]),
            )
            .await?;
        Read::limited(usage, current)
    };
    let (outcome, write) = decide(put, now, quota, read)?;
    let Some(write) = write else {
        return Ok(Some(outcome));
    };
    let changed = tx.execute(write.sql(), &write.params()).await?;
    if changed == 1 {
        return Ok(Some(outcome));
    }
    lost_race(tx, put).await
}

/// The rows a put is decided on: the owner's usage (when its quota is
/// limited) and the record at its key.
struct Read {
    usage: Option<Vec<tokio_postgres::Row>>,
    current: Vec<tokio_postgres::Row>,
}

impl Read {
    fn unlimited(current: Vec<tokio_postgres::Row>) -> Self {
        Self {
            usage: None,
            current,
        }
    }

    fn limited(usage: Vec<tokio_postgres::Row>, current: Vec<tokio_postgres::Row>) -> Self {
        Self {
            usage: Some(usage),
            current,
        }
    }
}

/// Decide `put` on what was read: the outcome and, when it writes, the
/// conditional statement that makes it.
fn decide<'p>(
    put: &'p Put,
    now: Timestamp,
    quota: StorageQuota,
    read: Read,
) -> Result<(PutOutcome, Option<RowWrite<'p>>), StoreError> {
    let Read { usage, mut current } = read;
    if current.len() > 1 {
        return Err(StoreError::corrupt(format!(
            "{} records stored at one key",
            current.len()
        )));
    }
    let usage = match usage {
        Some(rows) => usage_out(&rows)?,
        None => Usage::default(),
    };
    let current = match current.pop() {
        Some(row) => Some(record_out(&row)?),
        None => None,
    };
    let outcome = decide_put(current.as_ref(), put, now, quota, usage);
    let write = match &outcome {
        PutOutcome::Written { record, .. } => {
            Some(RowWrite::new(put, record, current.as_ref(), now)?)
        }
        _ => None,
    };
    Ok((outcome, write))
}

/// The row change of a written put, ready to bind: an insert when there
/// was no record, else an update conditional on the revision read.
/// Its key is the put's.
pub(crate) struct RowWrite<'p> {
    key: [&'p str; 3],
    value: String,
    visibility: &'static str,
    class: ClassColumns,
    now: i64,
    /// The revision an update expects; `None` for an insert.
    expected: Option<i64>,
}

impl<'p> RowWrite<'p> {
    fn new(
        put: &'p Put,
        record: &MemoryRecord,
        current: Option<&MemoryRecord>,
        now: Timestamp,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            key: record_key(&put.owner, &put.namespace, &put.key),
            value: json_in(&record.value)?,
            visibility: record.visibility.as_str(),
            class: class_in(&record.class),
            now: now.0,
            expected: current
                .map(|c| u64_in(c.revision, "revision"))
                .transpose()?,
        })
    }

    fn sql(&self) -> &'static str {
        match self.expected {
            None => sql::INSERT_RECORD,
            Some(_) => sql::UPDATE_RECORD,
        }
    }

    /// The statement that must change one row, or fail
    /// ([`sql::INSERT_RECORD_ONE`], [`sql::UPDATE_RECORD_ONE`]).
    pub(crate) fn sql_one(&self) -> &'static str {
        match self.expected {
            None => sql::INSERT_RECORD_ONE,
            Some(_) => sql::UPDATE_RECORD_ONE,
        }
    }

    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let [owner, namespace, key] = &self.key;
        let mut p: Vec<&(dyn ToSql + Sync)> = vec![
            owner,
            namespace,
            key,
            &self.value,
            &self.visibility,
            &self.class.class,
            &self.class.combine,
            &self.class.grants,
            &self.class.expires_at,
            &self.now,
        ];
        if let Some(expected) = &self.expected {
            p.push(expected);
        }
        p
    }
}

/// A put whose conditional statement changed no row: another writer
/// committed first. For a compare-and-set on a revision that is a
/// conflict, decided here against the revision now stored; a create-only
/// put that lost the race to create is a conflict too. An unconditional
/// put is decided again (`None`) against the new row.
async fn lost_race(tx: &mut Tx<'_>, put: &Put) -> Result<Option<PutOutcome>, StoreError> {
    let [owner, namespace, key] = record_key(&put.owner, &put.namespace, &put.key);
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

/// A put queued for a writer. A writer runs a run of consecutive puts of
/// distinct owners together ([`put_many`]); any other put alone
/// ([`PutJob::run_alone`]).
pub(crate) struct PutJob {
    pub(crate) put: Put,
    pub(crate) now: Timestamp,
    pub(crate) quota: StorageQuota,
}

impl PutJob {
    /// The owner: the writer's route, and what makes puts independent
    /// (no two puts of one run share an owner, so none reads a row or a
    /// usage another writes).
    pub(crate) fn owner(&self) -> &str {
        self.put.owner.as_str()
    }

    /// Decide and write the put on its own, deciding again after each
    /// lost race (each statement sees what committed before it).
    pub(crate) async fn run_alone(&self, tx: &mut Tx<'_>) -> Result<PutOutcome, StoreError> {
        for _ in 0..PUT_ATTEMPTS {
            if let Some(outcome) = put_in(tx, &self.put, self.now, self.quota).await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::backend(format!(
            "the write to `{}.{}` lost {PUT_ATTEMPTS} races with concurrent writers",
            self.put.namespace, self.put.key
        )))
    }
}

/// What [`put_many`] decided for one put.
pub(crate) enum Batched {
    /// Final: written, or refused having changed nothing.
    Decided(PutOutcome),
    /// Its conditional statement lost a race: decide it again alone.
    Again,
    /// It cannot be decided (a corrupt row, a value that cannot be
    /// encoded); it changed nothing.
    Failed(StoreError),
}

/// Decide the puts of `jobs` (distinct owners) together: every read in
/// one round trip (with the savepoint [`Tx::savepoint`] left pending),
/// then every row change in another, where one at a time costs two round
/// trips each. Within a put its statements run in order, as in
/// [`put_in`] (the owner's quota lock before its usage is read).
///
/// `Err` when a statement failed: the transaction is then aborted back to
/// that savepoint, and the caller rolls back to it and runs the puts
/// alone. `Ok` when every statement ran: one answer per job, in order.
pub(crate) async fn put_many(
    tx: &mut Tx<'_>,
    jobs: &[&PutJob],
) -> Result<Vec<Batched>, StoreError> {
    let keys: Vec<[&str; 3]> = jobs
        .iter()
        .map(|j| record_key(&j.put.owner, &j.put.namespace, &j.put.key))
        .collect();
    let mut reads: Vec<Stmt<'_>> = Vec::new();
    for (job, key) in jobs.iter().zip(&keys) {
        push_reads(&mut reads, job, key);
    }
    let mut rows = tx.pipeline(&reads).await?.into_iter();
    let mut decided = Vec::with_capacity(jobs.len());
    let mut writes: Vec<(usize, RowWrite)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        match decide_read(job, &mut rows)? {
            Ok((outcome, write)) => {
                if let Some(write) = write {
                    writes.push((i, write));
                }
                decided.push(Batched::Decided(outcome));
            }
            Err(e) => decided.push(Batched::Failed(e)),
        }
    }
    if writes.is_empty() {
        return Ok(decided);
    }
    let statements: Vec<(&'static str, Vec<&(dyn ToSql + Sync)>)> =
        writes.iter().map(|(_, w)| (w.sql(), w.params())).collect();
    let changed = tx.pipeline_execute(&statements).await?;
    for ((i, _), n) in writes.iter().zip(changed) {
        if let (true, Some(slot)) = (n != 1, decided.get_mut(*i)) {
            *slot = Batched::Again;
        }
    }
    Ok(decided)
}

/// Push the statements that read what `job` is decided on, in the order
/// [`decide_read`] takes their answers: the owner's quota lock (taken
/// before anything is read) and usage when its quota is limited, then the
/// record at `key`, the put's own.
pub(crate) fn push_reads<'a>(out: &mut Vec<Stmt<'a>>, job: &PutJob, key: &'a [&'a str; 3]) {
    let [owner, namespace, key] = key;
    if !job.quota.is_unlimited() {
        out.push((sql::QUOTA_LOCK, vec![&QUOTA_LOCK_RECORDS, owner]));
        out.push((sql::OWNER_USAGE, vec![owner]));
    }
    out.push((sql::SELECT_RECORD, vec![owner, namespace, key]));
}

/// Decide `job` on the answers to its reads ([`push_reads`]), taken from
/// `rows`: `Err` when an answer is missing, else the put's own decision
/// (its error when it cannot be decided).
#[allow(clippy::type_complexity)]
pub(crate) fn decide_read<'p>(
    job: &'p PutJob,
    rows: &mut impl Iterator<Item = Vec<tokio_postgres::Row>>,
) -> Result<Result<(PutOutcome, Option<RowWrite<'p>>), StoreError>, StoreError> {
    let read = if job.quota.is_unlimited() {
        Read::unlimited(next_rows(rows)?)
    } else {
        let _lock = next_rows(rows)?;
        let usage = next_rows(rows)?;
        Read::limited(usage, next_rows(rows)?)
    };
    Ok(decide(&job.put, job.now, job.quota, read))
}

fn next_rows(
    rows: &mut impl Iterator<Item = Vec<tokio_postgres::Row>>,
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    rows.next()
        .ok_or_else(|| StoreError::backend("a pipelined read of a put went unanswered"))
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
    store.inner.record_reads.get(namespace, key, owners).await
}

pub(crate) async fn put_record(
    store: &PgStore,
    put: Put,
    now: Timestamp,
    quota: StorageQuota,
    audit: PutAuditFn,
) -> Result<PutOutcome, StoreError> {
    store
        .inner
        .writers
        .put(PutJob { put, now, quota }, audit)
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
