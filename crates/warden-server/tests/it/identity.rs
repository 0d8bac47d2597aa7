//! Identity: operator token bootstrap, token issue and revocation, and the
//! rule that the acting agent is always the token's agent.

use serde_json::json;
use warden::{Caller, ManualClock};
use warden_core::time::Timestamp;
use warden_server::{AppState, OperatorTokenSource, ServerConfig, ensure_operator_token};
use warden_store::{MemoryStore, Store};

use crate::support::*;

async fn fresh_state() -> AppState<MemoryStore> {
    let policy = warden_core::bundle::compile(LAB_POLICY).unwrap();
    AppState::open(
        policy,
        MemoryStore::new(),
        std::sync::Arc::new(ManualClock::new(Timestamp(0))),
        ServerConfig::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn operator_token_is_generated_once_then_reported_as_existing() {
    let state = fresh_state().await;
    let first = ensure_operator_token(&state, None).await.unwrap();
    let OperatorTokenSource::Generated(secret) = first else {
        panic!("expected a generated token, got {first:?}");
    };
    assert!(secret.starts_with("wdn_") && secret.len() == 68, "{secret}");
    assert_eq!(
        ensure_operator_token(&state, None).await.unwrap(),
        OperatorTokenSource::Existing
    );
    // Only the hash is stored.
    let rec = state
        .store()
        .find_token(warden_server::auth::hash_token(&secret))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.token_id, "operator");
    assert!(!format!("{rec:?}").contains(&secret[4..]));
}

#[tokio::test]
async fn operator_token_from_the_environment_is_checked_and_stored_hashed() {
    let state = fresh_state().await;
    assert!(ensure_operator_token(&state, Some("short")).await.is_err());
    assert!(
        ensure_operator_token(&state, Some("has a space in it 0123456789abcdefgh"))
            .await
            .is_err()
    );
    assert_eq!(
        ensure_operator_token(&state, Some(OP)).await.unwrap(),
        OperatorTokenSource::Environment
    );
    // Second start with the same token: nothing new is stored.
    let before = state.store().audit_head().await.unwrap().count;
    ensure_operator_token(&state, Some(OP)).await.unwrap();
    assert_eq!(state.store().audit_head().await.unwrap().count, before);
    // An agent's token cannot be used as the operator's.
    let agent = state
        .issue_token(
            warden_store::TokenSubject::Agent(id("researcher")),
            &Caller::Operator,
        )
        .await
        .unwrap();
    let padded = agent.secret.clone();
    assert!(ensure_operator_token(&state, Some(&padded)).await.is_err());
}

#[tokio::test]
async fn tokens_are_random_hashed_and_revocable_without_revoking_the_agent() {
    let s = TestServer::start().await;
    let first = s
        .post_empty("/v1/agents/researcher/tokens", OP)
        .await
        .expect(201)
        .json();
    let second = s
        .post_empty("/v1/agents/researcher/tokens", OP)
        .await
        .expect(201)
        .json();
    let (t1, t2) = (
        first["token"].as_str().unwrap().to_owned(),
        second["token"].as_str().unwrap().to_owned(),
    );
    assert_ne!(t1, t2);
    assert_eq!(t1.len(), 4 + 64);
    // The secret appears in no audit entry; the token id does.
    let audit = s.audit().await;
    assert!(audit.iter().all(|e| !format!("{e:?}").contains(&t1[4..])));
    let id1 = first["token_id"].as_str().unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.draft.details["token_id"] == json!(id1))
    );
    // Revoke the first token: it stops working on the next request, the
    // second keeps working, the agent is untouched.
    s.get("/v1/memory/project/client_region", &t1)
        .await
        .expect(200);
    s.delete(&format!("/v1/tokens/{id1}"), OP).await.expect(200);
    s.get("/v1/memory/project/client_region", &t1)
        .await
        .expect_error(401, "token_revoked");
    s.get("/v1/memory/project/client_region", &t2)
        .await
        .expect(200);
    let view = s.get("/v1/agents/researcher", OP).await.expect(200).json();
    assert_eq!(view["status"], json!("active"));
    // Revoking twice: the token is no longer active.
    s.delete(&format!("/v1/tokens/{id1}"), OP)
        .await
        .expect_error(404, "not_found");
    s.stop().await;
}

#[tokio::test]
async fn registration_returns_a_working_token_and_the_effective_set() {
    let s = TestServer::start().await;
    let r = s
        .post(
            "/v1/agents",
            OP,
            json!({"agent_id": "auditor", "parent_id": "report_manager",
                   "capabilities": ["memory.read", "artifact.save", "external.upload"]}),
        )
        .await
        .expect(201)
        .json();
    assert_eq!(
        r["effective_capabilities"],
        json!(["artifact.save", "external.upload", "memory.read"])
    );
    let token = r["token"].as_str().unwrap();
    let me = s.get("/v1/agents/self", token).await.expect(200).json();
    assert_eq!(me["agent_id"], json!("auditor"));
    assert_eq!(me["lineage"], json!(["auditor", "report_manager"]));
    // A root agent with no parent.
    let root = s
        .post(
            "/v1/agents",
            OP,
            json!({"agent_id": "other_root", "capabilities": ["memory.read"]}),
        )
        .await
        .expect(201)
        .json();
    assert_eq!(root["parent_id"], json!(null));
    s.stop().await;
}

#[tokio::test]
async fn identity_comes_from_the_token_never_from_the_payload() {
    let s = TestServer::start().await;
    let (_, researcher, formatter) = s.lab_tokens().await;
    // A write naming another owner is the owner's write only in name.
    s.put(
        "/v1/memory/notes/x",
        &researcher,
        json!({"value": 1, "owner_agent_id": "formatter"}),
    )
    .await
    .expect_error(403, "actor_is_not_owner");
    assert!(s.record("formatter", "notes", "x").await.is_none());
    // The same key written as itself lands in the token's own scope.
    s.put("/v1/memory/notes/x", &researcher, json!({"value": 1}))
        .await
        .expect(201);
    assert!(s.record("researcher", "notes", "x").await.is_some());
    // A body field claiming an actor is not part of the contract at all.
    s.put(
        "/v1/memory/notes/y",
        &formatter,
        json!({"value": 1, "actor": "researcher"}),
    )
    .await
    .expect_error(422, "unknown_field");
    // A delegation naming another parent is refused and recorded.
    s.post(
        "/v1/agents/self/children",
        &formatter,
        json!({"agent_id": "sneaky", "parent_id": "report_manager", "capabilities": ["memory.read"]}),
    )
    .await
    .expect_error(403, "not_own_child");
    let last = s.last_audit().await;
    assert_eq!(
        (last.draft.subject.as_str(), last.draft.reason.as_str()),
        ("formatter", "not_own_child")
    );
    // Every entry this test caused names the token's agent as subject.
    for e in s.audit().await.iter().rev().take(3) {
        assert!(
            ["researcher", "formatter"].contains(&e.draft.subject.as_str()),
            "{e:?}"
        );
    }
    s.stop().await;
}
