//! Tool-call sessions inside the writer's transaction: creation with the
//! session's first envelope version and the import check, the
//! compare-and-set update with its call upsert and index part, and reading
//! back. A session's source index is kept in parts (`session_index`, one
//! per revision that wrote one): a recorded result appends its delta, so
//! neither a decision nor a result rewrites the whole index.
//!
//! Every mutating function runs in the writer's group transaction (and the
//! command's savepoint), so an outcome commits together with the audit
//! entries its `AuditFn` returns, or not at all. The single writer holds
//! SQLite's write lock, so the decisions below (an existing session, the
//! earlier imports of an envelope) cannot change under them; the
//! compare-and-set is still one conditional `UPDATE`, and the schema's keys
//! and triggers enforce the same rules once more.

use rusqlite::{Connection, OptionalExtension, Row, params};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::ids::{AgentId, CallId, SessionId};
use warden_store::{
    AuditFn, CallRecord, CreateSession, Entity, EnvelopeImport, IndexChange, PutEnvelope,
    SessionHead, SessionRecord, SessionState, SessionUpdate, StoreError, UpdateSession,
    check_create, decide_import, missing_envelope, seq_taken,
};

use crate::codec::{self, canonical_text};
use crate::context;
use crate::error::{SqlResultExt, corrupt, duplicate_or};
use crate::writer::Tx;

/// A number that SQLite's signed integer must hold.
fn to_sql(n: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::backend(format!("{what} {n} is too large to store")))
}

/// Columns [`session_from_row`] reads, in order.
const SESSION_COLUMNS: &str = "session_id, agent, revision, created_at, record";

/// A session row; the record must agree with the columns that repeat it.
fn session_from_row(row: &Row<'_>) -> Result<SessionRecord, StoreError> {
    let id: String = codec::column(row, 0, &"session row")?;
    let what = format!("session `{id}`");
    let agent: String = codec::column(row, 1, &what)?;
    let revision: i64 = codec::column(row, 2, &what)?;
    let created_at: i64 = codec::column(row, 3, &what)?;
    let text: String = codec::column(row, 4, &what)?;
    let record: SessionRecord = codec::from_json(&what, &text)?;
    if record.session_id.as_str() != id
        || record.agent.as_str() != agent
        || i64::try_from(record.revision).ok() != Some(revision)
        || record.created_at.0 != created_at
    {
        return Err(corrupt(what, "the record does not match its columns"));
    }
    Ok(record)
}

/// A session row and its source index (`None`: left out, see [`load_row`]).
type SessionRow = (SessionRecord, Option<Vec<u8>>);

/// The session row and its source index, if stored; the index is `None`
/// when the stored revision is `known_revision` (its parts are not read).
fn load_row(
    conn: &Connection,
    session_id: &SessionId,
    known_revision: Option<u64>,
) -> Result<Option<SessionRow>, StoreError> {
    let found = conn
        .prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?1"
        ))
        .store()?
        .query_row(params![session_id.as_str()], |row| {
            Ok(session_from_row(row))
        })
        .optional()
        .store()?;
    let Some(session) = found else {
        return Ok(None);
    };
    let session = session?;
    if known_revision == Some(session.revision) {
        return Ok(Some((session, None)));
    }
    Ok(Some((session, Some(load_index(conn, session_id)?))))
}

/// A session's source index: its parts' bytes in revision order (at least
/// one part: the create writes it).
fn load_index(conn: &Connection, session_id: &SessionId) -> Result<Vec<u8>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT bytes FROM session_index WHERE session_id = ?1 ORDER BY revision")
        .store()?;
    let mut rows = stmt.query([session_id.as_str()]).store()?;
    let mut sources = Vec::new();
    let mut parts = 0usize;
    while let Some(row) = rows.next().store()? {
        let part = row
            .get_ref(0)
            .store()?
            .as_blob()
            .map_err(|e| corrupt(format!("session `{session_id}`"), e))?;
        sources.extend_from_slice(part);
        parts += 1;
    }
    if parts == 0 {
        return Err(corrupt(
            format!("session `{session_id}`"),
            "its source index is missing",
        ));
    }
    Ok(sources)
}

