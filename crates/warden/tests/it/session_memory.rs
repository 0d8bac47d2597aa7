//! Memory calls inside a session: the engine performs them, and a value the
//! session resolved vouches (origin `memory`, with its owner) for a rule
//! that accepts memory, across a restart too.

use std::sync::Arc;

use serde_json::{Value, json};
use warden::{CallResult, Caller, Engine, EngineError, ManualClock, OpenSession, ProposedCall};
use warden_core::decision::Verdict;
use warden_core::ids::{CallId, SessionId};
use warden_core::memory::Visibility;
use warden_core::time::Timestamp;
use warden_store::CallStatus;

use super::sessions::Shared;
use super::support::{id, key, ns, write_req};

const POLICY: &str = r#"
policy_version: session-memory-test
environment_capabilities: [memory.read, memory.write, send_email, read_inbox]
actions:
  read_inbox: {}
  send_email:
    arguments:
      type: object
      required: [to]
      properties: {to: {type: string}, body: {type: string}}
    tags: [state_changing]
    provenance:
      - {argument: to, from: [user, memory], otherwise: deny, match: caseless}
sessions: {unplanned: deny}
agents:
  - id: boss
    capabilities: [memory.read, memory.write, send_email, read_inbox]
  - id: agent
    parent: boss
    capabilities: [memory.read, memory.write, send_email, read_inbox]
"#;

const ADVISOR: &str = "advisor@corp.example";
const ATTACKER: &str = "attacker@evil.example";

async fn engine_on(store: Shared) -> Engine<Shared> {
    Engine::open(
        warden_core::bundle::compile(POLICY).unwrap(),
        store,
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap()
}

fn agent() -> Caller {
    Caller::Agent(id("agent"))
}

async fn call(
    engine: &Engine<Shared>,
    session: &SessionId,
    call_id: &str,
    action: &str,
    arguments: Value,
) -> warden::CallAnswer {
    engine
        .session_call(
            &agent(),
            session,
            ProposedCall {
                call_id: Some(CallId::parse(call_id).unwrap()),
                action: action.to_owned(),
                arguments,
            },
        )
        .await
        .unwrap()
}

/// The store's audit entries with `operation`.
async fn entries(engine: &Engine<Shared>, operation: &str) -> usize {
    use warden_store::Store;
    engine
        .store()
        .audit_page(0, usize::MAX)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.draft.operation == operation)
        .count()
}

