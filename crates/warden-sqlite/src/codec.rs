//! Rows to values and back. Anything that does not decode is
//! [`StoreError::Corrupt`]: Warden never writes it, so the file was edited
//! or damaged.

use std::fmt::Display;

use rusqlite::Row;
use rusqlite::types::FromSql;
use serde::de::DeserializeOwned;
use serde_json::Value;
use warden_core::audit::{AuditDraft, AuditEntry, Digest, EntryRef};
use warden_core::canonical::to_canonical;
use warden_core::decision::Verdict;
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{AgentId, Key, Namespace, RunId, StepId};
use warden_core::memory::{Combinator, MemoryRecord, RecordClass, Visibility};
use warden_core::time::Timestamp;
use warden_store::{
    RunStep, StepOutcome, StepStatus, StoreError, StoredAgent, TokenRecord, TokenSubject,
};

use crate::error::corrupt;

/// A sequence number as SQLite's signed integer.
pub(crate) fn seq_to_sql(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::backend(format!("sequence number {n} is too large")))
}

/// A revision, count or sequence number read back.
pub(crate) fn to_u64(what: impl Display, n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| corrupt(what, format!("negative number {n}")))
}

/// Canonical JSON text of a value (sorted keys, no insignificant
/// whitespace): the form records and lookup keys are stored in, so equal
/// values are equal text.
pub(crate) fn canonical_text<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    let value = serde_json::to_value(v)
        .map_err(|e| StoreError::backend(format!("cannot encode json: {e}")))?;
    String::from_utf8(to_canonical(&value))
        .map_err(|e| StoreError::backend(format!("canonical json is not utf-8: {e}")))
}

/// An optional envelope id column.
pub(crate) fn envelope_id_col(
    row: &Row<'_>,
    i: usize,
    what: &impl Display,
) -> Result<Option<EnvelopeId>, StoreError> {
    let raw: Option<String> = col(row, i, what)?;
    raw.map(|e| ident(EnvelopeId::parse, &e, what)).transpose()
}

/// JSON text of a value.
pub(crate) fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::backend(format!("cannot encode json: {e}")))
}

fn parse_json<T: DeserializeOwned>(what: &impl Display, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

fn col<T: FromSql>(row: &Row<'_>, i: usize, what: &impl Display) -> Result<T, StoreError> {
    row.get(i).map_err(|e| corrupt(what, e))
}

fn digest(bytes: &[u8], what: &impl Display) -> Result<Digest, StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map(Digest)
        .map_err(|_| corrupt(what, "hash is not 32 bytes"))
}

fn ident<T>(
    parse: impl FnOnce(&str) -> Result<T, warden_core::ids::IdentifierError>,
    s: &str,
    what: &impl Display,
) -> Result<T, StoreError> {
    parse(s).map_err(|e| corrupt(what, e))
}

// ----- agents and tokens -----

/// Columns [`agent_from_row`] reads, in order.
pub(crate) const AGENT_COLUMNS: &str =
    "id, parent, capabilities, tools, config, status, created_at, envelope_id";

pub(crate) fn status_to_sql(s: AgentStatus) -> &'static str {
    s.as_str()
}

pub(crate) fn agent_from_row(row: &Row<'_>) -> Result<StoredAgent, StoreError> {
    let id: String = col(row, 0, &"agent row")?;
    let what = format!("agent `{id}`");
    let parent: Option<String> = col(row, 1, &what)?;
    let capabilities: String = col(row, 2, &what)?;
    let tools: String = col(row, 3, &what)?;
    let config: Option<String> = col(row, 4, &what)?;
    let status: String = col(row, 5, &what)?;
    let envelope_id = envelope_id_col(row, 7, &what)?;
    Ok(StoredAgent {
        id: ident(AgentId::parse, &id, &what)?,
        parent: parent
            .map(|p| ident(AgentId::parse, &p, &what))
            .transpose()?,
        capabilities: parse_json(&what, &capabilities)?,
        tools: parse_json(&what, &tools)?,
        config: config.map(|c| parse_json(&what, &c)).transpose()?,
        status: status
            .parse::<AgentStatus>()
            .map_err(|e| corrupt(&what, e))?,
        created_at: Timestamp(col(row, 6, &what)?),
        envelope_id,
    })
}

