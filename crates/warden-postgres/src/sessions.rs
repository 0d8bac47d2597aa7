//! Tool-call sessions: creation with the first envelope version and the
//! import check in one transaction, the compare-and-set update with its
//! call upsert, and reading back.
//!
//! Concurrency across servers:
//!
//! - **Create** inserts the session row with `ON CONFLICT DO NOTHING`: of
//!   creators of one id, exactly one inserts; the others wait for it to
//!   commit, insert nothing, and decide again (finding it: `Existing`).
//! - **Imports** of one `(issuer, envelope_id)` are serialised by a
//!   transaction-scoped advisory lock taken before the earlier imports are
//!   read, so of two servers importing one envelope version at once, the
//!   second reads the first's note after it commits: exactly one creates.
//! - **Update** is one conditional statement, `UPDATE sessions ... WHERE
//!   session_id = $1 AND revision = $expected`: a concurrent updater waits
//!   for the row and re-checks the revision against what committed (READ
//!   COMMITTED), so of updaters expecting one revision exactly one writes.
//!   The source index is kept in parts (`session_index`, one per revision
//!   that wrote one, read back in revision order): the update that records
//!   a result inserts its delta as the new revision's part, so neither a
//!   decision nor a result rewrites the whole index.

use warden_core::envelope::EnvelopeRecord;
use warden_core::ids::{AgentId, CallId, SessionId};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CallRecord, CreateSession, Entity, EnvelopeImport, IndexChange, SessionHead,
    SessionRecord, SessionState, SessionUpdate, StoreError, UpdateSession, check_create,
    decide_import, missing_envelope, seq_taken,
};

use crate::codec::{self, corrupt, text_in, u64_in, u64_out};
use crate::pool::Tx;
use crate::sql;
use crate::store::PgStore;
use crate::tx::PUT_ATTEMPTS;
use crate::writer::{Done, Route};

/// First key of the advisory lock that serialises the imports of one
/// envelope ("WImp").
const IMPORT_LOCK: i32 = 0x5749_6d70;

/// A record as the exact text serde_json writes.
fn json_text<T: serde::Serialize>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::backend(format!("cannot encode {what}: {e}")))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("{what} is invalid: {e}")))
}

/// A row of `session_id, agent, revision, created_at, record`; the record
/// must agree with the columns that repeat it.
fn session_out(row: &tokio_postgres::Row) -> Result<SessionRecord, StoreError> {
    let col = crate::error::column;
    let id: &str = row.try_get(0).map_err(col)?;
    let agent: &str = row.try_get(1).map_err(col)?;
    let revision: i64 = row.try_get(2).map_err(col)?;
    let created_at: i64 = row.try_get(3).map_err(col)?;
    let text: &str = row.try_get(4).map_err(col)?;
    let what = format!("session `{id}`");
    let record: SessionRecord = from_json(text, &what)?;
    if record.session_id.as_str() != id
        || record.agent.as_str() != agent
        || u64::try_from(revision).ok() != Some(record.revision)
        || record.created_at != Timestamp(created_at)
    {
        return Err(corrupt(format!(
            "{what}: the record does not match its columns"
        )));
    }
    Ok(record)
}

fn call_out(session: &str, row: &tokio_postgres::Row) -> Result<CallRecord, StoreError> {
    let col = crate::error::column;
    let call_id: &str = row.try_get(0).map_err(col)?;
    let seq: i64 = row.try_get(1).map_err(col)?;
    let text: &str = row.try_get(2).map_err(col)?;
    let what = format!("call `{session}/{call_id}`");
    let call: CallRecord = from_json(text, &what)?;
    if call.call_id.as_str() != call_id || u64::try_from(seq).ok() != Some(call.seq) {
        return Err(corrupt(format!(
            "{what}: the record does not match its columns"
        )));
    }
    Ok(call)
}