#[tokio::test]
async fn a_resolved_memory_value_vouches_with_its_owner_and_survives_a_restart() {
    let store = Shared::default();
    let engine = engine_on(store.clone()).await;
    // The boss keeps its advisor's address, visible to its descendants.
    let mut req = write_req("contacts", "advisor", json!(ADVISOR));
    req.visibility = Some(Visibility::Descendants);
    engine.write(&id("boss"), req).await.unwrap();

    let session = SessionId::parse("s-memory").unwrap();
    engine
        .open_session(
            &agent(),
            OpenSession {
                session_id: Some(session.clone()),
                trusted_inputs: vec![json!("Email my advisor the summary.")],
                ..OpenSession::default()
            },
        )
        .await
        .unwrap();

    // Before the session resolved it, the address is vouched by nothing.
    let early = call(
        &engine,
        &session,
        "c0",
        "send_email",
        json!({"to": ADVISOR}),
    )
    .await;
    assert_eq!(early.decision.verdict, Verdict::Deny);
    assert_eq!(early.decision.reason.as_str(), "argument_not_vouched:to");

    let reads_before = entries(&engine, "memory.read").await;
    let read = call(
        &engine,
        &session,
        "c1",
        "memory.read",
        json!({"namespace": "contacts", "key": "advisor"}),
    )
    .await;
    assert_eq!(read.decision.verdict, Verdict::Allow);
    // The engine performed the read (its own decision is recorded) and
    // recorded the result itself.
    assert_eq!(entries(&engine, "memory.read").await, reads_before + 1);
    assert_eq!(read.call.status, CallStatus::Completed);
    let result = read.result.clone().unwrap();
    assert_eq!(result["value"], json!(ADVISOR));
    assert_eq!(result["owner_agent_id"], json!("boss"));

    // Nobody else reports a memory call's result: refused, nothing changed.
    let before = engine.session(&agent(), &session).await.unwrap();
    let forged = engine
        .record_call_result(
            &agent(),
            &session,
            &CallId::parse("c1").unwrap(),
            CallResult {
                result: json!({"value": ATTACKER}),
                ..CallResult::default()
            },
        )
        .await;
    assert!(
        matches!(forged, Err(EngineError::Conflict { .. })),
        "{forged:?}"
    );
    let after = engine.session(&agent(), &session).await.unwrap();
    assert_eq!(before.state, after.state);

    // Now the address is vouched by memory, with its owner.
    let send = call(
        &engine,
        &session,
        "c2",
        "send_email",
        json!({"to": ADVISOR}),
    )
    .await;
    assert_eq!(
        send.decision.verdict,
        Verdict::Allow,
        "{:?}",
        send.call.detail
    );
    let p = &send.call.detail["provenance"][0];
    assert_eq!(p["origins"], json!(["memory"]));
    assert_eq!(p["sources"][0]["owner"], json!("boss"));
    assert_eq!(p["sources"][0]["source"], json!("c1"));

    // An address memory never held stays unvouched.
    let other = call(
        &engine,
        &session,
        "c3",
        "send_email",
        json!({"to": ATTACKER}),
    )
    .await;
    assert_eq!(other.decision.verdict, Verdict::Deny);

    // A restart restores the same origin from the store.
    drop(engine);
    let engine = engine_on(store.clone()).await;
    let again = call(
        &engine,
        &session,
        "c4",
        "send_email",
        json!({"to": ADVISOR}),
    )
    .await;
    assert_eq!(again.decision.verdict, Verdict::Allow);
    assert_eq!(
        again.call.detail["provenance"][0]["origins"],
        json!(["memory"])
    );

    // The same read repeated answers from its record, without reading again.
    let reads = entries(&engine, "memory.read").await;
    let replay = call(
        &engine,
        &session,
        "c1",
        "memory.read",
        json!({"namespace": "contacts", "key": "advisor"}),
    )
    .await;
    assert!(replay.replayed);
    assert_eq!(replay.result, None);
    assert_eq!(entries(&engine, "memory.read").await, reads);
}

#[tokio::test]
async fn a_memory_call_the_gate_refuses_is_never_performed() {
    let store = Shared::default();
    let engine = engine_on(store.clone()).await;
    let session = SessionId::parse("s-refused").unwrap();
    engine
        .open_session(
            &agent(),
            OpenSession {
                session_id: Some(session.clone()),
                trusted_inputs: vec![json!("Note the meeting.")],
                plan: Some(json!({
                    "sop_id": "notes", "version": 1,
                    "steps": [{"step_id": "read", "action": "read_inbox", "arguments": {}}],
                })),
                ..OpenSession::default()
            },
        )
        .await
        .unwrap();
    let writes = entries(&engine, "memory.write").await;
    // Not in the plan: denied, and memory is untouched.
    let w = call(
        &engine,
        &session,
        "w1",
        "memory.write",
        json!({"namespace": "notes", "key": "meeting", "value": "at noon"}),
    )
    .await;
    assert_eq!(w.decision.verdict, Verdict::Deny);
    assert_eq!(w.decision.reason.as_str(), "unplanned_call");
    assert_eq!(w.result, None);
    assert_eq!(entries(&engine, "memory.write").await, writes);
    let read = engine
        .read(&id("agent"), &ns("notes"), &key("meeting"))
        .await
        .unwrap();
    assert!(read.value.is_none());
}
