//! Changes made by another node sharing the store: the engine applies them
//! to its cached hierarchy (`apply_agents`, `reload_agents`,
//! `refresh_agent`) without recording anything again.
//!
//! "Another node" is simulated by writing to the engine's store directly,
//! as a second engine over the same database would.

use std::collections::BTreeSet;
use warden::Missing;

use serde_json::json;
use warden::{Caller, EngineError, RegisterAgent};
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::{AgentStatus, HierarchyError};
use warden_core::ids::ActionName;
use warden_core::time::Timestamp;
use warden_store::{Store, StoredAgent};

use crate::support::*;

fn action(s: &str) -> ActionName {
    ActionName::parse(s).unwrap()
}

fn remote(name: &str, parent: &str, caps: &[&str]) -> StoredAgent {
    StoredAgent {
        id: id(name),
        parent: Some(id(parent)),
        capabilities: caps.iter().map(|c| action(c)).collect(),
        tools: Vec::new(),
        config: Some(json!({"model": "remote"})),
        status: AgentStatus::Active,
        created_at: Timestamp(5),
        envelope_id: Some(EnvelopeId::parse(&format!("env-{name}")).unwrap()),
    }
}

async fn stored(e: &warden::Engine<warden_store::MemoryStore>, name: &str) -> StoredAgent {
    e.store()
        .load_agents()
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.id == id(name))
        .unwrap()
}

async fn audit_len(e: &warden::Engine<warden_store::MemoryStore>) -> u64 {
    e.store().audit_head().await.unwrap().count
}

#[tokio::test]
async fn an_agent_registered_elsewhere_is_applied_without_recording() {
    let e = lab().await;
    // Another node registers a child of `formatter` and, before it, a
    // grandchild is listed first: parents are placed first regardless.
    let child = remote(
        "remote_child",
        "formatter",
        &["memory.read", "report.export"],
    );
    let grandchild = remote("remote_grandchild", "remote_child", &["memory.read"]);
    e.store().insert_agent(child.clone(), vec![]).await.unwrap();
    e.store()
        .insert_agent(grandchild.clone(), vec![])
        .await
        .unwrap();
    assert!(matches!(
        e.agent(&id("remote_child")),
        Err(EngineError::NotFound {
            what: Missing::Agent,
            ..
        })
    ));
    let before = audit_len(&e).await;
    let applied = e
        .apply_agents(vec![grandchild.clone(), child.clone()])
        .await
        .unwrap();
    assert_eq!(
        applied.registered,
        vec![id("remote_grandchild"), id("remote_child")]
    );
    let view = e.agent(&id("remote_grandchild")).unwrap();
    assert_eq!(
        view.lineage,
        vec![
            id("remote_grandchild"),
            id("remote_child"),
            id("formatter"),
            id("researcher"),
            id("report_manager")
        ]
    );
    // Effective capabilities are computed as for a local registration:
    // `report.export` is not the formatter's to pass down.
    let child_view = e.agent(&id("remote_child")).unwrap();
    assert_eq!(
        child_view.effective_capabilities,
        vec![action("memory.read")]
    );
    assert_eq!(child_view.config, Some(json!({"model": "remote"})));
    assert_eq!(
        child_view.envelope_id,
        Some(EnvelopeId::parse("env-remote_child").unwrap())
    );
    assert_eq!(audit_len(&e).await, before, "applying records nothing");
    // Applying the same agents again changes nothing.
    assert!(
        e.apply_agents(vec![child, grandchild])
            .await
            .unwrap()
            .is_empty()
    );
    // The agent acts on this node.
    let r = e
        .read(
            &id("remote_grandchild"),
            &ns("project"),
            &key("client_region"),
        )
        .await
        .unwrap();
    assert_eq!(r.value.unwrap().value, json!("EU"));
}

#[tokio::test]
async fn a_revocation_elsewhere_revokes_the_cached_subtree() {
    let e = lab().await;
    e.store()
        .set_agent_status(vec![id("researcher")], AgentStatus::Revoked, vec![])
        .await
        .unwrap();
    let before = audit_len(&e).await;
    let applied = e
        .apply_agents(vec![stored(&e, "researcher").await])
        .await
        .unwrap();
    assert_eq!(applied.revoked, vec![id("researcher"), id("formatter")]);
    for agent in ["researcher", "formatter"] {
        let r = e
            .read(&id(agent), &ns("project"), &key("client_region"))
            .await
            .unwrap();
        assert_eq!(r.decision.reason.as_str(), "agent_revoked", "{agent}");
    }
    assert_eq!(
        e.agent(&id("report_manager")).unwrap().status,
        AgentStatus::Active
    );
    // Two denied reads, nothing for the revocation itself.
    assert_eq!(audit_len(&e).await, before + 2);
    // Revocation is final: a stored `active` does not bring it back.
    let mut active = stored(&e, "researcher").await;
    active.status = AgentStatus::Active;
    assert!(e.apply_agents(vec![active]).await.unwrap().is_empty());
    assert_eq!(
        e.agent(&id("researcher")).unwrap().status,
        AgentStatus::Revoked
    );
}