/// Store one part of a session's index, written at `revision`.
fn put_index_part(
    conn: &Connection,
    session_id: &SessionId,
    revision: u64,
    bytes: &[u8],
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO session_index (session_id, revision, bytes) VALUES (?1, ?2, ?3)",
    )
    .store()?
    .execute(params![
        session_id.as_str(),
        to_sql(revision, "session revision")?,
        bytes
    ])
    .store()?;
    Ok(())
}

/// A call row of `call_id, seq, record`; the record must agree with the
/// columns that repeat it.
fn call_from_row(session_id: &SessionId, row: &Row<'_>) -> Result<CallRecord, StoreError> {
    let call_id: String = codec::column(row, 0, &format!("session `{session_id}`"))?;
    let what = format!("call `{session_id}/{call_id}`");
    let seq: i64 = codec::column(row, 1, &what)?;
    let text: String = codec::column(row, 2, &what)?;
    let call: CallRecord = codec::from_json(&what, &text)?;
    if call.call_id.as_str() != call_id || i64::try_from(call.seq).ok() != Some(seq) {
        return Err(corrupt(what, "the record does not match its columns"));
    }
    Ok(call)
}

/// A session with its source index and calls (by `seq`), if stored.
pub(crate) fn load_session(
    conn: &Connection,
    session_id: &SessionId,
) -> Result<Option<SessionState>, StoreError> {
    let Some((session, Some(sources))) = load_row(conn, session_id, None)? else {
        return Ok(None);
    };
    let mut stmt = conn
        .prepare_cached(
            "SELECT call_id, seq, record FROM session_calls WHERE session_id = ?1 \
             ORDER BY seq, call_id",
        )
        .store()?;
    let mut rows = stmt.query([session_id.as_str()]).store()?;
    let mut calls = Vec::new();
    while let Some(row) = rows.next().store()? {
        calls.push(call_from_row(session_id, row)?);
    }
    Ok(Some(SessionState {
        session,
        sources,
        calls,
    }))
}

/// A session's row, source index, number of calls and the call `call_id`
/// (by its primary key), if stored, the index left out when the stored
/// revision is `known_revision`; call it inside one read transaction.
pub(crate) fn load_head(
    conn: &Connection,
    session_id: &SessionId,
    call_id: Option<&CallId>,
    known_revision: Option<u64>,
) -> Result<Option<SessionHead>, StoreError> {
    let Some((session, sources)) = load_row(conn, session_id, known_revision)? else {
        return Ok(None);
    };
    let what = format!("session `{session_id}`");
    let count: i64 = conn
        .prepare_cached("SELECT count(*) FROM session_calls WHERE session_id = ?1")
        .store()?
        .query_row([session_id.as_str()], |r| r.get(0))
        .store()?;
    let calls = codec::to_u64(&what, count)?;
    let call = match call_id {
        None => None,
        Some(call_id) => conn
            .prepare_cached(
                "SELECT call_id, seq, record FROM session_calls \
                 WHERE session_id = ?1 AND call_id = ?2",
            )
            .store()?
            .query_row(params![session_id.as_str(), call_id.as_str()], |row| {
                Ok(call_from_row(session_id, row))
            })
            .optional()
            .store()?
            .transpose()?,
    };
    Ok(Some(SessionHead {
        session,
        sources,
        calls,
        call,
    }))
}

/// Insert `call` or replace the stored call with its `call_id`; a `seq`
/// another call of the session holds is refused ([`seq_taken`]; the
/// unique index on `(session_id, seq)` holds the same rule).
fn upsert_call(
    conn: &Connection,
    session_id: &SessionId,
    call: &CallRecord,
) -> Result<(), StoreError> {
    let seq = to_sql(call.seq, "call position")?;
    let holder: Option<String> = conn
        .prepare_cached("SELECT call_id FROM session_calls WHERE session_id = ?1 AND seq = ?2")
        .store()?
        .query_row(params![session_id.as_str(), seq], |r| r.get(0))
        .optional()
        .store()?;
    if holder.is_some_and(|h| h != call.call_id.as_str()) {
        return Err(seq_taken(session_id, call.seq));
    }
    conn.prepare_cached(
        "INSERT INTO session_calls (session_id, call_id, seq, record) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (session_id, call_id) DO UPDATE SET seq = excluded.seq, \
         record = excluded.record",
    )
    .store()?
    .execute(params![
        session_id.as_str(),
        call.call_id.as_str(),
        seq,
        canonical_text(call)?,
    ])
    .map_err(|e| duplicate_or(e, Entity::Call, &format!("{session_id}/#{}", call.seq)))?;
    Ok(())
}

