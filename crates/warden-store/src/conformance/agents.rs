//! Agents: registration, status, capabilities.

use super::*;

/// Agents round-trip every field and load in registration order; each
/// insert appends its audit entries.
pub async fn agents_insert_and_load<S: Store>(store: S) {
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
        store.insert_agent(a.clone(), register(name)).await.unwrap();
        expected.push(a);
    }
    assert_eq!(store.load_agents().await.unwrap(), expected);
    let entries = audit_all(&store).await;
    let resources: Vec<&str> = entries.iter().map(|e| e.draft.resource.as_str()).collect();
    assert_eq!(resources, ["root", "mid", "leaf", "alpha"]);
    assert_chain(&store).await;
}

/// A duplicate agent id is `Duplicate` and changes nothing.
pub async fn agents_duplicate_is_rejected<S: Store>(store: S) {
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
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Agent, ref id } if id == "root"),
        "{err:?}"
    );
    assert_eq!(
        store.load_agents().await.unwrap(),
        vec![agent("root", None)]
    );
    assert_eq!(
        head_count(&store).await,
        1,
        "a failed insert appended audit entries"
    );
}

/// Status changes apply to every listed agent and append their entries.
pub async fn agents_status_update<S: Store>(store: S) {
    for (n, p) in [("root", None), ("mid", Some("root")), ("leaf", Some("mid"))] {
        store.insert_agent(agent(n, p), register(n)).await.unwrap();
    }
    store
        .set_agent_status(
            vec![id("mid"), id("leaf")],
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
    store
        .set_agent_status(vec![id("leaf")], AgentStatus::Active, vec![])
        .await
        .unwrap();
    let leaf = store.load_agents().await.unwrap().pop().unwrap();
    assert_eq!(leaf.status, AgentStatus::Active);
    assert_eq!(head_count(&store).await, 4);
    assert_chain(&store).await;
}

/// A status change naming an unknown agent is `NotFound` and changes
/// nothing, not even the known agents listed with it.
pub async fn agents_status_unknown_changes_nothing<S: Store>(store: S) {
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    let err = store
        .set_agent_status(
            vec![id("root"), id("ghost")],
            AgentStatus::Revoked,
            vec![draft(
                "@operator",
                "agent.revoke",
                "root",
                Verdict::Allow,
                "revoked",
            )],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Agent, ref id } if id == "ghost"),
        "{err:?}"
    );
    assert_eq!(
        store.load_agents().await.unwrap()[0].status,
        AgentStatus::Active
    );
    assert_eq!(head_count(&store).await, 1);
}

/// Capabilities are replaced; an unknown agent is `NotFound` and appends
/// nothing.
pub async fn agents_capabilities_update<S: Store>(store: S) {
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
    store
        .set_agent_capabilities(
            id("kid"),
            caps.clone(),
            vec![draft(
                "@operator",
                "agent.capabilities",
                "kid",
                Verdict::Allow,
                "updated",
            )],
        )
        .await
        .unwrap();
    let agents = store.load_agents().await.unwrap();
    assert_eq!(agents[1].capabilities, caps);
    assert_eq!(agents[0].capabilities, agent("root", None).capabilities);
    assert_eq!(head_count(&store).await, 3);
    let err = store
        .set_agent_capabilities(
            id("ghost"),
            caps,
            vec![draft(
                "@operator",
                "agent.capabilities",
                "ghost",
                Verdict::Allow,
                "updated",
            )],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Agent, ref id } if id == "ghost"),
        "{err:?}"
    );
    assert_eq!(head_count(&store).await, 3);
    assert_chain(&store).await;
}
