//! A session's plan is admitted against the session's starting envelope
//! (inherited from the agent, or imported): a step the starting
//! restrictions already deny refuses the plan at open, and nothing is
//! created: no session, no envelope, no import seen; the refusal is
//! recorded. And the plan checks before anything runs: a plan document's
//! admission and provenance explanation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::BTreeSet;

use warden::{Caller, Engine, ManualClock, OpenSession, SessionOpening, SessionRefusal};
use warden_core::envelope::sign::{SignedEnvelope, SigningKey, sign};
use warden_core::envelope::{
    Envelope, EnvelopeId, EnvelopeRecord, IssuerId, Sensitivity, WorkflowId,
};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, Label, SessionId};
use warden_core::plan::{PlanDocument, parse_document};
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, Store, StoredAgent};

use super::sessions::SESSION_POLICY;
use super::support::id;

static SESSIONS_CREATED: AtomicU64 = AtomicU64::new(0);
static ENVELOPES_PUT: AtomicU64 = AtomicU64::new(0);

/// A store that counts the writes that create a session or an envelope.
/// Only [`a_plan_the_starting_envelope_denies_is_refused_at_open`] uses it,
/// so the process-wide counters are its own.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
}

impl Store for Counting {
    warden_store::forward_store!(field inner before { SESSIONS_CREATED.fetch_add(1, Ordering::SeqCst); };
        create_session);
    warden_store::forward_store!(field inner before { ENVELOPES_PUT.fetch_add(1, Ordering::SeqCst); };
        put_envelope);
    warden_store::forward_store!(field inner;
        load_agents, insert_agent, set_agent_status, set_agent_capabilities, insert_token,
        find_token, revoke_token, get_records, put_record, delete_record, owner_usage,
        append_audit, audit_page, audit_head, create_run, get_run, record_step, record_step_as,
        lease_step, get_envelope,
        put_escalation, get_escalation, list_escalations, resolve_escalation,
        consume_escalation, get_session, get_session_head, update_session, list_sessions,
        take_request_tokens, signing_keys, insert_signing_key);
}

fn writes() -> (u64, u64) {
    (
        SESSIONS_CREATED.load(Ordering::SeqCst),
        ENVELOPES_PUT.load(Ordering::SeqCst),
    )
}

const KEY: [u8; 32] = [9u8; 32];

fn policy() -> String {
    let public = SigningKey::from_bytes(&KEY).verifying_key();
    let b64 = base64::engine::general_purpose::STANDARD.encode(public.to_bytes());
    format!(
        "{SESSION_POLICY}\ncontext:\n  labels:\n    finance: confidential\n  restrictions:\n    no_payments: {{denies_tags: [state_changing]}}\ntrusted_issuers:\n  partner: \"{b64}\"\n"
    )
}

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

/// An envelope of the partner's at `version` restricted by `no_payments`.
fn token(engine: &Engine<Counting>, version: u64) -> SignedEnvelope {
    let cp = engine.policy().context.as_ref().unwrap();
    let root = Envelope::root(
        cp,
        EnvelopeId::parse("partner-env").unwrap(),
        WorkflowId::parse("partner-wf").unwrap(),
        id("remote"),
    );
    let mut record = root.to_record();
    record.version = version;
    record.restrictions = [Label::parse("no_payments").unwrap()].into_iter().collect();
    sign(
        &record,
        &IssuerId::parse("partner").unwrap(),
        &SigningKey::from_bytes(&KEY),
    )
    .unwrap()
}

fn paying_plan() -> Value {
    json!({"sop_id": "pay-bill", "version": 1, "steps": [
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": "bill.txt"}},
        {"step_id": "pay", "action": "send_money",
         "arguments": {"recipient": {"$bind": {"step": "read"}}, "amount": {"$bind": {}}}}
    ]})
}

fn reading_plan() -> Value {
    json!({"sop_id": "read-bill", "version": 1, "steps": [
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": "bill.txt"}}
    ]})
}