/// The session `id` with its calls, read in `tx` with `select` (one of
/// [`sql::GET_SESSION`], [`sql::LOCK_SESSION`]).
async fn load_in(
    tx: &mut Tx<'_>,
    id: &str,
    select: &'static str,
) -> Result<Option<SessionState>, StoreError> {
    let Some(row) = tx.query_opt(select, &[&id]).await? else {
        return Ok(None);
    };
    let session = session_out(&row)?;
    let sources: Option<Vec<u8>> = row.try_get(5).map_err(crate::error::column)?;
    let sources =
        sources.ok_or_else(|| corrupt(format!("session `{id}`: its source index is missing")))?;
    let calls = tx
        .query(sql::SESSION_CALLS, &[&id])
        .await?
        .iter()
        .map(|r| call_out(id, r))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(SessionState {
        session,
        sources,
        calls,
    }))
}

/// An import note's key and text, as stored.
struct ImportRow<'a> {
    issuer: String,
    envelope_id: &'a str,
    version: i64,
    record: String,
}

impl<'a> ImportRow<'a> {
    fn of(import: &'a EnvelopeImport) -> Result<Self, StoreError> {
        Ok(Self {
            issuer: text_in(&import.issuer).into_owned(),
            envelope_id: import.envelope_id.as_str(),
            version: u64_in(import.version, "envelope version")?,
            record: json_text(import, "an envelope import")?,
        })
    }
}

fn import_out(
    row: &tokio_postgres::Row,
    import: &EnvelopeImport,
) -> Result<EnvelopeImport, StoreError> {
    let col = crate::error::column;
    let version: i64 = row.try_get(0).map_err(col)?;
    let text: &str = row.try_get(1).map_err(col)?;
    let what = format!(
        "the import of envelope `{}` version {version}",
        import.envelope_id
    );
    let earlier: EnvelopeImport = from_json(text, &what)?;
    if earlier.issuer != import.issuer
        || earlier.envelope_id != import.envelope_id
        || u64::try_from(version).ok() != Some(earlier.version)
    {
        return Err(corrupt(format!(
            "{what}: the record does not match its key"
        )));
    }
    Ok(earlier)
}

/// A call's key, position and text, as stored.
fn call_in(call: &CallRecord) -> Result<(&str, i64, String), StoreError> {
    Ok((
        call.call_id.as_str(),
        u64_in(call.seq, "call position")?,
        json_text(call, "a call")?,
    ))
}

