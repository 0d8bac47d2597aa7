//! Conversions between Warden's types and PostgreSQL columns.
//!
//! Everything read back from the database is parsed again (identifiers,
//! enums, digests, JSON): a row Warden never wrote is reported as
//! [`StoreError::Corrupt`], never trusted.

use std::collections::BTreeSet;

use serde_json::Value;
use tokio_postgres::Row;
use warden_core::audit::{AuditEntry, Digest};
use warden_core::decision::{Obligation, Reason, Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, StepId};
use warden_core::memory::{Combinator, MemoryRecord, RecordClass, Visibility};
use warden_core::time::Timestamp;
use warden_store::{
    EscalationRecord, EscalationStatus, EscalationTarget, StepOutcome, StepStatus, StoreError,
    StoredAgent, TokenRecord, TokenSubject,
};

/// The escape character of the reversible NUL encoding (a private-use code
/// point, so ordinary text is stored unchanged).
const ESCAPE: char = '\u{E000}';

/// Encode a free-form string for a TEXT column.
///
/// PostgreSQL's TEXT cannot hold NUL, but free-form strings (an audit
/// entry's resource built from a tool argument, a step's error message) may
/// contain one, and the audit hash needs the exact string back. NUL becomes
/// `ESCAPE 0` and `ESCAPE` becomes `ESCAPE ESCAPE`; every other string,
/// which is nearly all of them, is stored as is.
pub(crate) fn text_in(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\0', ESCAPE]) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for ch in s.chars() {
        match ch {
            '\0' => {
                out.push(ESCAPE);
                out.push('0');
            }
            ESCAPE => {
                out.push(ESCAPE);
                out.push(ESCAPE);
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Decode a string written by [`text_in`].
pub(crate) fn text_out(s: String) -> Result<String, StoreError> {
    if !s.contains(ESCAPE) {
        return Ok(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(ch) = chars.next() {
        if ch != ESCAPE {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('\0'),
            Some(ESCAPE) => out.push(ESCAPE),
            _ => return Err(corrupt("a text column holds an invalid escape sequence")),
        }
    }
    Ok(out)
}

pub(crate) fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::corrupt(what)
}

/// JSON as the exact text serde_json writes.
pub(crate) fn json_in(value: &Value) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::backend(format!("cannot encode a json value: {e}")))
}

pub(crate) fn json_out(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("a stored json value is invalid: {e}")))
}

/// A `u64` counter as BIGINT.
pub(crate) fn u64_in(n: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::backend(format!("{what} {n} is too large to store")))
}

pub(crate) fn u64_out(n: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| corrupt(format!("{what} {n} is negative")))
}

pub(crate) fn digest_out(bytes: &[u8], what: &str) -> Result<Digest, StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map(Digest)
        .map_err(|_| corrupt(format!("{what} is {} bytes, not 32", bytes.len())))
}

macro_rules! parse_id {
    ($ty:ty, $s:expr, $what:expr) => {{
        let s: &str = $s;
        <$ty>::parse(s).map_err(|e| corrupt(format!("{} `{}` is invalid: {e}", $what, s)))
    }};
}

pub(crate) fn agent_id(s: &str) -> Result<AgentId, StoreError> {
    parse_id!(AgentId, s, "agent id")
}

pub(crate) fn verdict_in(v: Verdict) -> &'static str {
    v.as_str()
}

pub(crate) fn verdict_out(s: &str) -> Result<Verdict, StoreError> {
    s.parse().map_err(corrupt)
}

pub(crate) fn status_in(s: AgentStatus) -> &'static str {
    s.as_str()
}

fn status_out(s: &str) -> Result<AgentStatus, StoreError> {
    s.parse().map_err(corrupt)
}

pub(crate) fn step_status_in(s: StepStatus) -> &'static str {
    s.as_str()
}

fn step_status_out(s: &str) -> Result<StepStatus, StoreError> {
    s.parse().map_err(corrupt)
}

