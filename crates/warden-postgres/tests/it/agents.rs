//! Agents and tokens.

use std::collections::BTreeSet;

use warden_core::audit::Digest;
use warden_core::decision::Verdict;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::ActionName;
use warden_core::time::Timestamp;
use warden_store::{Store, StoreError, TokenRecord, TokenSubject};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_round_trip_in_registration_order() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    assert!(store.load_agents().await.unwrap().is_empty());
    let mut expected = Vec::new();
    for (name, parent) in [
        ("root", None),
        ("mid", Some("root")),
        ("leaf", Some("mid")),
        ("alpha", Some("root")),
    ] {
        let mut a = agent(name, parent);
        if name == "leaf" {
            a.config = None;
            a.tools = Vec::new();
            a.capabilities = BTreeSet::new();
        }
        if name == "alpha" {
            a.tools = vec!["with\0nul".into(), "esc\u{E000}".into(), "plain".into()];
            a.config = Some(serde_json::json!({"nul": "\u{0}", "n": [1, 2.5]}));
        }
        store.insert_agent(a.clone(), register(name)).await.unwrap();
        expected.push(a);
    }
    assert_eq!(store.load_agents().await.unwrap(), expected);
    let by_id = store
        .agents_by_id(&[id("alpha"), id("root"), id("ghost")])
        .await
        .unwrap();
    assert_eq!(by_id, vec![expected[0].clone(), expected[3].clone()]);
    let resources: Vec<String> = audit_all(&store)
        .await
        .into_iter()
        .map(|e| e.draft.resource)
        .collect();
    assert_eq!(resources, ["root", "mid", "leaf", "alpha"]);
    assert_chain(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_agent_is_rejected_and_changes_nothing() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    let mut other = agent("root", None);
    other.tools = vec!["other".into()];
    let err = store
        .insert_agent(other, register("root"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err:?}");
    assert_eq!(
        store.load_agents().await.unwrap(),
        vec![agent("root", None)]
    );
    assert_eq!(head_count(&store).await, 1);
    assert_eq!(store.change_head().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_changes_are_atomic() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    for (n, p) in [("root", None), ("mid", Some("root")), ("leaf", Some("mid"))] {
        store.insert_agent(agent(n, p), register(n)).await.unwrap();
    }
    let revoke = || {
        vec![draft(
            "@operator",
            "agent.revoke",
            "mid",
            Verdict::Allow,
            "revoked",
        )]
    };
    store
        .set_agent_status(vec![id("mid"), id("leaf")], AgentStatus::Revoked, revoke())
        .await
        .unwrap();
    let statuses: Vec<(String, AgentStatus)> = store
        .load_agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.id.to_string(), a.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("root".to_string(), AgentStatus::Active),
            ("mid".to_string(), AgentStatus::Revoked),
            ("leaf".to_string(), AgentStatus::Revoked)
        ]
    );
    assert_eq!(head_count(&store).await, 4);
    // An unknown id among known ones: NotFound, and nobody changes.
    let err = store
        .set_agent_status(
            vec![id("root"), id("ghost")],
            AgentStatus::Revoked,
            revoke(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { ref id, .. } if id == "ghost"),
        "{err:?}"
    );
    assert_eq!(
        store.load_agents().await.unwrap()[0].status,
        AgentStatus::Active
    );
    assert_eq!(head_count(&store).await, 4);
    // Without audit entries.
    store
        .set_agent_status(vec![id("leaf")], AgentStatus::Active, vec![])
        .await
        .unwrap();
    assert_eq!(
        store.load_agents().await.unwrap()[2].status,
        AgentStatus::Active
    );
    assert_eq!(head_count(&store).await, 4);
    assert_chain(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_replaced() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    store
        .insert_agent(agent("kid", Some("root")), register("kid"))
        .await
        .unwrap();
    let caps: BTreeSet<ActionName> = ["artifact.save", "memory.read"]
        .into_iter()
        .map(action)
        .collect();
    let audit = |n: &str| {
        vec![draft(
            "@operator",
            "agent.capabilities",
            n,
            Verdict::Allow,
            "updated",
        )]
    };
    store
        .set_agent_capabilities(id("kid"), caps.clone(), audit("kid"))
        .await
        .unwrap();
    let agents = store.load_agents().await.unwrap();
    assert_eq!(agents[1].capabilities, caps);
    assert_eq!(agents[0].capabilities, agent("root", None).capabilities);
    let err = store
        .set_agent_capabilities(id("ghost"), caps, audit("ghost"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert_eq!(head_count(&store).await, 3);
    assert_chain(&store).await;
}

fn token(token_id: &str, secret: &str, subject: TokenSubject) -> TokenRecord {
    TokenRecord {
        token_id: token_id.to_string(),
        hash: Digest::of(secret.as_bytes()),
        subject,
        created_at: Timestamp(5),
        revoked: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_found_by_hash_and_revoked_once() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let op = token("tok-op", "operator-secret", TokenSubject::Operator);
    let ag = token(
        "tok-a",
        "agent-secret",
        TokenSubject::Agent(id("researcher")),
    );
    for t in [&op, &ag] {
        let audit = vec![draft(
            "@operator",
            "token.issue",
            &t.token_id,
            Verdict::Allow,
            "issued",
        )];
        store.insert_token(t.clone(), audit).await.unwrap();
    }
    assert_eq!(store.find_token(op.hash).await.unwrap(), Some(op.clone()));
    assert_eq!(store.find_token(ag.hash).await.unwrap(), Some(ag.clone()));
    assert_eq!(store.find_token(Digest::of(b"nope")).await.unwrap(), None);
    let revoke = || {
        vec![draft(
            "@operator",
            "token.revoke",
            "tok-a",
            Verdict::Allow,
            "revoked",
        )]
    };
    assert!(store.revoke_token("tok-a".into(), revoke()).await.unwrap());
    assert_eq!(head_count(&store).await, 3);
    let found = store.find_token(ag.hash).await.unwrap().unwrap();
    assert!(found.revoked);
    assert!(!store.find_token(op.hash).await.unwrap().unwrap().revoked);
    assert!(!store.revoke_token("tok-a".into(), revoke()).await.unwrap());
    assert!(
        !store
            .revoke_token("tok-ghost".into(), revoke())
            .await
            .unwrap()
    );
    assert_eq!(head_count(&store).await, 3);
    // A token id with a NUL round-trips.
    let odd = token("odd\0id", "odd-secret", TokenSubject::Operator);
    store.insert_token(odd.clone(), vec![]).await.unwrap();
    assert_eq!(store.find_token(odd.hash).await.unwrap(), Some(odd));
    assert!(store.revoke_token("odd\0id".into(), vec![]).await.unwrap());
    assert_chain(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_token_id_or_hash_is_rejected() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let t = token("tok-1", "s1", TokenSubject::Operator);
    store.insert_token(t.clone(), vec![]).await.unwrap();
    let audit = || {
        vec![draft(
            "@operator",
            "token.issue",
            "x",
            Verdict::Allow,
            "issued",
        )]
    };
    let err = store
        .insert_token(token("tok-2", "s1", TokenSubject::Agent(id("a"))), audit())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err:?}");
    let err = store
        .insert_token(token("tok-1", "s2", TokenSubject::Operator), audit())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err:?}");
    assert_eq!(store.find_token(Digest::of(b"s2")).await.unwrap(), None);
    assert_eq!(store.find_token(t.hash).await.unwrap(), Some(t));
    assert_eq!(head_count(&store).await, 0);
}

fn status_of(agents: &[warden_store::StoredAgent], name: &str) -> AgentStatus {
    agents.iter().find(|a| a.id == id(name)).unwrap().status
}

/// Revocation covers the subtree as stored: a descendant the revoking
/// server did not name (another server registered it) is revoked in the
/// same transaction, and the change names it; a child registered under a
/// revoked agent is stored revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_covers_the_stored_subtree() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    for (n, p) in [("root", None), ("mid", Some("root")), ("leaf", Some("mid"))] {
        store.insert_agent(agent(n, p), register(n)).await.unwrap();
    }
    let head = store.change_head().await.unwrap();
    store
        .set_agent_status(
            vec![id("mid")],
            AgentStatus::Revoked,
            vec![draft(
                "@operator",
                "agent.revoke",
                "mid",
                Verdict::Allow,
                "revoked",
            )],
        )
        .await
        .unwrap();
    let agents = store.load_agents().await.unwrap();
    assert_eq!(status_of(&agents, "root"), AgentStatus::Active);
    assert_eq!(status_of(&agents, "mid"), AgentStatus::Revoked);
    assert_eq!(status_of(&agents, "leaf"), AgentStatus::Revoked);
    let changes = store.changes_since(head, 10).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].ids, ["mid", "leaf"]);

    store
        .insert_agent(agent("late", Some("leaf")), register("late"))
        .await
        .unwrap();
    let agents = store.load_agents().await.unwrap();
    assert_eq!(status_of(&agents, "late"), AgentStatus::Revoked);
    // Setting a status other than revoked does not cascade.
    store
        .set_agent_status(vec![id("leaf")], AgentStatus::Active, vec![])
        .await
        .unwrap();
    let agents = store.load_agents().await.unwrap();
    assert_eq!(status_of(&agents, "leaf"), AgentStatus::Active);
    assert_eq!(status_of(&agents, "late"), AgentStatus::Revoked);
    assert_chain(&store).await;
}