pub(crate) async fn create_session(
    store: &PgStore,
    state: SessionState,
    envelope: Option<EnvelopeRecord>,
    import: Option<EnvelopeImport>,
    audit: AuditFn<CreateSession>,
) -> Result<CreateSession, StoreError> {
    let route = state.session.session_id.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                check_create(&state, envelope.as_ref())?;
                let session = &state.session;
                let id = session.session_id.as_str();
                let agent = session.agent.as_str();
                let revision = u64_in(session.revision, "session revision")?;
                let record = json_text(session, "a session")?;
                let calls = state
                    .calls
                    .iter()
                    .map(call_in)
                    .collect::<Result<Vec<_>, _>>()?;
                let env = envelope
                    .as_ref()
                    .map(|e| {
                        Ok::<_, StoreError>((
                            e.envelope_id.as_str(),
                            u64_in(e.version, "envelope version")?,
                            codec::envelope_in(e)?,
                        ))
                    })
                    .transpose()?;
                let note = import.as_ref().map(ImportRow::of).transpose()?;
                for _ in 0..PUT_ATTEMPTS {
                    // An attempt that loses a race after writing is undone alone.
                    tx.simple("SAVEPOINT attempt").await?;
                    if let Some(n) = &note {
                        // Taken before anything is read: other imports of this
                        // envelope (on any server) wait until this commits.
                        tx.query(sql::IMPORT_LOCK, &[&IMPORT_LOCK, &n.issuer, &n.envelope_id])
                            .await?;
                    }
                    let outcome = if let Some(existing) = load_in(tx, id, sql::LOCK_SESSION).await?
                    {
                        CreateSession::Existing(Box::new(existing))
                    } else {
                        if let Some((envelope_id, ..)) = &env
                            && tx
                                .query_opt(sql::ENVELOPE_EXISTS, &[envelope_id])
                                .await?
                                .is_some()
                        {
                            return Err(StoreError::duplicate(Entity::Envelope, envelope_id));
                        }
                        if env.is_none()
                            && let Some(named) = &session.envelope_id
                            && tx
                                .query_opt(sql::ENVELOPE_EXISTS, &[&named.as_str()])
                                .await?
                                .is_none()
                        {
                            return Err(missing_envelope(named));
                        }
                        let refusal = match (&import, &note) {
                            (Some(import), Some(n)) => {
                                let earlier = tx
                                    .query(sql::EARLIER_IMPORTS, &[&n.issuer, &n.envelope_id])
                                    .await?
                                    .iter()
                                    .map(|r| import_out(r, import))
                                    .collect::<Result<Vec<_>, _>>()?;
                                decide_import(import, &earlier).err()
                            }
                            _ => None,
                        };
                        match refusal {
                            Some(refusal) => CreateSession::ImportRefused(refusal),
                            None => {
                                let inserted = tx
                                    .execute(
                                        sql::INSERT_SESSION,
                                        &[&id, &agent, &revision, &session.created_at.0, &record],
                                    )
                                    .await?;
                                if inserted == 0 {
                                    // A concurrent creator of this id committed after
                                    // the read above: decide again.
                                    continue;
                                }
                                tx.execute(
                                    sql::INSERT_INDEX_PART,
                                    &[&id, &revision, &state.sources],
                                )
                                .await?;
                                for (call_id, seq, text) in &calls {
                                    upsert_call(tx, &session.session_id, call_id, *seq, text)
                                        .await?;
                                }
                                if let Some((envelope_id, version, text)) = &env {
                                    let created = tx
                                        .execute(sql::CREATE_ENVELOPE_HEAD, &[envelope_id, version])
                                        .await?;
                                    if created == 0 {
                                        return Err(StoreError::duplicate(
                                            Entity::Envelope,
                                            envelope_id,
                                        ));
                                    }
                                    tx.execute(sql::INSERT_ENVELOPE, &[envelope_id, version, text])
                                        .await?;
                                }
                                if let Some(n) = &note {
                                    let noted = tx
                                        .execute(
                                            sql::INSERT_IMPORT,
                                            &[&n.issuer, &n.envelope_id, &n.version, &n.record],
                                        )
                                        .await?;
                                    if noted == 0 {
                                        // Cannot happen under the import lock; if it
                                        // did, deciding again finds the replay.
                                        tx.simple("ROLLBACK TO SAVEPOINT attempt").await?;
                                        continue;
                                    }
                                }
                                CreateSession::Created
                            }
                        }
                    };
                    let drafts = audit(&outcome);
                    return Ok(Done::new(outcome, drafts, None));
                }
                Err(StoreError::backend(format!(
                    "the session `{id}` lost {PUT_ATTEMPTS} races with concurrent creators"
                )))
            })
        })
        .await
}

pub(crate) async fn get_session(
    store: &PgStore,
    session_id: SessionId,
) -> Result<Option<SessionState>, StoreError> {
    let mut conn = store.inner.pool.get().await?;
    // The row and its calls from one snapshot.
    let mut tx = conn.conn()?.snapshot().await?;
    let state = load_in(&mut tx, session_id.as_str(), sql::GET_SESSION).await?;
    tx.commit().await?;
    Ok(state)
}

pub(crate) async fn get_session_head(
    store: &PgStore,
    session_id: SessionId,
    call_id: Option<CallId>,
    known_revision: Option<u64>,
) -> Result<Option<SessionHead>, StoreError> {
    let id = session_id.as_str();
    // A revision PostgreSQL cannot hold is never stored, so never matches.
    let known = known_revision.and_then(|r| i64::try_from(r).ok());
    let mut conn = store.inner.pool.get().await?;
    // The row, the count and the call from one snapshot.
    let mut tx = conn.conn()?.snapshot().await?;
    let Some(row) = tx.query_opt(sql::GET_SESSION_HEAD, &[&id, &known]).await? else {
        tx.commit().await?;
        return Ok(None);
    };
    let session = session_out(&row)?;
    let sources: Option<Vec<u8>> = row.try_get(5).map_err(crate::error::column)?;
    if sources.is_none() != (known_revision == Some(session.revision)) {
        return Err(corrupt(format!(
            "session `{id}`: its source index is missing"
        )));
    }
    let count: i64 = tx
        .query_opt(sql::SESSION_CALL_COUNT, &[&id])
        .await?
        .ok_or_else(|| corrupt(format!("session `{id}`: no count of its calls")))?
        .try_get(0)
        .map_err(crate::error::column)?;
    let calls = u64_out(count, "session call count")?;
    let call = match &call_id {
        None => None,
        Some(call_id) => tx
            .query_opt(sql::SESSION_CALL, &[&id, &call_id.as_str()])
            .await?
            .map(|r| call_out(id, &r))
            .transpose()?,
    };
    tx.commit().await?;
    Ok(Some(SessionHead {
        session,
        sources,
        calls,
        call,
    }))
}