/// The columns of a record class: class name, combinator, grants, expiry.
pub(crate) struct ClassColumns {
    pub class: &'static str,
    pub combine: Option<&'static str>,
    pub grants: Option<Vec<String>>,
    pub expires_at: Option<i64>,
}

pub(crate) fn class_in(class: &RecordClass) -> ClassColumns {
    let (combine, grants, expires_at) = match class {
        RecordClass::Preference => (None, None, None),
        RecordClass::Policy { combine } => (Some(combine.as_str()), None, None),
        RecordClass::Secret { grants } => (
            None,
            Some(grants.iter().map(|g| g.as_str().to_string()).collect()),
            None,
        ),
        RecordClass::Task { expires_at } => (None, None, expires_at.map(|t| t.0)),
    };
    ClassColumns {
        class: class.name(),
        combine,
        grants,
        expires_at,
    }
}

fn class_out(
    class: &str,
    combine: Option<&str>,
    grants: Option<Vec<String>>,
    expires_at: Option<i64>,
) -> Result<RecordClass, StoreError> {
    Ok(match class {
        "preference" => RecordClass::Preference,
        "policy" => {
            let name = combine.ok_or_else(|| corrupt("a policy record has no combinator"))?;
            RecordClass::Policy {
                combine: name.parse::<Combinator>().map_err(corrupt)?,
            }
        }
        "secret" => RecordClass::Secret {
            grants: grants
                .unwrap_or_default()
                .iter()
                .map(|g| agent_id(g))
                .collect::<Result<_, _>>()?,
        },
        "task" => RecordClass::Task {
            expires_at: expires_at.map(Timestamp),
        },
        other => return Err(corrupt(format!("unknown record class `{other}`"))),
    })
}

/// Decodes a row of these columns, in order:
/// `owner, namespace, key, value, visibility, class, combine, grants, expires_at, revision, created_at, updated_at`.
pub(crate) fn record_out(row: &Row) -> Result<MemoryRecord, StoreError> {
    let owner: &str = row.try_get(0).map_err(crate::error::column)?;
    let namespace: &str = row.try_get(1).map_err(crate::error::column)?;
    let key: &str = row.try_get(2).map_err(crate::error::column)?;
    let value: &str = row.try_get(3).map_err(crate::error::column)?;
    let visibility: &str = row.try_get(4).map_err(crate::error::column)?;
    let class: &str = row.try_get(5).map_err(crate::error::column)?;
    let combine: Option<&str> = row.try_get(6).map_err(crate::error::column)?;
    let grants: Option<Vec<String>> = row.try_get(7).map_err(crate::error::column)?;
    let expires_at: Option<i64> = row.try_get(8).map_err(crate::error::column)?;
    let revision: i64 = row.try_get(9).map_err(crate::error::column)?;
    let created_at: i64 = row.try_get(10).map_err(crate::error::column)?;
    let updated_at: i64 = row.try_get(11).map_err(crate::error::column)?;
    Ok(MemoryRecord {
        namespace: parse_id!(Namespace, namespace, "namespace")?,
        key: parse_id!(Key, key, "key")?,
        value: json_out(value)?,
        owner: agent_id(owner)?,
        visibility: visibility.parse::<Visibility>().map_err(corrupt)?,
        class: class_out(class, combine, grants, expires_at)?,
        revision: u64_out(revision, "revision")?,
        created_at: Timestamp(created_at),
        updated_at: Timestamp(updated_at),
    })
}

