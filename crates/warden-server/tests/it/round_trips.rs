//! Store round trips per request: what one pass per request costs, held
//! by a test so a change that loads something twice shows up here. The
//! server runs over a store that counts reads and write transactions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::net::TcpListener;
use warden::ManualClock;
use warden_core::time::Timestamp;
use warden_server::{AppState, ServerConfig, ensure_operator_token, serve};
use warden_store::{MemoryStore, Store};

use crate::support::*;

static READS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);

/// A store that counts reads and write transactions. One test uses it;
/// the counters are process-wide, so the test is the only one in this
/// binary that touches them.
struct Counting {
    inner: MemoryStore,
}

impl Store for Counting {
    warden_store::forward_store!(field inner before { READS.fetch_add(1, Ordering::SeqCst); };
        load_agents, find_token, get_records, owner_usage, audit_page, audit_head, get_run,
        get_envelope, get_escalation, list_escalations, get_session, get_session_head,
        list_sessions, signing_keys);
    warden_store::forward_store!(field inner before { WRITES.fetch_add(1, Ordering::SeqCst); };
        insert_agent, set_agent_status, set_agent_capabilities, insert_token, revoke_token,
        put_record, delete_record, append_audit, create_run, record_step, record_step_as, lease_step, put_envelope,
        put_escalation, resolve_escalation, consume_escalation, create_session, update_session,
        take_request_tokens, insert_signing_key);
}

fn counts() -> (u64, u64) {
    (
        READS.swap(0, Ordering::SeqCst),
        WRITES.swap(0, Ordering::SeqCst),
    )
}

async fn call(addr: std::net::SocketAddr, req: Req) -> (Resp, (u64, u64)) {
    counts();
    let r = send(addr, req).await;
    let (reads, writes) = counts();
    (r, (reads + writes, writes))
}

#[tokio::test]
async fn store_round_trips_per_request() {
    let policy = format!(
        "{LAB_POLICY}\nquotas:\n  agents:\n    researcher: {{max_records: 100, max_bytes: 100000, max_runs_in_flight: 10}}\n"
    );
    let policy = warden_core::bundle::compile(&policy).unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let state = AppState::open(
        policy,
        Counting {
            inner: MemoryStore::new(),
        },
        clock,
        ServerConfig::default(),
    )
    .await
    .unwrap();
    ensure_operator_token(&state, Some(OP)).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    let token = send(
        addr,
        Req::new("POST", "/v1/agents/researcher/tokens").token(OP),
    )
    .await
    .expect(201)
    .json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = |method: &'static str, path: &str, body: Option<Value>| {
        let req = Req::new(method, path).token(&token);
        match body {
            Some(b) => req.json(&b),
            None => req,
        }
    };
    // (calls, write transactions) per request. The first request of a
    // token looks it up; later ones find it in the engine's token cache.
    let mut seen = Vec::new();
    let (_, c) = call(addr, r("GET", "/v1/memory/project/client_region", None)).await;
    seen.push(("resolve, the token's first use", c));
    let (_, c) = call(addr, r("GET", "/v1/memory/project/client_region", None)).await;
    seen.push(("resolve", c));
    let (resp, c) = call(
        addr,
        r("PUT", "/v1/memory/notes/a", Some(json!({"value": 1}))),
    )
    .await;
    resp.expect(201);
    seen.push(("write (quota checked)", c));
    let sop = json!({"sop_id": "m", "version": 1, "steps": [
        {"step_id": "w", "action": "memory.write", "arguments": {"namespace": "notes", "key": "b", "value": 3}},
        {"step_id": "s", "action": "document.summarize", "arguments": {"document_id": "fixture-1"}}]});
    let (resp, c) = call(addr, r("POST", "/v1/runs", Some(json!({"sop": sop})))).await;
    let run = resp.expect(201).json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    seen.push(("admit", c));
    let (resp, c) = call(
        addr,
        r("POST", &format!("/v1/runs/{run}/steps/w/begin"), None),
    )
    .await;
    assert_eq!(resp.expect(200).json()["gate"], json!("executed"));
    seen.push(("begin, memory step (executed)", c));
    let (resp, c) = call(
        addr,
        r("POST", &format!("/v1/runs/{run}/steps/s/begin"), None),
    )
    .await;
    assert_eq!(resp.expect(200).json()["gate"], json!("proceed"));
    seen.push(("begin, tool step", c));
    let (resp, c) = call(
        addr,
        r(
            "POST",
            &format!("/v1/runs/{run}/steps/s/complete"),
            Some(json!({"result": {"summary": "x"}})),
        ),
    )
    .await;
    resp.expect(200);
    seen.push(("complete, tool step", c));
    for (what, (calls, writes)) in &seen {
        eprintln!("{what}: {calls} store calls, {writes} write transactions");
    }
    let got: Vec<(&str, u64, u64)> = seen.iter().map(|(w, (c, t))| (*w, *c, *t)).collect();
    assert_eq!(
        got,
        vec![
            ("resolve, the token's first use", 3, 1),
            ("resolve", 2, 1),
            ("write (quota checked)", 1, 1),
            ("admit", 3, 2),
            ("begin, memory step (executed)", 5, 3),
            ("begin, tool step", 3, 1),
            ("complete, tool step", 2, 2),
        ]
    );
    let _ = tx.send(());
    server.await.unwrap().unwrap();
}