/// Servers registering children of an agent while another server revokes
/// it: whatever the interleaving, no child is left active under the
/// revoked parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registrations_racing_a_revocation_leave_no_active_child() {
    const REGISTRARS: usize = 8;
    let scratch = scratch_or_skip!();
    let setup = scratch.store().await;
    for (n, p) in [("root", None), ("parent", Some("root"))] {
        setup.insert_agent(agent(n, p), register(n)).await.unwrap();
    }
    for round in 0..3 {
        if round > 0 {
            // A fresh parent each round.
            let name = format!("parent{round}");
            setup
                .insert_agent(agent(&name, Some("root")), register(&name))
                .await
                .unwrap();
        }
        let parent = if round == 0 {
            "parent".to_string()
        } else {
            format!("parent{round}")
        };
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(REGISTRARS + 1));
        let mut tasks = Vec::new();
        for i in 0..REGISTRARS {
            let store = scratch.store_with(1).await;
            let barrier = std::sync::Arc::clone(&barrier);
            let parent = parent.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let name = format!("{parent}_child{i}");
                store
                    .insert_agent(agent(&name, Some(&parent)), register(&name))
                    .await
                    .unwrap();
            }));
        }
        let revoker = scratch.store_with(1).await;
        let barrier2 = std::sync::Arc::clone(&barrier);
        let target = parent.clone();
        tasks.push(tokio::spawn(async move {
            barrier2.wait().await;
            revoker
                .set_agent_status(vec![id(&target)], AgentStatus::Revoked, vec![])
                .await
                .unwrap();
        }));
        for t in tasks {
            t.await.unwrap();
        }
        let agents = setup.load_agents().await.unwrap();
        let children: Vec<_> = agents
            .iter()
            .filter(|a| a.parent.as_ref() == Some(&id(&parent)))
            .collect();
        assert_eq!(children.len(), REGISTRARS);
        assert!(
            children.iter().all(|a| a.status == AgentStatus::Revoked),
            "round {round}: {children:?}"
        );
    }
    assert_chain(&setup).await;
}
