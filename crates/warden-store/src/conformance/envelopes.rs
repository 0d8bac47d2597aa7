//! Context envelopes: `put_envelope` is a compare-and-set on the latest
//! version and keeps every version.
//!
//! The context checks return `Err(<what failed>)` rather than panicking;
//! the suite wraps them ([`super::envelope_versions`]) and
//! [`super::run_context_checks`] runs them on a store that is not fresh.

use std::collections::BTreeSet;

use serde_json::json;
use warden_core::audit::AuditDraft;
use warden_core::decision::{Subject, Verdict};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::ids::AgentId;
use warden_core::time::Timestamp;

use crate::{PutEnvelope, Store};

/// What a failed check reports.
pub type Failure = String;

pub(super) fn check(ok: bool, what: &str) -> Result<(), Failure> {
    if ok { Ok(()) } else { Err(what.to_owned()) }
}

pub(super) fn ident<T>(r: Result<T, warden_core::ids::IdentifierError>) -> Result<T, Failure> {
    r.map_err(|e| e.to_string())
}

pub(super) fn note(reason: &'static str) -> AuditDraft {
    AuditDraft {
        time: Timestamp(1),
        subject: Subject::OPERATOR.to_owned(),
        operation: "conformance".into(),
        resource: reason.into(),
        verdict: Verdict::Allow,
        reason: reason.into(),
        policy_version: "conformance".into(),
        details: json!(null),
    }
}

fn envelope(id: &str, version: u64) -> Result<EnvelopeRecord, Failure> {
    Ok(EnvelopeRecord {
        envelope_id: ident(EnvelopeId::parse(id))?,
        parent_envelope_id: None,
        workflow_id: ident(WorkflowId::parse("wf-conformance"))?,
        agent_id: ident(AgentId::parse("agent-conformance"))?,
        labels: BTreeSet::new(),
        aggregate_sensitivity: Sensitivity::Public,
        derived: BTreeSet::new(),
        delegation_depth: 0,
        restrictions: BTreeSet::new(),
        version,
    })
}

pub(super) async fn audit_count<S: Store>(store: &S) -> Result<u64, Failure> {
    Ok(store.audit_head().await.map_err(|e| e.to_string())?.count)
}

/// `put_envelope` is a compare-and-set on the latest version, keeps every
/// version, and appends audit entries only for what its `AuditFn` returns.
pub async fn check_envelope_versions<S: Store>(store: &S) -> Result<(), Failure> {
    let err = |e: crate::StoreError| e.to_string();
    let id = ident(EnvelopeId::parse("env-conformance-1"))?;
    let before = audit_count(store).await?;
    let written = |o: &PutEnvelope| match o {
        PutEnvelope::Written => vec![note("envelope_written")],
        PutEnvelope::Conflict { .. } => Vec::new(),
    };

    check(
        store
            .get_envelope(id.clone(), None)
            .await
            .map_err(err)?
            .is_none(),
        "an unknown envelope reads as None",
    )?;
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 0)?,
            Some(0),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: None },
        "expecting a version of a missing envelope conflicts",
    )?;
    let o = store
        .put_envelope(envelope("env-conformance-1", 0)?, None, Box::new(written))
        .await
        .map_err(err)?;
    check(o == PutEnvelope::Written, "creating an envelope writes it")?;
    let o = store
        .put_envelope(envelope("env-conformance-1", 5)?, None, Box::new(written))
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: Some(0) },
        "creating an existing envelope conflicts",
    )?;
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 1)?,
            Some(0),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(o == PutEnvelope::Written, "the expected version writes")?;
    // The loser of a race: it expected 0, the latest is 1.
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 1)?,
            Some(0),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: Some(1) },
        "a stale expected version conflicts",
    )?;
    let o = store
        .put_envelope(
            envelope("env-conformance-1", 1)?,
            Some(1),
            Box::new(written),
        )
        .await
        .map_err(err)?;
    check(
        o == PutEnvelope::Conflict { current: Some(1) },
        "a version that does not go up conflicts",
    )?;
    let latest = store.get_envelope(id.clone(), None).await.map_err(err)?;
    check(
        latest.map(|r| r.version) == Some(1),
        "the latest version is read back",
    )?;
    let first = store.get_envelope(id.clone(), Some(0)).await.map_err(err)?;
    check(
        first.map(|r| r.version) == Some(0),
        "earlier versions are kept",
    )?;
    check(
        store
            .get_envelope(id, Some(7))
            .await
            .map_err(err)?
            .is_none(),
        "a version never stored reads as None",
    )?;
    check(
        audit_count(store).await? == before + 2,
        "only the two writes appended audit entries",
    )
}
