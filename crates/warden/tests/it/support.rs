//! Shared fixtures: the lab scenario over an in-memory store, a recording
//! handler set, and helpers to read the decision log.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use warden::{Engine, HandlerCall, Handlers, ManualClock, WriteRequest};
use warden_core::audit::{AuditEntry, ChainVerifier};
use warden_core::ids::{ActionName, AgentId, Key, Namespace};
use warden_core::sop::Sop;
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, Store};

pub const LAB_POLICY: &str = include_str!("../../../../examples/report-hierarchy/policy.yaml");

pub fn id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

pub fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

pub fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}

pub async fn lab() -> Engine<MemoryStore> {
    lab_with(LAB_POLICY).await
}

pub async fn lab_with(policy: &str) -> Engine<MemoryStore> {
    let policy = warden_core::bundle::compile(policy).unwrap();
    Engine::open(
        policy,
        MemoryStore::new(),
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap()
}

pub fn sop(engine: &Engine<impl Store>, text: &str) -> Sop {
    warden_core::sop::parse_sop(text, &engine.policy().sop_limits).unwrap()
}

pub fn example_sop(engine: &Engine<impl Store>, name: &str) -> Sop {
    let path = format!(
        "{}/../../examples/report-hierarchy/sops/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    sop(engine, &std::fs::read_to_string(path).unwrap())
}

pub fn write_req(ns_: &str, key_: &str, value: Value) -> WriteRequest {
    WriteRequest {
        namespace: ns(ns_),
        key: key(key_),
        value,
        owner_agent_id: None,
        expected_revision: None,
        visibility: None,
        class: None,
    }
}

/// The effects recording handlers performed: (action, arguments).
pub type Effects = Arc<Mutex<Vec<(String, Value)>>>;

/// Handlers that record every effect they perform.
pub fn recording_handlers() -> (Handlers, Effects) {
    let effects: Effects = Arc::default();
    let mut handlers = Handlers::new();
    for action in [
        "document.summarize",
        "artifact.save",
        "external.upload",
        "report.export",
    ] {
        let effects = Arc::clone(&effects);
        handlers.register(
            ActionName::parse(action).unwrap(),
            move |call: HandlerCall| {
                let effects = Arc::clone(&effects);
                async move {
                    effects
                        .lock()
                        .unwrap()
                        .push((call.action.to_string(), Value::Object(call.arguments)));
                    Ok(json!({"done": call.operation_id}))
                }
            },
        );
    }
    (handlers, effects)
}

pub async fn audit(engine: &Engine<impl Store>) -> Vec<AuditEntry> {
    engine.store().audit_page(0, usize::MAX).await.unwrap()
}

pub async fn verify(engine: &Engine<impl Store>) -> u64 {
    let mut v = ChainVerifier::new();
    for e in audit(engine).await {
        v.push(&e).unwrap();
    }
    v.finish().count
}

/// One in-memory store shared by several engines (several servers on one
/// database), each engine through its own `Paused` over it, which can hold
/// one storage call of its engine before it reaches the store until the
/// test lets it go. So a test puts another engine's whole request at an
/// exact point of a request in flight (between its look for an approval
/// and its insert, say), deterministically.
#[derive(Clone)]
pub struct Paused {
    inner: Arc<MemoryStore>,
    gate: Arc<PauseGate>,
}

#[derive(Default)]
struct PauseGate {
    /// The method to hold, and how many of its calls to let pass first.
    armed: Mutex<Option<(&'static str, usize)>>,
    reached: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Paused {
    /// A view of `inner` with its own gate.
    pub fn over(inner: &Arc<MemoryStore>) -> Self {
        Self {
            inner: Arc::clone(inner),
            gate: Arc::default(),
        }
    }

    /// Hold the call of `method` after `skip` more of its calls pass.
    pub fn arm(&self, method: &'static str, skip: usize) {
        *self.gate.armed.lock().unwrap() = Some((method, skip));
    }

    /// Wait until the armed call is held.
    pub async fn reached(&self) {
        self.gate.reached.notified().await;
    }

    /// Let the held call go on.
    pub fn release(&self) {
        self.gate.release.notify_one();
    }

    async fn at(&self, method: &'static str) {
        let hold = {
            let mut armed = self.gate.armed.lock().unwrap();
            match armed.as_mut() {
                Some((m, 0)) if *m == method => {
                    *armed = None;
                    true
                }
                Some((m, n)) if *m == method => {
                    *n -= 1;
                    false
                }
                _ => false,
            }
        };
        if hold {
            self.gate.reached.notify_one();
            self.gate.release.notified().await;
        }
    }
}

impl Store for Paused {
    warden_store::forward_store!(field inner;
        load_agents, set_agent_status, set_agent_capabilities, insert_token,
        find_token, revoke_token, get_records, put_record, delete_record, owner_usage,
        append_audit, audit_page, audit_head, create_run, get_run, record_step,
        lease_step, put_envelope, get_envelope, get_escalation, list_escalations,
        resolve_escalation, create_session, get_session, get_session_head, list_sessions,
        take_request_tokens, signing_keys, insert_signing_key);

    async fn insert_agent(
        &self,
        agent: warden_store::StoredAgent,
        audit: Vec<warden_core::audit::AuditDraft>,
    ) -> Result<(), warden_store::StoreError> {
        self.at("insert_agent").await;
        self.inner.insert_agent(agent, audit).await
    }

    async fn record_step_as(
        &self,
        run_id: warden_core::ids::RunId,
        step_id: warden_core::ids::StepId,
        outcome: warden_store::StepOutcome,
        holder: Option<String>,
        audit: Vec<warden_core::audit::AuditDraft>,
    ) -> Result<warden_store::RecordStep, warden_store::StoreError> {
        self.at("record_step_as").await;
        self.inner
            .record_step_as(run_id, step_id, outcome, holder, audit)
            .await
    }

    async fn put_escalation(
        &self,
        escalation: warden_store::EscalationRecord,
        audit: warden_store::AuditFn<warden_store::PutEscalation>,
    ) -> Result<warden_store::PutEscalation, warden_store::StoreError> {
        self.at("put_escalation").await;
        self.inner.put_escalation(escalation, audit).await
    }

    async fn consume_escalation(
        &self,
        target: warden_store::EscalationTarget,
        at: Timestamp,
        audit: warden_store::AuditFn<Option<warden_store::ConsumedEscalation>>,
    ) -> Result<Option<warden_store::ConsumedEscalation>, warden_store::StoreError> {
        self.at("consume_escalation").await;
        self.inner.consume_escalation(target, at, audit).await
    }

    async fn update_session(
        &self,
        update: warden_store::SessionUpdate,
        expected_revision: u64,
        audit: warden_store::AuditFn<warden_store::UpdateSession>,
    ) -> Result<warden_store::UpdateSession, warden_store::StoreError> {
        self.at("update_session").await;
        self.inner
            .update_session(update, expected_revision, audit)
            .await
    }
}

/// Two engines over one store (two servers on one database), each with
/// its own [`Paused`] view, deciding by `policy`.
pub async fn two_servers(policy: &str) -> ((Engine<Paused>, Paused), (Engine<Paused>, Paused)) {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let mut out = Vec::new();
    for _ in 0..2 {
        let view = Paused::over(&store);
        let engine = Engine::open(
            warden_core::bundle::compile(policy).unwrap(),
            view.clone(),
            clock.clone(),
        )
        .await
        .unwrap();
        out.push((engine, view));
    }
    let b = out.pop().unwrap();
    let a = out.pop().unwrap();
    (a, b)
}