#[tokio::test]
async fn changed_capabilities_are_recomputed_below() {
    let e = lab().await;
    let narrowed: BTreeSet<ActionName> = [action("memory.read")].into_iter().collect();
    e.store()
        .set_agent_capabilities(id("researcher"), narrowed.clone(), vec![])
        .await
        .unwrap();
    let applied = e.reload_agents().await.unwrap();
    assert_eq!(applied.capabilities_changed, vec![id("researcher")]);
    assert_eq!(
        e.agent(&id("researcher")).unwrap().declared_capabilities,
        vec![action("memory.read")]
    );
    // The formatter declared artifact.save; its parent no longer has it.
    assert_eq!(
        e.agent(&id("formatter")).unwrap().effective_capabilities,
        vec![action("memory.read")]
    );
    assert!(e.reload_agents().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_agent_stored_under_a_parent_revoked_since_is_placed_revoked() {
    let e = lab().await;
    // This node revoked the researcher; another registered a child of it
    // concurrently (its store row may even say active).
    e.revoke_agent(&Caller::Operator, &id("researcher"))
        .await
        .unwrap()
        .revoked()
        .unwrap();
    let late = remote("late_child", "researcher", &["memory.read"]);
    e.store().insert_agent(late.clone(), vec![]).await.unwrap();
    let applied = e.apply_agents(vec![late]).await.unwrap();
    assert_eq!(applied.registered, vec![id("late_child")]);
    // It was never active here: registered, placed revoked.
    assert!(applied.revoked.is_empty());
    assert_eq!(
        e.agent(&id("late_child")).unwrap().status,
        AgentStatus::Revoked
    );
    assert_eq!(
        e.agent(&id("formatter")).unwrap().status,
        AgentStatus::Revoked
    );
}

#[tokio::test]
async fn an_unknown_parent_is_an_error_and_changes_nothing() {
    let e = lab().await;
    let orphan = remote("orphan", "nobody", &[]);
    let mut revoked = stored(&e, "formatter").await;
    revoked.status = AgentStatus::Revoked;
    let err = e.apply_agents(vec![revoked, orphan]).await.unwrap_err();
    assert!(
        matches!(
            &err,
            EngineError::Internal(cause) if cause.downcast_ref::<HierarchyError>().is_some()
        ),
        "{err:?}"
    );
    // Nothing was applied, not even the valid revocation listed with it.
    assert_eq!(
        e.agent(&id("formatter")).unwrap().status,
        AgentStatus::Active
    );
    assert!(e.agent(&id("orphan")).is_err());
}

#[tokio::test]
async fn requests_naming_an_agent_registered_elsewhere_find_it() {
    let e = lab().await;
    let elsewhere = remote("elsewhere", "researcher", &["memory.read"]);
    e.store()
        .insert_agent(elsewhere.clone(), vec![])
        .await
        .unwrap();
    // A token's agent this node has not heard of yet.
    assert!(e.refresh_agent(&id("elsewhere")).await.unwrap());
    assert!(!e.refresh_agent(&id("never_registered")).await.unwrap());
    // Registering under a parent registered elsewhere works at once.
    let parent = StoredAgent {
        envelope_id: None,
        ..remote("remote_parent", "researcher", &["memory.read"])
    };
    e.store().insert_agent(parent, vec![]).await.unwrap();
    let view = e
        .register_agent(
            &Caller::Operator,
            RegisterAgent {
                id: id("local_child"),
                parent: Some(id("remote_parent")),
                capabilities: [action("memory.read")].into_iter().collect(),
                tools: None,
                config: None,
            },
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    assert_eq!(view.lineage.get(1), Some(&id("remote_parent")));
    // And so does revoking one.
    let other = remote("remote_other", "researcher", &[]);
    e.store().insert_agent(other, vec![]).await.unwrap();
    let revoked = e
        .revoke_agent(&Caller::Operator, &id("remote_other"))
        .await
        .unwrap()
        .revoked()
        .unwrap();
    assert_eq!(revoked, vec![id("remote_other")]);
}
