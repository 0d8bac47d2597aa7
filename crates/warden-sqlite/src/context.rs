//! Context envelopes and the escalation queue: the SQL behind the
//! corresponding [`Store`](warden_store::Store) methods.
//!
//! The mutating functions run inside the writer's group transaction (and
//! the command's savepoint), so each outcome commits together with the
//! audit entries its `AuditFn` returns, or not at all. The checks below
//! that can only fail under a concurrent writer (which the single writer
//! holding SQLite's write lock rules out) are kept as defence in depth, so
//! a lost race could never be reported as a win; the schema's unique index
//! and triggers enforce the same rules once more.

use rusqlite::{Connection, OptionalExtension, Row, params};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::time::Timestamp;
use warden_store::{
    ConsumedEscalation, Entity, EscalationRecord, EscalationResolution, EscalationStatus,
    EscalationTarget, PutEnvelope, PutEscalation, ResolveEscalation, StoreError,
};

use crate::codec::{self, canonical_text};
use crate::error::{SqlResultExt, corrupt, duplicate_or};

// ----- envelopes -----

/// The latest stored version of an envelope.
fn latest_version(conn: &Connection, envelope_id: &EnvelopeId) -> Result<Option<u64>, StoreError> {
    let latest: Option<i64> = conn
        .prepare_cached("SELECT max(version) FROM envelopes WHERE envelope_id = ?1")
        .store()?
        .query_row([envelope_id.as_str()], |r| r.get(0))
        .store()?;
    latest
        .map(|v| codec::to_u64(format!("envelope `{envelope_id}`"), v))
        .transpose()
}

/// Store `record` as a new version if the latest stored version is
/// `expected` (`None`: no version is stored) and `record.version` is above
/// it; otherwise store nothing and report the latest version.
pub(crate) fn put_envelope_in(
    conn: &Connection,
    record: &EnvelopeRecord,
    expected: Option<u64>,
) -> Result<PutEnvelope, StoreError> {
    let conflict = |conn: &Connection| -> Result<PutEnvelope, StoreError> {
        Ok(PutEnvelope::Conflict {
            current: latest_version(conn, &record.envelope_id)?,
        })
    };
    // A version SQLite cannot hold is never stored, so never matches.
    let expected = match expected.map(i64::try_from) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => return conflict(conn),
    };
    let version = i64::try_from(record.version).map_err(|_| {
        StoreError::backend(format!(
            "envelope `{}`: version {} is too large to store",
            record.envelope_id, record.version
        ))
    })?;
    let text = canonical_text(record)?;
    // The compare-and-set is this one statement: the insert happens only
    // while the latest version is the expected one.
    let inserted = conn
        .prepare_cached(
            "INSERT INTO envelopes \
             (envelope_id, version, parent_envelope_id, workflow_id, agent_id, record) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6 \
             WHERE (SELECT max(version) FROM envelopes WHERE envelope_id = ?1) IS ?7 \
             AND ?2 > coalesce(?7, -1)",
        )
        .store()?
        .execute(params![
            record.envelope_id.as_str(),
            version,
            record.parent_envelope_id.as_ref().map(|p| p.as_str()),
            record.workflow_id.as_str(),
            record.agent_id.as_str(),
            text,
            expected,
        ])
        .store()?;
    if inserted == 1 {
        Ok(PutEnvelope::Written)
    } else {
        conflict(conn)
    }
}

/// One version of an envelope (`None`: the latest).
pub(crate) fn get_envelope_in(
    conn: &Connection,
    envelope_id: &EnvelopeId,
    version: Option<u64>,
) -> Result<Option<EnvelopeRecord>, StoreError> {
    let found: Option<(i64, String)> = match version {
        None => conn
            .prepare_cached(
                "SELECT version, record FROM envelopes WHERE envelope_id = ?1 \
                 ORDER BY version DESC LIMIT 1",
            )
            .store()?
            .query_row([envelope_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .store()?,
        Some(v) => {
            let Ok(v) = i64::try_from(v) else {
                return Ok(None);
            };
            conn.prepare_cached(
                "SELECT version, record FROM envelopes WHERE envelope_id = ?1 AND version = ?2",
            )
            .store()?
            .query_row(params![envelope_id.as_str(), v], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .store()?
        }
    };
    let Some((version, text)) = found else {
        return Ok(None);
    };
    let what = format!("envelope `{envelope_id}` version {version}");
    let record: EnvelopeRecord = codec::from_json(&what, &text)?;
    if &record.envelope_id != envelope_id || i64::try_from(record.version).ok() != Some(version) {
        return Err(corrupt(what, "the record does not match its key"));
    }
    Ok(Some(record))
}

// ----- escalations -----

/// Columns [`escalation_from_row`] reads, in order.
const ESCALATION_COLUMNS: &str = "escalation_id, status, record";

fn status_from_sql(s: &str) -> Option<EscalationStatus> {
    s.parse().ok()
}

fn escalation_from_row(row: &Row<'_>) -> Result<EscalationRecord, StoreError> {
    let id: String = codec::column(row, 0, &"escalation row")?;
    let what = format!("escalation `{id}`");
    let status: String = codec::column(row, 1, &what)?;
    let text: String = codec::column(row, 2, &what)?;
    let status = status_from_sql(&status)
        .ok_or_else(|| corrupt(&what, format!("unknown status `{status}`")))?;
    let record: EscalationRecord = codec::from_json(&what, &text)?;
    if record.escalation_id != id || record.status != status {
        return Err(corrupt(what, "the record does not match its columns"));
    }
    Ok(record)
}

/// The first escalation matching `filter` (a `WHERE` clause over `?1`).
fn select_escalation(
    conn: &Connection,
    filter: &str,
    arg: &str,
) -> Result<Option<EscalationRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {ESCALATION_COLUMNS} FROM escalations WHERE {filter} ORDER BY pos LIMIT 1"
        ))
        .store()?;
    let mut rows = stmt.query([arg]).store()?;
    match rows.next().store()? {
        Some(row) => Ok(Some(escalation_from_row(row)?)),
        None => Ok(None),
    }
}