/// Columns [`token_from_row`] reads, in order.
pub(crate) const TOKEN_COLUMNS: &str =
    "token_id, hash, subject_kind, agent_id, created_at, revoked";

pub(crate) fn subject_to_sql(s: &TokenSubject) -> (&'static str, Option<&str>) {
    let agent = match s {
        TokenSubject::Operator => None,
        TokenSubject::Agent(id) => Some(id.as_str()),
    };
    (s.kind_str(), agent)
}

pub(crate) fn token_from_row(row: &Row<'_>) -> Result<TokenRecord, StoreError> {
    let token_id: String = col(row, 0, &"token row")?;
    let what = format!("token `{token_id}`");
    let hash: Vec<u8> = col(row, 1, &what)?;
    let kind: String = col(row, 2, &what)?;
    let agent: Option<String> = col(row, 3, &what)?;
    let subject = match (kind.as_str(), agent) {
        ("operator", None) => TokenSubject::Operator,
        ("agent", Some(a)) => TokenSubject::Agent(ident(AgentId::parse, &a, &what)?),
        _ => return Err(corrupt(what, "inconsistent subject")),
    };
    Ok(TokenRecord {
        hash: digest(&hash, &what)?,
        subject,
        created_at: Timestamp(col(row, 4, &what)?),
        revoked: col::<i64>(row, 5, &what)? != 0,
        token_id,
    })
}

// ----- memory -----

/// Columns [`record_from_row`] reads, in order.
pub(crate) const MEMORY_COLUMNS: &str = "owner, namespace, key, value, visibility, class, combine, grants, expires_at, revision, created_at, updated_at";

/// The class as the columns `class, combine, grants, expires_at`.
pub(crate) struct ClassColumns {
    pub class: &'static str,
    pub combine: Option<&'static str>,
    pub grants: Option<String>,
    pub expires_at: Option<i64>,
}

pub(crate) fn class_to_sql(class: &RecordClass) -> Result<ClassColumns, StoreError> {
    Ok(match class {
        RecordClass::Preference => ClassColumns {
            class: class.name(),
            combine: None,
            grants: None,
            expires_at: None,
        },
        RecordClass::Policy { combine } => ClassColumns {
            class: class.name(),
            combine: Some(combine.as_str()),
            grants: None,
            expires_at: None,
        },
        RecordClass::Secret { grants } => ClassColumns {
            class: class.name(),
            combine: None,
            grants: Some(json_text(grants)?),
            expires_at: None,
        },
        RecordClass::Task { expires_at } => ClassColumns {
            class: class.name(),
            combine: None,
            grants: None,
            expires_at: expires_at.map(|t| t.0),
        },
    })
}

pub(crate) fn record_from_row(row: &Row<'_>) -> Result<MemoryRecord, StoreError> {
    let owner: String = col(row, 0, &"memory row")?;
    let namespace: String = col(row, 1, &"memory row")?;
    let key: String = col(row, 2, &"memory row")?;
    let what = format!("memory record `{owner}/{namespace}.{key}`");
    let value: String = col(row, 3, &what)?;
    let visibility: String = col(row, 4, &what)?;
    let class: String = col(row, 5, &what)?;
    let combine: Option<String> = col(row, 6, &what)?;
    let grants: Option<String> = col(row, 7, &what)?;
    let expires_at: Option<i64> = col(row, 8, &what)?;
    let class = match (class.as_str(), combine) {
        ("preference", _) => RecordClass::Preference,
        ("policy", Some(c)) => RecordClass::Policy {
            combine: c.parse::<Combinator>().map_err(|e| corrupt(&what, e))?,
        },
        ("secret", _) => RecordClass::Secret {
            grants: grants
                .map(|g| parse_json(&what, &g))
                .transpose()?
                .unwrap_or_default(),
        },
        ("task", _) => RecordClass::Task {
            expires_at: expires_at.map(Timestamp),
        },
        (other, _) => return Err(corrupt(&what, format!("unknown class `{other}`"))),
    };
    Ok(MemoryRecord {
        value: parse_json(&what, &value)?,
        visibility: visibility
            .parse::<Visibility>()
            .map_err(|e| corrupt(&what, e))?,
        class,
        revision: to_u64(&what, col(row, 9, &what)?)?,
        created_at: Timestamp(col(row, 10, &what)?),
        updated_at: Timestamp(col(row, 11, &what)?),
        owner: ident(AgentId::parse, &owner, &what)?,
        namespace: ident(Namespace::parse, &namespace, &what)?,
        key: ident(Key::parse, &key, &what)?,
    })
}