/// Every earlier import of `import`'s `(issuer, envelope_id)`.
fn earlier_imports(
    conn: &Connection,
    import: &EnvelopeImport,
) -> Result<Vec<EnvelopeImport>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT version, record FROM envelope_imports WHERE issuer = ?1 AND envelope_id = ?2",
        )
        .store()?;
    let mut rows = stmt
        .query(params![import.issuer, import.envelope_id.as_str()])
        .store()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().store()? {
        let version: i64 = codec::column(row, 0, &"envelope import")?;
        let what = format!(
            "import of envelope `{}` version {version}",
            import.envelope_id
        );
        let text: String = codec::column(row, 1, &what)?;
        let earlier: EnvelopeImport = codec::from_json(&what, &text)?;
        if earlier.issuer != import.issuer
            || earlier.envelope_id != import.envelope_id
            || i64::try_from(earlier.version).ok() != Some(version)
        {
            return Err(corrupt(what, "the record does not match its key"));
        }
        out.push(earlier);
    }
    Ok(out)
}

/// Whether any version of the envelope `envelope_id` is stored.
fn envelope_exists(conn: &Connection, envelope_id: &EnvelopeId) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM envelopes WHERE envelope_id = ?1 LIMIT 1")
        .store()?
        .query_row([envelope_id.as_str()], |_| Ok(()))
        .optional()
        .store()?
        .is_some())
}

/// Decide and apply a create; see `Store::create_session`.
fn decide_create(
    conn: &Connection,
    state: &SessionState,
    envelope: Option<&EnvelopeRecord>,
    import: Option<&EnvelopeImport>,
) -> Result<CreateSession, StoreError> {
    check_create(state, envelope)?;
    let session = &state.session;
    if let Some(existing) = load_session(conn, &session.session_id)? {
        return Ok(CreateSession::Existing(Box::new(existing)));
    }
    if let Some(e) = envelope
        && envelope_exists(conn, &e.envelope_id)?
    {
        return Err(StoreError::duplicate(Entity::Envelope, &e.envelope_id));
    }
    if envelope.is_none()
        && let Some(named) = &session.envelope_id
        && !envelope_exists(conn, named)?
    {
        return Err(missing_envelope(named));
    }
    if let Some(import) = import
        && let Err(refusal) = decide_import(import, &earlier_imports(conn, import)?)
    {
        return Ok(CreateSession::ImportRefused(refusal));
    }
    // Decided: store everything. A failure from here on fails the command,
    // whose savepoint takes every row with it.
    conn.prepare_cached(
        "INSERT INTO sessions (session_id, pos, agent, revision, created_at, record) \
         SELECT ?1, coalesce(max(pos), 0) + 1, ?2, ?3, ?4, ?5 FROM sessions",
    )
    .store()?
    .execute(params![
        session.session_id.as_str(),
        session.agent.as_str(),
        to_sql(session.revision, "session revision")?,
        session.created_at.0,
        canonical_text(session)?,
    ])
    .map_err(|e| duplicate_or(e, Entity::Session, session.session_id.as_str()))?;
    put_index_part(conn, &session.session_id, session.revision, &state.sources)?;
    for call in &state.calls {
        upsert_call(conn, &session.session_id, call)?;
    }
    if let Some(e) = envelope
        && let PutEnvelope::Conflict { .. } = context::put_envelope_in(conn, e, None)?
    {
        return Err(StoreError::duplicate(Entity::Envelope, &e.envelope_id));
    }
    if let Some(import) = import {
        conn.prepare_cached(
            "INSERT INTO envelope_imports (issuer, envelope_id, version, record) \
             VALUES (?1, ?2, ?3, ?4)",
        )
        .store()?
        .execute(params![
            import.issuer,
            import.envelope_id.as_str(),
            to_sql(import.version, "envelope version")?,
            canonical_text(import)?,
        ])
        .map_err(|e| {
            duplicate_or(
                e,
                Entity::Envelope,
                &format!("{}@{}", import.envelope_id, import.version),
            )
        })?;
    }
    Ok(CreateSession::Created)
}

