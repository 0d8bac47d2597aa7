//! Agents and tokens.

use warden_core::decision::Verdict;
use warden_core::hierarchy::AgentStatus;
use warden_store::Store;

use crate::support::*;

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