async fn open(
    engine: &Engine<Counting>,
    caller: &str,
    session: &str,
    plan: Value,
    from_envelope: Option<SignedEnvelope>,
) -> SessionOpening {
    engine
        .open_session(
            &Caller::Agent(id(caller)),
            OpenSession {
                session_id: Some(sid(session)),
                trusted_inputs: vec![json!("Pay the bill in bill.txt")],
                plan: Some(plan),
                from_envelope,
                ..OpenSession::default()
            },
        )
        .await
        .unwrap()
}

/// Assert `opening` is the plan's refusal for `no_payments`, recorded as
/// the log's last entry, one entry after `audit_before`, with nothing
/// created since `writes_before`.
async fn assert_refused(
    engine: &Engine<Counting>,
    opening: &SessionOpening,
    session: &str,
    audit_before: usize,
    writes_before: (u64, u64),
) {
    let SessionOpening::Refused {
        decision,
        refusal: SessionRefusal::Plan { reasons },
    } = opening
    else {
        panic!("not refused for its plan: {opening:?}");
    };
    assert_eq!(decision.reason.as_str(), "plan_rejected");
    let reasons: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
    assert_eq!(reasons, ["restricted_by:no_payments"]);
    assert!(
        engine
            .store()
            .get_session(sid(session))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(writes(), writes_before, "no session and no envelope stored");
    let log = engine.store().audit_page(0, usize::MAX).await.unwrap();
    assert_eq!(log.len(), audit_before + 1, "only the refusal is recorded");
    let last = log.last().unwrap();
    assert_eq!(last.draft.operation, "session.open");
    assert_eq!(last.draft.reason.as_str(), "plan_rejected");
    assert_eq!(last.draft.resource, session);
    assert_eq!(
        last.draft.details["reasons"],
        json!(["restricted_by:no_payments"])
    );
    assert_eq!(
        last.draft.details["envelope"]["restrictions"],
        json!(["no_payments"])
    );
    assert!(engine.verify_audit().await.unwrap().is_valid());
}

#[tokio::test]
async fn a_plan_the_starting_envelope_denies_is_refused_at_open() {
    // Inherited: `payer` holds an envelope restricted by `no_payments`
    // (stored outside the narrowing path, which would also have removed
    // the capability: so the restriction alone must refuse the plan).
    let store = Counting::default();
    let now = Timestamp(1_700_000_000_000);
    let inherited = EnvelopeId::parse("env-inherited").unwrap();
    let record = EnvelopeRecord {
        envelope_id: inherited.clone(),
        parent_envelope_id: Some(EnvelopeId::parse("env-upstream").unwrap()),
        workflow_id: WorkflowId::parse("wf-upstream").unwrap(),
        agent_id: id("payer"),
        labels: BTreeSet::new(),
        aggregate_sensitivity: Sensitivity::Internal,
        derived: BTreeSet::new(),
        delegation_depth: 1,
        restrictions: [Label::parse("no_payments").unwrap()].into_iter().collect(),
        version: 0,
    };
    store
        .put_envelope(record, None, Box::new(|_| Vec::new()))
        .await
        .unwrap();
    store
        .insert_agent(
            StoredAgent {
                id: id("payer"),
                parent: None,
                capabilities: ["read_file", "send_money"]
                    .into_iter()
                    .map(|a| ActionName::parse(a).unwrap())
                    .collect(),
                tools: Vec::new(),
                config: None,
                status: AgentStatus::Active,
                created_at: now,
                envelope_id: Some(inherited.clone()),
            },
            Vec::new(),
        )
        .await
        .unwrap();
    let engine = Engine::open(
        warden_core::bundle::compile(&policy()).unwrap(),
        store,
        Arc::new(ManualClock::new(now)),
    )
    .await
    .unwrap();
    let inherited_before = engine.envelope(&inherited, None).await.unwrap().unwrap();
    // The capability is there: only the envelope can refuse the plan.
    assert!(
        engine
            .agent(&id("payer"))
            .unwrap()
            .effective_capabilities
            .iter()
            .any(|c| c.as_str() == "send_money")
    );

    let audit_before = engine
        .store()
        .audit_page(0, usize::MAX)
        .await
        .unwrap()
        .len();
    let before = writes();
    let out = open(&engine, "payer", "inh-1", paying_plan(), None).await;
    assert_refused(&engine, &out, "inh-1", audit_before, before).await;
    // The inherited envelope is as it was.
    assert_eq!(
        engine.envelope(&inherited, None).await.unwrap().unwrap(),
        inherited_before
    );
    // The same plan for an agent without the restriction opens; a plan
    // that does not pay opens for `payer`.
    assert!(matches!(
        open(&engine, "agent", "inh-2", paying_plan(), None).await,
        SessionOpening::Opened { .. }
    ));
    let opened = open(&engine, "payer", "inh-3", reading_plan(), None).await;
    let SessionOpening::Opened { session, .. } = opened else {
        panic!("{opened:?}")
    };
    assert!(session.state.session.envelope_id.is_some());

    // Imported: the partner's envelope restricts payments.
    let audit_before = engine
        .store()
        .audit_page(0, usize::MAX)
        .await
        .unwrap()
        .len();
    let before = writes();
    let out = open(
        &engine,
        "agent",
        "imp-1",
        paying_plan(),
        Some(token(&engine, 3)),
    )
    .await;
    assert_refused(&engine, &out, "imp-1", audit_before, before).await;
    // The refused open left no trace of the import: the same version is
    // not a replay, and opens a session that reads.
    let opened = open(
        &engine,
        "agent",
        "imp-2",
        reading_plan(),
        Some(token(&engine, 3)),
    )
    .await;
    let SessionOpening::Opened { session, .. } = opened else {
        panic!("{opened:?}")
    };
    assert_eq!(session.state.session.imported.as_ref().unwrap().version, 3);
}

#[tokio::test]
async fn a_plan_document_is_checked_and_explained_and_validation_records_it() {
    let engine = Engine::open(
        warden_core::bundle::compile(SESSION_POLICY).unwrap(),
        MemoryStore::new(),
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap();
    let limits = &engine.policy().sop_limits;
    let doc = parse_document(&paying_plan(), limits).unwrap();
    assert!(doc.has_bindings());
    let check = engine.preflight_document(&id("agent"), &doc).unwrap();
    assert!(check.preflight.admitted);
    assert_eq!(
        check.provenance.findings(),
        [
            warden_core::decision::Reason::code("binding_needs_review:recipient"),
            warden_core::decision::Reason::code("binding_unguarded:amount"),
        ]
    );
    // Nothing was recorded by the check; validation records every step,
    // with its findings.
    let seeded = engine
        .store()
        .audit_page(0, usize::MAX)
        .await
        .unwrap()
        .len();
    let check = engine.preflight_document(&id("agent"), &doc).unwrap();
    assert_eq!(
        engine
            .store()
            .audit_page(0, usize::MAX)
            .await
            .unwrap()
            .len(),
        seeded
    );
    let again = engine.validate_document(&id("agent"), &doc).await.unwrap();
    assert_eq!(again, check);
    let log = engine.store().audit_page(0, usize::MAX).await.unwrap();
    let log = &log[seeded..];
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|e| e.draft.operation == "sop.validate"));
    assert_eq!(log[0].draft.details, Value::Null);
    assert_eq!(
        log[1].draft.details,
        json!({"provenance": ["binding_needs_review:recipient", "binding_unguarded:amount"]})
    );

    // A literal SOP: the document's admission is today's preflight.
    let sop_json = json!({"sop_id": "s", "version": 1, "steps": [
        {"step_id": "a", "action": "send_money", "arguments": {"recipient": "GB29", "amount": 1}},
        {"step_id": "b", "action": "shell.eval", "arguments": {}}
    ]});
    let doc = parse_document(&sop_json, limits).unwrap();
    assert!(matches!(doc, PlanDocument::Plan(_)));
    let sop = warden_core::sop::sop_from_value(&sop_json, limits).unwrap();
    let reader = id("reader");
    let check = engine.preflight_document(&reader, &doc).unwrap();
    assert_eq!(check.preflight, engine.preflight(&reader, &sop).unwrap());
    assert!(!check.preflight.admitted);
}
