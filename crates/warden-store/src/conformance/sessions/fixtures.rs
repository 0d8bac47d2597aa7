//! Sessions, calls, envelopes, imports and audit functions the session
//! checks share.

use std::collections::BTreeSet;

use warden_core::decision::{Reason, Subject};
use warden_core::envelope::{EnvelopeId, EnvelopeRecord, Sensitivity, WorkflowId};
use warden_core::ids::{CallId, SessionId};

use super::super::*;
use crate::{
    CallRecord, CallStatus, CreateSession, EnvelopeImport, ImportRefusal, SessionRecord,
    SessionState, SessionStatus, SessionUpdate, StoredPlan, UpdateSession,
};

pub(super) fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

pub(super) fn cid(s: &str) -> CallId {
    CallId::parse(s).unwrap()
}

pub(super) fn eid(s: &str) -> EnvelopeId {
    EnvelopeId::parse(s).unwrap()
}

pub(super) fn label(s: &str) -> Label {
    Label::parse(s).unwrap()
}

pub(super) fn labels(names: &[&str]) -> BTreeSet<Label> {
    names.iter().map(|n| label(n)).collect()
}

/// A session of `agent` with nothing optional set, at revision 1.
pub(super) fn bare(name: &str, agent: &str, created_at: i64) -> SessionRecord {
    SessionRecord {
        session_id: sid(name),
        agent: id(agent),
        opened_by: Subject::Agent(id(agent)),
        created_at: Timestamp(created_at),
        policy_version: "conf-1".into(),
        status: SessionStatus::Open,
        closure: None,
        envelope_id: None,
        plan: None,
        imported: None,
        trusted_inputs_hash: Digest::of(name.as_bytes()),
        revision: 1,
    }
}

/// A session with every optional field set (and an envelope `env-<id>`).
pub(super) fn full(name: &str, agent: &str) -> SessionRecord {
    SessionRecord {
        opened_by: Subject::Operator,
        envelope_id: Some(eid(&format!("env-{name}"))),
        plan: Some(StoredPlan {
            plan: json!({"sop_id": "plan", "version": 2, "steps": [
                {"step_id": "fetch", "action": "http.get",
                 "arguments": {"url": {"$bind": {"from": ["user"], "within": "urls"}}}},
                {"step_id": "send", "action": "mail.send",
                 "arguments": {"to": "a@example.org", "n": 1.5, "big": 18446744073709551615u64,
                               "neg": -7, "text": "naïve \u{1F600} \"quoted\" \\ \u{0}"}}]}),
            hash: Digest::of(b"plan"),
            used_by: vec![Some(cid("call-1")), None],
        }),
        imported: Some(import("issuer-a", "env-remote", 3, &["no_export"], name)),
        ..bare(name, agent, 42)
    }
}

pub(super) fn state(session: SessionRecord, sources: &[u8]) -> SessionState {
    SessionState {
        session,
        sources: sources.to_vec(),
        calls: Vec::new(),
    }
}

pub(super) fn envelope(name: &str, agent: &str) -> EnvelopeRecord {
    EnvelopeRecord {
        envelope_id: eid(name),
        parent_envelope_id: None,
        workflow_id: WorkflowId::parse("wf-sessions").unwrap(),
        agent_id: id(agent),
        labels: labels(&["pii"]),
        aggregate_sensitivity: Sensitivity::Confidential,
        derived: BTreeSet::new(),
        delegation_depth: 0,
        restrictions: labels(&["no_export"]),
        version: 0,
    }
}

pub(super) fn import(
    issuer: &str,
    envelope: &str,
    version: u64,
    restrictions: &[&str],
    session: &str,
) -> EnvelopeImport {
    EnvelopeImport {
        issuer: issuer.into(),
        envelope_id: eid(envelope),
        version,
        restrictions: labels(restrictions),
        sensitivity: Sensitivity::Restricted,
        session_id: sid(session),
        at: Timestamp(40),
    }
}

pub(super) fn call(name: &str, seq: u64) -> CallRecord {
    CallRecord {
        call_id: cid(name),
        seq,
        action: action("http.get"),
        arguments_hash: Digest::of(name.as_bytes()),
        verdict: Verdict::Allow,
        reason: Reason::code("allowed"),
        detail: json!({"obligations": [], "provenance": [
            {"path": "/url", "origins": ["user"], "vouched": true, "confusable_with": null}]}),
        plan_step: Some(step_id("fetch")),
        escalation_id: None,
        status: CallStatus::Allowed,
        decided_at: Timestamp(50),
        result_hash: None,
        result_labels: Vec::new(),
        completed_at: None,
    }
}

/// `session` at the next revision, with the same fields otherwise.
pub(super) fn next(session: &SessionRecord) -> SessionRecord {
    SessionRecord {
        revision: session.revision + 1,
        ..session.clone()
    }
}

pub(super) fn update(
    session: SessionRecord,
    sources: Option<&[u8]>,
    call: Option<CallRecord>,
) -> SessionUpdate {
    SessionUpdate {
        session,
        sources: sources.map(|b| crate::IndexChange::Replace(b.to_vec())),
        call,
    }
}

/// Records every create outcome (reason by kind, `tag` in the details).
pub(super) fn create_audit(tag: u64) -> AuditFn<CreateSession> {
    Box::new(move |o: &CreateSession| {
        let (verdict, reason) = match o {
            CreateSession::Created => (Verdict::Allow, "session_opened"),
            CreateSession::Existing(_) => (Verdict::Allow, "session_exists"),
            CreateSession::ImportRefused(ImportRefusal::Replayed { .. }) => {
                (Verdict::Deny, "envelope_replayed")
            }
            CreateSession::ImportRefused(ImportRefusal::Downgraded { .. }) => {
                (Verdict::Deny, "envelope_downgraded")
            }
        };
        vec![AuditDraft {
            details: json!({ "tag": tag }),
            ..draft("@operator", "session.open", "session", verdict, reason)
        }]
    })
}

/// Records every update outcome (reason by kind, `tag` in the details).
pub(super) fn update_audit(tag: u64) -> AuditFn<UpdateSession> {
    Box::new(move |o: &UpdateSession| {
        let (verdict, reason, details) = match o {
            UpdateSession::Updated => (Verdict::Allow, "session_updated", json!({ "tag": tag })),
            UpdateSession::Conflict { current } => (
                Verdict::Deny,
                "revision_conflict",
                json!({ "tag": tag, "current": current }),
            ),
        };
        vec![AuditDraft {
            details,
            ..draft("agent", "session.call", "session", verdict, reason)
        }]
    })
}

/// Records only an applied update.
pub(super) fn audit_if_updated() -> AuditFn<UpdateSession> {
    Box::new(|o: &UpdateSession| match o {
        UpdateSession::Updated => vec![draft(
            "agent",
            "session.call",
            "session",
            Verdict::Allow,
            "session_updated",
        )],
        UpdateSession::Conflict { .. } => Vec::new(),
    })
}

pub(super) async fn create<S: Store>(
    store: &S,
    state: SessionState,
    envelope: Option<EnvelopeRecord>,
    import: Option<EnvelopeImport>,
) -> CreateSession {
    store
        .create_session(state, envelope, import, create_audit(0))
        .await
        .unwrap()
}

pub(super) async fn get<S: Store>(store: &S, id: &str) -> Option<SessionState> {
    store.get_session(sid(id)).await.unwrap()
}

pub(super) async fn reasons<S: Store>(store: &S) -> Vec<String> {
    audit_all(store)
        .await
        .into_iter()
        .map(|e| e.draft.reason)
        .collect()
}