pub(crate) fn create_session_in(
    tx: &mut Tx<'_>,
    state: SessionState,
    envelope: Option<EnvelopeRecord>,
    import: Option<EnvelopeImport>,
    audit: AuditFn<CreateSession>,
) -> Result<CreateSession, StoreError> {
    let outcome = decide_create(tx.conn(), &state, envelope.as_ref(), import.as_ref())?;
    tx.append(audit(&outcome))?;
    Ok(outcome)
}

/// The stored revision of a session.
fn revision(conn: &Connection, session_id: &SessionId) -> Result<Option<u64>, StoreError> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT revision FROM sessions WHERE session_id = ?1")
        .store()?
        .query_row([session_id.as_str()], |r| r.get(0))
        .optional()
        .store()?;
    found
        .map(|v| codec::to_u64(format!("session `{session_id}`"), v))
        .transpose()
}

/// Apply `update` if the stored revision is `expected` and the new one is
/// `expected + 1`: the compare-and-set is one conditional `UPDATE`.
fn decide_update(
    conn: &Connection,
    update: &SessionUpdate,
    expected: u64,
) -> Result<UpdateSession, StoreError> {
    let session = &update.session;
    let id = &session.session_id;
    let conflict = |conn: &Connection| -> Result<UpdateSession, StoreError> {
        Ok(UpdateSession::Conflict {
            current: revision(conn, id)?,
        })
    };
    // A revision SQLite cannot hold is never stored, so never matches.
    let (Ok(expected_sql), Ok(new)) = (i64::try_from(expected), i64::try_from(session.revision))
    else {
        return conflict(conn);
    };
    if expected.checked_add(1) != Some(session.revision) {
        return conflict(conn);
    }
    let changed = conn
        .prepare_cached(
            "UPDATE sessions SET agent = ?2, revision = ?3, created_at = ?4, record = ?5 \
             WHERE session_id = ?1 AND revision = ?6",
        )
        .store()?
        .execute(params![
            id.as_str(),
            session.agent.as_str(),
            new,
            session.created_at.0,
            canonical_text(session)?,
            expected_sql,
        ])
        .store()?;
    if changed != 1 {
        return conflict(conn);
    }
    if let Some(call) = &update.call {
        upsert_call(conn, id, call)?;
    }
    // A failure from here fails the command, whose savepoint takes the row
    // and the call with it.
    match &update.sources {
        None => {}
        Some(IndexChange::Append(bytes)) if bytes.is_empty() => {}
        Some(IndexChange::Append(bytes)) => put_index_part(conn, id, session.revision, bytes)?,
        Some(IndexChange::Replace(bytes)) => {
            conn.prepare_cached("DELETE FROM session_index WHERE session_id = ?1")
                .store()?
                .execute([id.as_str()])
                .store()?;
            put_index_part(conn, id, session.revision, bytes)?;
        }
    }
    Ok(UpdateSession::Updated)
}

pub(crate) fn update_session_in(
    tx: &mut Tx<'_>,
    update: SessionUpdate,
    expected: u64,
    audit: AuditFn<UpdateSession>,
) -> Result<UpdateSession, StoreError> {
    let outcome = decide_update(tx.conn(), &update, expected)?;
    tx.append(audit(&outcome))?;
    Ok(outcome)
}

/// Up to `limit` sessions (of `agent`, or all), in creation order.
pub(crate) fn list_sessions_in(
    conn: &Connection,
    agent: Option<&AgentId>,
    limit: usize,
) -> Result<Vec<SessionRecord>, StoreError> {
    // SQLite reads a negative limit as "no limit"; anything above i64::MAX
    // is no limit either.
    let limit = i64::try_from(limit).unwrap_or(-1);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE ?1 IS NULL OR agent = ?1 \
             ORDER BY pos LIMIT ?2"
        ))
        .store()?;
    let mut rows = stmt
        .query(params![agent.map(AgentId::as_str), limit])
        .store()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().store()? {
        out.push(session_from_row(row)?);
    }
    Ok(out)
}