/// One escalation by id.
pub(crate) fn get_escalation_in(
    conn: &Connection,
    escalation_id: &str,
) -> Result<Option<EscalationRecord>, StoreError> {
    select_escalation(conn, "escalation_id = ?1", escalation_id)
}

/// The open (pending or approved) escalation for a target.
fn open_for(conn: &Connection, target: &str) -> Result<Option<EscalationRecord>, StoreError> {
    select_escalation(
        conn,
        "target = ?1 AND status IN ('pending', 'approved')",
        target,
    )
}

/// Escalations with `status` (all when `None`), oldest first.
pub(crate) fn list_escalations_in(
    conn: &Connection,
    status: Option<EscalationStatus>,
) -> Result<Vec<EscalationRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {ESCALATION_COLUMNS} FROM escalations \
             WHERE ?1 IS NULL OR status = ?1 ORDER BY pos"
        ))
        .store()?;
    let mut rows = stmt.query([status.map(EscalationStatus::as_str)]).store()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().store()? {
        out.push(escalation_from_row(row)?);
    }
    Ok(out)
}

/// Store a new escalation unless its id exists (`Duplicate`) or an open
/// one holds its target (returned, nothing stored).
pub(crate) fn put_escalation_in(
    conn: &Connection,
    escalation: &EscalationRecord,
) -> Result<PutEscalation, StoreError> {
    let id = escalation.escalation_id.as_str();
    let taken = conn
        .prepare_cached("SELECT 1 FROM escalations WHERE escalation_id = ?1")
        .store()?
        .query_row([id], |_| Ok(()))
        .optional()
        .store()?
        .is_some();
    if taken {
        return Err(StoreError::duplicate(Entity::Escalation, id));
    }
    let target = canonical_text(&escalation.target)?;
    if let Some(open) = open_for(conn, &target)? {
        return Ok(PutEscalation::Existing(Box::new(open)));
    }
    conn.prepare_cached(
        "INSERT INTO escalations (escalation_id, target, status, created_at, record) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .store()?
    .execute(params![
        id,
        target,
        escalation.status.as_str(),
        escalation.created_at.0,
        canonical_text(escalation)?,
    ])
    .map_err(|e| duplicate_or(e, Entity::Escalation, id))?;
    Ok(PutEscalation::Created)
}

/// Move `record` (read with status `from`) to its new state, only if it
/// still has status `from`; whether it moved.
fn advance(
    conn: &Connection,
    record: &EscalationRecord,
    from: EscalationStatus,
) -> Result<bool, StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE escalations SET status = ?3, record = ?4 \
             WHERE escalation_id = ?1 AND status = ?2",
        )
        .store()?
        .execute(params![
            record.escalation_id,
            from.as_str(),
            record.status.as_str(),
            canonical_text(record)?,
        ])
        .store()?;
    Ok(changed == 1)
}

/// Approve or reject a pending escalation, exactly once.
pub(crate) fn resolve_escalation_in(
    conn: &Connection,
    escalation_id: &str,
    resolution: EscalationResolution,
    by: Subject,
    at: Timestamp,
) -> Result<ResolveEscalation, StoreError> {
    let Some(mut e) = get_escalation_in(conn, escalation_id)? else {
        return Ok(ResolveEscalation::NotFound);
    };
    if e.status != EscalationStatus::Pending {
        return Ok(ResolveEscalation::NotPending(Box::new(e)));
    }
    match resolution {
        EscalationResolution::Approve => e.status = EscalationStatus::Approved,
        EscalationResolution::Reject { reason } => {
            e.status = EscalationStatus::Rejected;
            e.rejection_reason = Some(reason);
        }
    }
    e.resolved_by = Some(by);
    e.resolved_at = Some(at);
    if advance(conn, &e, EscalationStatus::Pending)? {
        return Ok(ResolveEscalation::Resolved(Box::new(e)));
    }
    match get_escalation_in(conn, escalation_id)? {
        Some(now) => Ok(ResolveEscalation::NotPending(Box::new(now))),
        None => Ok(ResolveEscalation::NotFound),
    }
}

/// Consume the approved escalation for `target`, exactly once, and
/// withdraw the pending ones of its slot.
pub(crate) fn consume_escalation_in(
    conn: &Connection,
    target: &EscalationTarget,
    at: Timestamp,
) -> Result<Option<ConsumedEscalation>, StoreError> {
    let text = canonical_text(target)?;
    let Some(mut e) = select_escalation(conn, "target = ?1 AND status = 'approved'", &text)? else {
        return Ok(None);
    };
    e.status = EscalationStatus::Consumed;
    e.consumed_at = Some(at);
    if !advance(conn, &e, EscalationStatus::Approved)? {
        return Ok(None);
    }
    let mut withdrawn = Vec::new();
    for pending in list_escalations_in(conn, Some(EscalationStatus::Pending))? {
        if pending.target.same_slot(target) {
            let w = ConsumedEscalation::withdraw(&e, pending, at);
            if advance(conn, &w, EscalationStatus::Pending)? {
                withdrawn.push(w);
            }
        }
    }
    Ok(Some(ConsumedEscalation {
        escalation: e,
        withdrawn,
    }))
}