/// Decodes a row of these columns, in order:
/// `id, parent, capabilities, tools, config, status, created_at, envelope_id`.
pub(crate) fn agent_out(row: &Row) -> Result<StoredAgent, StoreError> {
    let id: &str = row.try_get(0).map_err(crate::error::column)?;
    let parent: Option<&str> = row.try_get(1).map_err(crate::error::column)?;
    let capabilities: Vec<String> = row.try_get(2).map_err(crate::error::column)?;
    let tools: Vec<String> = row.try_get(3).map_err(crate::error::column)?;
    let config: Option<&str> = row.try_get(4).map_err(crate::error::column)?;
    let status: &str = row.try_get(5).map_err(crate::error::column)?;
    let created_at: i64 = row.try_get(6).map_err(crate::error::column)?;
    let envelope: Option<&str> = row.try_get(7).map_err(crate::error::column)?;
    Ok(StoredAgent {
        id: agent_id(id)?,
        parent: parent.map(agent_id).transpose()?,
        capabilities: capabilities
            .iter()
            .map(|c| parse_id!(ActionName, c, "capability"))
            .collect::<Result<BTreeSet<_>, _>>()?,
        tools: tools.into_iter().map(text_out).collect::<Result<_, _>>()?,
        config: config.map(json_out).transpose()?,
        status: status_out(status)?,
        created_at: Timestamp(created_at),
        envelope_id: envelope.map(envelope_id).transpose()?,
    })
}

/// Decodes a row of these columns, in order:
/// `token_id, hash, subject_kind, subject_agent, created_at, revoked`.
pub(crate) fn token_out(row: &Row) -> Result<TokenRecord, StoreError> {
    let token_id: String = row.try_get(0).map_err(crate::error::column)?;
    let hash: &[u8] = row.try_get(1).map_err(crate::error::column)?;
    let kind: &str = row.try_get(2).map_err(crate::error::column)?;
    let agent: Option<&str> = row.try_get(3).map_err(crate::error::column)?;
    let created_at: i64 = row.try_get(4).map_err(crate::error::column)?;
    let revoked: bool = row.try_get(5).map_err(crate::error::column)?;
    let subject = match (kind, agent) {
        ("operator", None) => TokenSubject::Operator,
        ("agent", Some(a)) => TokenSubject::Agent(agent_id(a)?),
        _ => return Err(corrupt(format!("token subject `{kind}` is inconsistent"))),
    };
    Ok(TokenRecord {
        token_id: text_out(token_id)?,
        hash: digest_out(hash, "a token hash")?,
        subject,
        created_at: Timestamp(created_at),
        revoked,
    })
}

pub(crate) fn subject_in(subject: &TokenSubject) -> (&'static str, Option<&str>) {
    let agent = match subject {
        TokenSubject::Operator => None,
        TokenSubject::Agent(a) => Some(a.as_str()),
    };
    (subject.kind_str(), agent)
}

/// Decodes a row of these columns, in order:
/// `seq, time, subject, operation, resource, verdict, reason, policy_version, details, prev_hash, hash`.
pub(crate) fn audit_out(row: &Row) -> Result<AuditEntry, StoreError> {
    let seq: i64 = row.try_get(0).map_err(crate::error::column)?;
    let seq = u64_out(seq, "audit sequence number")?;
    let at = |e: StoreError| match e {
        e @ StoreError::Corrupt { .. } => e.context(format_args!("audit entry {seq}")),
        other => other,
    };
    let text = |i: usize| -> Result<String, StoreError> {
        let s: String = row.try_get(i).map_err(crate::error::column)?;
        text_out(s)
    };
    let time: i64 = row.try_get(1).map_err(crate::error::column)?;
    let verdict: &str = row.try_get(5).map_err(crate::error::column)?;
    let details: &str = row.try_get(8).map_err(crate::error::column)?;
    let prev_hash: &[u8] = row.try_get(9).map_err(crate::error::column)?;
    let hash: &[u8] = row.try_get(10).map_err(crate::error::column)?;
    Ok(AuditEntry {
        seq,
        draft: warden_core::audit::AuditDraft {
            time: Timestamp(time),
            subject: text(2).map_err(at)?,
            operation: text(3).map_err(at)?,
            resource: text(4).map_err(at)?,
            verdict: verdict_out(verdict).map_err(at)?,
            reason: text(6).map_err(at)?,
            policy_version: text(7).map_err(at)?,
            details: json_out(details).map_err(at)?,
        },
        prev_hash: digest_out(prev_hash, "the previous hash").map_err(at)?,
        hash: digest_out(hash, "the hash").map_err(at)?,
    })
}

