//! Tool-call sessions: the cost of gating one call through the engine with
//! 64 KiB of tool results recorded in the session.
//!
//! `cargo bench -p warden --bench session`
//!
//! - `session/gate/64KiB`: `session_call` of a `send_money` whose
//!   recipient a provenance rule guards, in a session holding 64 KiB of
//!   recorded results (a trusted account listing and untrusted free text),
//!   over the in-memory store: load the session, take the decoded index
//!   from the cache, capability, schema, provenance, record the call with
//!   its audit entry (one compare-and-set);
//! - `session/gate_cold/64KiB`: the same with the index decoded from its
//!   stored bytes (a call on another server, or the first after a restart);
//! - `core/provenance/64KiB`: the provenance decision alone
//!   (`ActionProvenance::decide`), the floor under both.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use warden::{CallResult, Caller, Engine, ManualClock, OpenSession, ProposedCall};
use warden_core::ids::{AgentId, CallId, SessionId};
use warden_core::time::Timestamp;
use warden_store::MemoryStore;

/// The in-memory store, shared by the warm and the cold engine.
#[derive(Clone, Default)]
struct Shared {
    inner: Arc<MemoryStore>,
}

warden_store::forward_store!(impl Store for Shared => field inner);

const POLICY: &str = r#"
policy_version: bench
environment_capabilities: [get_transactions, read_file, send_money]
actions:
  get_transactions:
    output: {trust: trusted, fields: {"[*].subject": untrusted}}
  read_file: {}
  send_money:
    arguments:
      type: object
      required: [recipient, amount]
      properties: {recipient: {type: string}, amount: {type: number}}
    tags: [state_changing]
    provenance:
      - {argument: recipient, from: [user, trusted], otherwise: escalate, match: caseless}
agents:
  - {id: agent, capabilities: [get_transactions, read_file, send_money]}
"#;

fn transactions(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| {
                json!({
                    "id": i,
                    "sender": "me",
                    "recipient": format!("GB{:020}", 10_000_000 + i),
                    "amount": 10.5 + i as f64,
                    "subject": format!("Invoice {i} for services rendered in period {}", i % 12),
                    "date": "2022-03-01",
                })
            })
            .collect(),
    )
}

fn text(bytes: usize) -> Value {
    let line = "The quarterly report is attached; please review the figures and reply. ";
    json!(line.repeat(bytes / line.len() + 1))
}

/// Sessions the bench spreads its calls over, [`CALLS_PER_SESSION`] each (a
/// session holds at most `warden::sessions::MAX_CALLS` calls): enough for
/// the iterations criterion runs at a few microseconds per call.
const SESSIONS: usize = 256;

/// Calls the bench makes in one session before moving to the next.
const CALLS_PER_SESSION: usize = 9_000;

async fn setup() -> (Engine<Shared>, Vec<SessionId>, String) {
    let engine = Engine::open(
        warden_core::bundle::compile(POLICY).unwrap(),
        Shared::default(),
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap();
    let caller = Caller::Agent(AgentId::parse("agent").unwrap());
    let list = transactions(200);
    let recipient = list[150]["recipient"].as_str().unwrap().to_owned();
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let s = SessionId::parse(&format!("bench-{i}")).unwrap();
        fill(&engine, &caller, &s, &list).await;
        sessions.push(s);
    }
    (engine, sessions, recipient)
}

async fn fill(engine: &Engine<Shared>, caller: &Caller, s: &SessionId, list: &Value) {
    engine
        .open_session(
            caller,
            OpenSession {
                session_id: Some(s.clone()),
                trusted_inputs: vec![json!("Pay what I owe for last month's invoices")],
                ..OpenSession::default()
            },
        )
        .await
        .unwrap();
    let results = [
        ("t", "get_transactions", list.clone()),
        ("f", "read_file", text(48 * 1024)),
    ];
    for (call_id, action, result) in results {
        let id = CallId::parse(call_id).unwrap();
        engine
            .session_call(
                caller,
                s,
                ProposedCall {
                    call_id: Some(id.clone()),
                    action: action.into(),
                    arguments: json!({}),
                },
            )
            .await
            .unwrap();
        engine
            .record_call_result(
                caller,
                s,
                &id,
                CallResult {
                    result,
                    ..CallResult::default()
                },
            )
            .await
            .unwrap();
    }
    let view = engine.session(caller, s).await.unwrap();
    assert!(view.index.recorded_bytes >= 64 * 1024, "{:?}", view.index);
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (engine, sessions, recipient) = rt.block_on(setup());
    let caller = Caller::Agent(AgentId::parse("agent").unwrap());
    let n = AtomicU64::new(0);
    let call = |engine: &Engine<Shared>| {
        let k = n.fetch_add(1, Ordering::Relaxed);
        let id = CallId::parse(&format!("c{k}")).unwrap();
        let s = sessions
            .get(k as usize / CALLS_PER_SESSION)
            .expect("more calls than the sessions hold: raise SESSIONS");
        let answer = rt
            .block_on(engine.session_call(
                &caller,
                s,
                ProposedCall {
                    call_id: Some(id),
                    action: "send_money".into(),
                    arguments: json!({"recipient": recipient, "amount": 10}),
                },
            ))
            .unwrap();
        assert_eq!(answer.call.verdict, warden_core::decision::Verdict::Allow);
    };
    c.bench_function("session/gate/64KiB", |b| b.iter(|| call(&engine)));
    // A fresh engine over the same store has an empty cache: every call
    // decodes the stored index (the cache is refilled by each call, so a
    // new engine is opened per batch of one).
    let store = engine.store().clone();
    c.bench_function("session/gate_cold/64KiB", |b| {
        b.iter_batched(
            || {
                rt.block_on(Engine::open(
                    warden_core::bundle::compile(POLICY).unwrap(),
                    store.clone(),
                    Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
                ))
                .unwrap()
            },
            |fresh| call(&fresh),
            criterion::BatchSize::PerIteration,
        )
    });
    let policy = warden_core::bundle::compile(POLICY).unwrap();
    let rules = policy
        .catalogue
        .by_name("send_money")
        .unwrap()
        .provenance()
        .clone();
    let state = rt
        .block_on(engine.session_sources(&caller, &sessions[0]))
        .unwrap();
    let args = json!({"recipient": recipient, "amount": 10});
    c.bench_function("core/provenance/64KiB", |b| {
        b.iter(|| std::hint::black_box(rules.decide(&args, &state)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