async fn current_revision(tx: &mut Tx<'_>, id: &str) -> Result<Option<u64>, StoreError> {
    tx.query_opt(sql::SESSION_REVISION, &[&id])
        .await?
        .map(|row| {
            let v: i64 = row.try_get(0).map_err(crate::error::column)?;
            u64_out(v, "session revision")
        })
        .transpose()
}

pub(crate) async fn update_session(
    store: &PgStore,
    update: SessionUpdate,
    expected_revision: u64,
    audit: AuditFn<UpdateSession>,
) -> Result<UpdateSession, StoreError> {
    let route = update.session.session_id.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                let session = &update.session;
                let id = session.session_id.as_str();
                let agent = session.agent.as_str();
                // A revision PostgreSQL cannot hold is never stored, so never matches;
                // neither does a new revision other than the expected one plus one.
                let revisions = match (
                    i64::try_from(expected_revision),
                    i64::try_from(session.revision),
                ) {
                    (Ok(expected), Ok(new))
                        if expected_revision.checked_add(1) == Some(session.revision) =>
                    {
                        Some((expected, new))
                    }
                    _ => None,
                };
                let record = json_text(session, "a session")?;
                let call = update.call.as_ref().map(call_in).transpose()?;
                let changed = match revisions {
                    Some((expected, new)) => {
                        tx.execute(
                            sql::UPDATE_SESSION,
                            &[&id, &agent, &new, &session.created_at.0, &record, &expected],
                        )
                        .await?
                    }
                    None => 0,
                };
                let outcome = if changed == 1 {
                    if let Some((call_id, seq, text)) = &call {
                        // The row is locked by the update above: no other change of
                        // this session can take the position between check and write.
                        upsert_call(tx, &session.session_id, call_id, *seq, text).await?;
                    }
                    if let Some((_, new)) = revisions {
                        match &update.sources {
                            None => {}
                            Some(IndexChange::Append(bytes)) if bytes.is_empty() => {}
                            Some(IndexChange::Append(bytes)) => {
                                tx.execute(sql::INSERT_INDEX_PART, &[&id, &new, bytes])
                                    .await?;
                            }
                            Some(IndexChange::Replace(bytes)) => {
                                tx.execute(sql::DELETE_INDEX_PARTS, &[&id]).await?;
                                tx.execute(sql::INSERT_INDEX_PART, &[&id, &new, bytes])
                                    .await?;
                            }
                        }
                    }
                    UpdateSession::Updated
                } else {
                    UpdateSession::Conflict {
                        current: current_revision(tx, id).await?,
                    }
                };
                let drafts = audit(&outcome);
                Ok(Done::new(outcome, drafts, None))
            })
        })
        .await
}

/// Insert the call `call_id` or replace the stored one; a `seq` another
/// call of the session holds is refused ([`seq_taken`]; the unique index
/// on `(session_id, seq)` holds the same rule).
async fn upsert_call(
    tx: &mut Tx<'_>,
    session_id: &SessionId,
    call_id: &str,
    seq: i64,
    text: &str,
) -> Result<(), StoreError> {
    let id = session_id.as_str();
    if let Some(row) = tx.query_opt(sql::CALL_AT_SEQ, &[&id, &seq]).await? {
        let holder: &str = row.try_get(0).map_err(crate::error::column)?;
        if holder != call_id {
            return Err(seq_taken(session_id, u64_out(seq, "call position")?));
        }
    }
    tx.execute(sql::UPSERT_CALL, &[&id, &call_id, &seq, &text])
        .await?;
    Ok(())
}

pub(crate) async fn list_sessions(
    store: &PgStore,
    agent: Option<AgentId>,
    limit: usize,
) -> Result<Vec<SessionRecord>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let agent = agent.as_ref().map(AgentId::as_str);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    store
        .read(sql::LIST_SESSIONS, &[&agent, &limit], session_out)
        .await
}