/// A recorded step outcome from the `status, result, error, labels,
/// recorded_at` columns starting at `at`, if one is recorded.
pub(crate) fn outcome_out(row: &Row, at: usize) -> Result<Option<StepOutcome>, StoreError> {
    let status: Option<&str> = row.try_get(at).map_err(crate::error::column)?;
    let Some(status) = status else {
        return Ok(None);
    };
    let result: Option<&str> = row.try_get(at + 1).map_err(crate::error::column)?;
    let error: Option<String> = row.try_get(at + 2).map_err(crate::error::column)?;
    let labels: Option<Vec<String>> = row.try_get(at + 3).map_err(crate::error::column)?;
    let recorded_at: Option<i64> = row.try_get(at + 4).map_err(crate::error::column)?;
    Ok(Some(StepOutcome {
        status: step_status_out(status)?,
        result: result.map(json_out).transpose()?,
        error: error.map(text_out).transpose()?,
        labels: labels
            .unwrap_or_default()
            .iter()
            .map(|l| parse_id!(Label, l, "label"))
            .collect::<Result<_, _>>()?,
        recorded_at: Timestamp(recorded_at.ok_or_else(|| corrupt("a step outcome has no time"))?),
    }))
}

pub(crate) fn step_id(s: &str) -> Result<StepId, StoreError> {
    parse_id!(StepId, s, "step id")
}

pub(crate) fn action(s: &str) -> Result<ActionName, StoreError> {
    parse_id!(ActionName, s, "action")
}

pub(crate) fn run_id(s: &str) -> Result<warden_core::ids::RunId, StoreError> {
    parse_id!(warden_core::ids::RunId, s, "run id")
}

pub(crate) fn envelope_id(s: &str) -> Result<EnvelopeId, StoreError> {
    parse_id!(EnvelopeId, s, "envelope id")
}

/// An envelope version as stored: the exact JSON serde_json writes.
pub(crate) fn envelope_in(record: &EnvelopeRecord) -> Result<String, StoreError> {
    serde_json::to_string(record)
        .map_err(|e| StoreError::backend(format!("cannot encode an envelope: {e}")))
}

/// Decodes a row of `envelope_id, version, record`; the record must be the
/// version its key columns name.
pub(crate) fn envelope_out(row: &Row) -> Result<EnvelopeRecord, StoreError> {
    let id: &str = row.try_get(0).map_err(crate::error::column)?;
    let version: i64 = row.try_get(1).map_err(crate::error::column)?;
    let text: &str = row.try_get(2).map_err(crate::error::column)?;
    let record: EnvelopeRecord = serde_json::from_str(text)
        .map_err(|e| corrupt(format!("envelope `{id}` version {version} is invalid: {e}")))?;
    if record.envelope_id.as_str() != id || Ok(record.version) != u64::try_from(version) {
        return Err(corrupt(format!(
            "the row of envelope `{id}` version {version} holds another version"
        )));
    }
    Ok(record)
}

/// An escalation target as its key column: canonical JSON (serde_json
/// writes fields in declaration order, so equal targets give equal text).
pub(crate) fn target_in(target: &EscalationTarget) -> Result<String, StoreError> {
    serde_json::to_string(target)
        .map_err(|e| StoreError::backend(format!("cannot encode an escalation target: {e}")))
}

fn target_out(text: &str) -> Result<EscalationTarget, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("an escalation target is invalid: {e}")))
}

pub(crate) fn subject_out(s: &str) -> Result<Subject, StoreError> {
    if s == Subject::OPERATOR {
        Ok(Subject::Operator)
    } else {
        agent_id(s).map(Subject::Agent)
    }
}

fn sensitivity_out(s: &str) -> Result<Sensitivity, StoreError> {
    Sensitivity::ALL
        .into_iter()
        .find(|l| l.as_str() == s)
        .ok_or_else(|| corrupt(format!("unknown sensitivity `{s}`")))
}

pub(crate) fn escalation_status_out(s: &str) -> Result<EscalationStatus, StoreError> {
    s.parse().map_err(corrupt)
}