// ----- audit -----

/// Columns [`audit_from_row`] reads, in order.
pub(crate) const AUDIT_COLUMNS: &str = "seq, time, subject, operation, resource, verdict, reason, policy_version, details, prev_hash, hash";

/// An audit row that does not decode.
#[derive(Debug)]
pub(crate) struct BadEntry {
    /// Its sequence number (0 if even that is unreadable).
    pub seq: u64,
    /// What is wrong.
    pub reason: String,
}

impl From<BadEntry> for StoreError {
    fn from(b: BadEntry) -> Self {
        StoreError::corrupt(format!("audit entry {}: {}", b.seq, b.reason))
    }
}

fn verdict_from_sql(s: &str) -> Option<Verdict> {
    s.parse().ok()
}

pub(crate) fn audit_from_row(row: &Row<'_>) -> Result<AuditEntry, BadEntry> {
    let seq_raw: i64 = row.get(0).map_err(|e| BadEntry {
        seq: 0,
        reason: e.to_string(),
    })?;
    let seq = u64::try_from(seq_raw).map_err(|_| BadEntry {
        seq: 0,
        reason: format!("negative sequence number {seq_raw}"),
    })?;
    let bad = |reason: String| BadEntry { seq, reason };
    let get = |i: usize| -> Result<String, BadEntry> { row.get(i).map_err(|e| bad(e.to_string())) };
    let blob = |i: usize| -> Result<Digest, BadEntry> {
        let b: Vec<u8> = row.get(i).map_err(|e| bad(e.to_string()))?;
        <[u8; 32]>::try_from(b.as_slice())
            .map(Digest)
            .map_err(|_| bad(format!("a hash of {} bytes", b.len())))
    };
    let verdict = get(5)?;
    let details = get(8)?;
    Ok(AuditEntry {
        seq,
        draft: AuditDraft {
            time: Timestamp(row.get(1).map_err(|e| bad(e.to_string()))?),
            subject: get(2)?,
            operation: get(3)?,
            resource: get(4)?,
            verdict: verdict_from_sql(&verdict)
                .ok_or_else(|| bad(format!("unknown verdict `{verdict}`")))?,
            reason: get(6)?,
            policy_version: get(7)?,
            details: serde_json::from_str::<Value>(&details)
                .map_err(|e| bad(format!("details are not json: {e}")))?,
        },
        prev_hash: blob(9)?,
        hash: blob(10)?,
    })
}

/// An audit row's fields borrowed from the cursor: the allocation-free
/// path of verification. Checks that each field is one Warden could have
/// written (text where text belongs, a known verdict, JSON details, 32-byte
/// hashes); the chain verifier checks the rest.
pub(crate) fn audit_ref<'r>(row: &'r Row<'_>) -> Result<EntryRef<'r>, BadEntry> {
    let seq_raw = row
        .get_ref(0)
        .and_then(|v| v.as_i64().map_err(Into::into))
        .map_err(|e| BadEntry {
            seq: 0,
            reason: e.to_string(),
        })?;
    let seq = u64::try_from(seq_raw).map_err(|_| BadEntry {
        seq: 0,
        reason: format!("negative sequence number {seq_raw}"),
    })?;
    let bad = |reason: String| BadEntry { seq, reason };
    let text = |i: usize| -> Result<&'r str, BadEntry> {
        row.get_ref(i)
            .and_then(|v| v.as_str().map_err(Into::into))
            .map_err(|e| bad(e.to_string()))
    };
    let hash = |i: usize| -> Result<Digest, BadEntry> {
        let b = row
            .get_ref(i)
            .and_then(|v| v.as_blob().map_err(Into::into))
            .map_err(|e| bad(e.to_string()))?;
        <[u8; 32]>::try_from(b)
            .map(Digest)
            .map_err(|_| bad(format!("a hash of {} bytes", b.len())))
    };
    let time = row
        .get_ref(1)
        .and_then(|v| v.as_i64().map_err(Into::into))
        .map_err(|e| bad(e.to_string()))?;
    let verdict = text(5)?;
    if verdict_from_sql(verdict).is_none() {
        return Err(bad(format!("unknown verdict `{verdict}`")));
    }
    let details = text(8)?;
    serde_json::from_str::<serde::de::IgnoredAny>(details)
        .map_err(|e| bad(format!("details are not json: {e}")))?;
    Ok(EntryRef {
        seq,
        time: Timestamp(time),
        subject: text(2)?,
        operation: text(3)?,
        resource: text(4)?,
        verdict,
        reason: text(6)?,
        policy_version: text(7)?,
        details: details.as_bytes(),
        prev_hash: hash(9)?,
        hash: hash(10)?,
    })
}

