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

pub fn sop(engine: &Engine<MemoryStore>, text: &str) -> Sop {
    warden_core::sop::parse_sop(text, &engine.policy().sop_limits).unwrap()
}

pub fn example_sop(engine: &Engine<MemoryStore>, name: &str) -> Sop {
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

pub async fn audit(engine: &Engine<MemoryStore>) -> Vec<AuditEntry> {
    engine.store().audit_page(0, usize::MAX).await.unwrap()
}

pub async fn verify(engine: &Engine<MemoryStore>) -> u64 {
    let mut v = ChainVerifier::new();
    for e in audit(engine).await {
        v.push(&e).unwrap();
    }
    v.finish().count
}
