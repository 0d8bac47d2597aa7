//! Agents and tokens: registration, revocation of stored subtrees, capabilities, bearer tokens.

use std::collections::{BTreeSet, HashSet};

use warden_core::audit::{AuditDraft, Digest};
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId};
use warden_store::{Entity, StoreError, StoredAgent, TokenRecord};

use crate::changes::ChangeKind;
use crate::codec::{self, agent_out, json_in, text_in, token_out};

use crate::sql;
use crate::store::PgStore;
use crate::tx::*;
use crate::writer::{Done, Route};

pub(crate) async fn load_agents(store: &PgStore) -> Result<Vec<StoredAgent>, StoreError> {
    store.read(sql::LOAD_AGENTS, &[], agent_out).await
}

pub(crate) async fn insert_agent(
    store: &PgStore,
    agent: StoredAgent,
    audit: Vec<AuditDraft>,
) -> Result<(), StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("agents"), move |tx| {
            Box::pin(async move {
                let capabilities: Vec<&str> =
                    agent.capabilities.iter().map(ActionName::as_str).collect();
                let tools: Vec<String> = agent
                    .tools
                    .iter()
                    .map(|t| text_in(t).into_owned())
                    .collect();
                let config = agent.config.as_ref().map(json_in).transpose()?;
                let parent = agent.parent.as_ref().map(AgentId::as_str);
                let envelope = agent.envelope_id.as_ref().map(EnvelopeId::as_str);
                // A child of a revoked agent is revoked: the parent's row is held
                // FOR SHARE until this commits, so a concurrent revocation of the
                // parent (on any server) either committed first, and the child is
                // stored revoked here, or waits for this insert and then revokes
                // the child with the rest of the subtree.
                let mut status = codec::status_in(agent.status);
                if let Some(parent) = parent
                    && let Some(row) = tx.query_opt(sql::LOCK_PARENT, &[&parent]).await?
                {
                    let parent_status: &str = row.try_get(0).map_err(crate::error::column)?;
                    if parent_status == codec::status_in(AgentStatus::Revoked) {
                        status = codec::status_in(AgentStatus::Revoked);
                    }
                }
                let inserted = tx
                    .execute(
                        sql::INSERT_AGENT,
                        &[
                            &agent.id.as_str(),
                            &parent,
                            &capabilities,
                            &tools,
                            &config,
                            &status,
                            &agent.created_at.0,
                            &envelope,
                        ],
                    )
                    .await?;
                if inserted == 0 {
                    return Err(StoreError::duplicate(Entity::Agent, &agent.id));
                }
                let change = ChangeRec {
                    kind: ChangeKind::AgentInserted,
                    ids: vec![agent.id.to_string()],
                };
                Ok(Done::new((), audit, Some(change)))
            })
        })
        .await
}

pub(crate) async fn set_agent_status(
    store: &PgStore,
    ids: Vec<AgentId>,
    status: AgentStatus,
    audit: Vec<AuditDraft>,
) -> Result<(), StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("agents"), move |tx| {
            Box::pin(async move {
                let names: Vec<&str> = ids.iter().map(AgentId::as_str).collect();
                // Lock the named agents in one order (concurrent revocations of
                // overlapping subtrees queue rather than deadlock). This waits for
                // registrations of their children in flight (they hold the parent's
                // row FOR SHARE), so the cascade below sees those children.
                tx.query(sql::LOCK_AGENTS, &[&names]).await?;
                let rows = tx
                    .query(sql::SET_STATUS, &[&codec::status_in(status), &names])
                    .await?;
                let mut updated = HashSet::with_capacity(rows.len());
                for row in &rows {
                    let id: String = row.try_get(0).map_err(crate::error::column)?;
                    updated.insert(id);
                }
                if let Some(missing) = names.iter().find(|n| !updated.contains(**n)) {
                    // Dropping `tx` rolls back the agents that were found.
                    return Err(not_found(Entity::Agent, missing));
                }
                let mut changed: Vec<String> = names.iter().map(|s| s.to_string()).collect();
                if status == AgentStatus::Revoked {
                    // Revocation covers the subtree as stored, including children
                    // another server registered after the revoking server computed
                    // it. Each pass is a new snapshot; a child inserted meanwhile
                    // under an agent this transaction has locked waits for it and
                    // is then stored revoked (see `insert_agent`), so the passes end.
                    for _ in 0..CASCADE_PASSES {
                        let rows = tx.query(sql::REVOKE_DESCENDANTS, &[&names]).await?;
                        if rows.is_empty() {
                            break;
                        }
                        for row in &rows {
                            changed.push(row.try_get(0).map_err(crate::error::column)?);
                        }
                    }
                }
                let change = ChangeRec {
                    kind: ChangeKind::AgentStatus,
                    ids: changed,
                };
                Ok(Done::new((), audit, Some(change)))
            })
        })
        .await
}

pub(crate) async fn set_agent_capabilities(
    store: &PgStore,
    id: AgentId,
    capabilities: BTreeSet<ActionName>,
    audit: Vec<AuditDraft>,
) -> Result<(), StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("agents"), move |tx| {
            Box::pin(async move {
                let capabilities: Vec<&str> = capabilities.iter().map(ActionName::as_str).collect();
                let updated = tx
                    .execute(sql::SET_CAPABILITIES, &[&id.as_str(), &capabilities])
                    .await?;
                if updated == 0 {
                    return Err(not_found(Entity::Agent, &id));
                }
                let change = ChangeRec {
                    kind: ChangeKind::AgentCapabilities,
                    ids: vec![id.to_string()],
                };
                Ok(Done::new((), audit, Some(change)))
            })
        })
        .await
}

pub(crate) async fn insert_token(
    store: &PgStore,
    token: TokenRecord,
    audit: Vec<AuditDraft>,
) -> Result<(), StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("tokens"), move |tx| {
            Box::pin(async move {
                let (kind, agent) = codec::subject_in(&token.subject);
                let token_id = text_in(&token.token_id).into_owned();
                let hash: &[u8] = &token.hash.0;
                let inserted = tx
                    .execute(
                        sql::INSERT_TOKEN,
                        &[
                            &token_id,
                            &hash,
                            &kind,
                            &agent,
                            &token.created_at.0,
                            &token.revoked,
                        ],
                    )
                    .await?;
                if inserted == 0 {
                    return Err(StoreError::duplicate(Entity::Token, token.token_id));
                }
                let change = ChangeRec {
                    kind: ChangeKind::TokenInserted,
                    ids: vec![token.token_id.clone()],
                };
                Ok(Done::new((), audit, Some(change)))
            })
        })
        .await
}

pub(crate) async fn find_token(
    store: &PgStore,
    hash: Digest,
) -> Result<Option<TokenRecord>, StoreError> {
    let hash: &[u8] = &hash.0;
    Ok(store
        .read(sql::FIND_TOKEN, &[&hash], token_out)
        .await?
        .into_iter()
        .next())
}

pub(crate) async fn revoke_token(
    store: &PgStore,
    token_id: String,
    audit: Vec<AuditDraft>,
) -> Result<bool, StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("tokens"), move |tx| {
            Box::pin(async move {
                let encoded = text_in(&token_id).into_owned();
                if tx.execute(sql::REVOKE_TOKEN, &[&encoded]).await? == 0 {
                    return Ok(Done::new(false, Vec::new(), None));
                }
                let change = ChangeRec {
                    kind: ChangeKind::TokenRevoked,
                    ids: vec![token_id],
                };
                Ok(Done::new(true, audit, Some(change)))
            })
        })
        .await
}