// ----- runs -----

pub(crate) fn step_status_to_sql(s: StepStatus) -> &'static str {
    s.as_str()
}

/// Columns [`step_from_row`] reads, in order.
pub(crate) const STEP_COLUMNS: &str = "step_id, action, operation_id, status, result, error, \
     labels, recorded_at, lease_holder, lease_acquired_at, lease_expires_at";

/// A step's lease from the columns `lease_holder, lease_acquired_at,
/// lease_expires_at` of [`STEP_COLUMNS`].
pub(crate) fn lease_from_row(
    row: &Row<'_>,
    what: &str,
) -> Result<Option<warden_store::StepLease>, StoreError> {
    let holder: Option<String> = col(row, 8, &what)?;
    let acquired: Option<i64> = col(row, 9, &what)?;
    let expires: Option<i64> = col(row, 10, &what)?;
    match (holder, acquired, expires) {
        (None, None, None) => Ok(None),
        (Some(holder), Some(acquired), Some(expires)) => Ok(Some(warden_store::StepLease {
            holder,
            acquired_at: Timestamp(acquired),
            expires_at: Timestamp(expires),
        })),
        _ => Err(corrupt(what, "its lease is partly set")),
    }
}

/// A planned step and its outcome, if recorded.
pub(crate) fn step_from_row(
    row: &Row<'_>,
    run: &RunId,
) -> Result<(RunStep, Option<StepOutcome>), StoreError> {
    let step_id: String = col(row, 0, &"run step row")?;
    let what = format!("step `{run}/{step_id}`");
    let action: String = col(row, 1, &what)?;
    let step = RunStep {
        step_id: ident(StepId::parse, &step_id, &what)?,
        action: ident(warden_core::ids::ActionName::parse, &action, &what)?,
        operation_id: col(row, 2, &what)?,
    };
    let status: Option<String> = col(row, 3, &what)?;
    let Some(status) = status else {
        return Ok((step, None));
    };
    let result: Option<String> = col(row, 4, &what)?;
    let labels: Option<String> = col(row, 6, &what)?;
    let recorded_at: Option<i64> = col(row, 7, &what)?;
    let outcome = StepOutcome {
        status: status.parse().map_err(|e| corrupt(&what, e))?,
        result: result.map(|r| parse_json(&what, &r)).transpose()?,
        error: col(row, 5, &what)?,
        labels: labels
            .map(|l| parse_json(&what, &l))
            .transpose()?
            .unwrap_or_default(),
        recorded_at: Timestamp(recorded_at.ok_or_else(|| corrupt(&what, "no recording time"))?),
    };
    Ok((step, Some(outcome)))
}

/// A 32-byte digest column.
pub(crate) fn digest_col(
    row: &Row<'_>,
    i: usize,
    what: &impl Display,
) -> Result<Digest, StoreError> {
    let bytes: Vec<u8> = col(row, i, what)?;
    digest(&bytes, what)
}

/// Any column, decoded or reported as corrupt.
pub(crate) fn column<T: FromSql>(
    row: &Row<'_>,
    i: usize,
    what: &impl Display,
) -> Result<T, StoreError> {
    col(row, i, what)
}

/// JSON text, decoded or reported as corrupt.
pub(crate) fn from_json<T: DeserializeOwned>(
    what: &impl Display,
    text: &str,
) -> Result<T, StoreError> {
    parse_json(what, text)
}