/// Obligations as stored: a JSON array.
pub(crate) fn obligations_in(obligations: &[Obligation]) -> Result<String, StoreError> {
    serde_json::to_string(obligations)
        .map_err(|e| StoreError::backend(format!("cannot encode obligations: {e}")))
}

/// Decodes a row of these columns, in order:
/// `escalation_id, target, requested_by, operation, resource, reason,
/// envelope_id, envelope_version, classification, obligations, status,
/// created_at, resolved_by, resolved_at, rejection_reason, consumed_at,
/// request`.
pub(crate) fn escalation_out(row: &Row) -> Result<EscalationRecord, StoreError> {
    let col = crate::error::column;
    let escalation_id: String = row.try_get(0).map_err(col)?;
    let escalation_id = text_out(escalation_id)?;
    let at = |e: StoreError| match e {
        e @ StoreError::Corrupt { .. } => e.context(format_args!("escalation `{escalation_id}`")),
        other => other,
    };
    let target: &str = row.try_get(1).map_err(col)?;
    let requested_by: &str = row.try_get(2).map_err(col)?;
    let operation: String = row.try_get(3).map_err(col)?;
    let resource: String = row.try_get(4).map_err(col)?;
    let reason: String = row.try_get(5).map_err(col)?;
    let envelope: Option<&str> = row.try_get(6).map_err(col)?;
    let envelope_version: Option<i64> = row.try_get(7).map_err(col)?;
    let classification: &str = row.try_get(8).map_err(col)?;
    let obligations: &str = row.try_get(9).map_err(col)?;
    let status: &str = row.try_get(10).map_err(col)?;
    let created_at: i64 = row.try_get(11).map_err(col)?;
    let resolved_by: Option<&str> = row.try_get(12).map_err(col)?;
    let resolved_at: Option<i64> = row.try_get(13).map_err(col)?;
    let rejection_reason: Option<String> = row.try_get(14).map_err(col)?;
    let consumed_at: Option<i64> = row.try_get(15).map_err(col)?;
    let request: Option<&str> = row.try_get(16).map_err(col)?;
    let request: Option<serde_json::Value> = request
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| corrupt(format!("its request is invalid: {e}")))
        .map_err(at)?;
    let obligations: Vec<Obligation> = serde_json::from_str(obligations)
        .map_err(|e| corrupt(format!("its obligations are invalid: {e}")))
        .map_err(at)?;
    Ok(EscalationRecord {
        target: target_out(target).map_err(at)?,
        requested_by: subject_out(requested_by).map_err(at)?,
        operation: text_out(operation).map_err(at)?,
        resource: text_out(resource).map_err(at)?,
        reason: Reason::from_string(text_out(reason).map_err(at)?),
        envelope_id: envelope.map(envelope_id).transpose().map_err(at)?,
        envelope_version: envelope_version
            .map(|v| u64_out(v, "envelope version"))
            .transpose()
            .map_err(at)?,
        classification: sensitivity_out(classification).map_err(at)?,
        obligations,
        request,
        status: escalation_status_out(status).map_err(at)?,
        created_at: Timestamp(created_at),
        resolved_by: resolved_by.map(subject_out).transpose().map_err(at)?,
        resolved_at: resolved_at.map(Timestamp),
        rejection_reason: rejection_reason.map(text_out).transpose().map_err(at)?,
        consumed_at: consumed_at.map(Timestamp),
        escalation_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_escape_round_trips() {
        for s in [
            "",
            "plain",
            "nul\0inside",
            "\0",
            "esc\u{E000}ape",
            "\u{E000}0",
            "\u{E000}\u{E000}\0\0",
            "héllo ✓",
        ] {
            let encoded = text_in(s);
            assert!(!encoded.contains('\0'));
            assert_eq!(text_out(encoded.into_owned()).unwrap(), s);
        }
        assert!(matches!(text_in("plain"), std::borrow::Cow::Borrowed(_)));
        assert!(text_out("bad\u{E000}x".into()).is_err());
        assert!(text_out("bad\u{E000}".into()).is_err());
    }
}
