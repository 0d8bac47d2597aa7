//! Keeping a server's cached hierarchy in step with the other servers that
//! share its PostgreSQL database.
//!
//! Each `warden serve` on PostgreSQL subscribes to the store's change feed
//! (`PgStore::subscribe`) *before* its engine loads the agents, then runs
//! [`follow`] in a background task:
//!
//! - an agent change (registered, status, capabilities) re-reads the named
//!   agents (`PgStore::agents_by_id`) and applies them to the engine's
//!   cache (`Engine::apply_agents`), recording nothing: the server that
//!   made the change recorded the decision;
//! - a token revocation takes the named tokens out of the engine's token
//!   cache (`Engine::forget_tokens`); an issue needs nothing (a token not
//!   cached is read from the database);
//! - after a lost listener connection (`Resumed`), and every sync interval
//!   regardless, the whole hierarchy is reconciled from `load_agents`
//!   (`Engine::reload_agents`) through the connection pool and the token
//!   cache emptied (`Engine::forget_all_tokens`), so a missed or failed
//!   notification is repaired within one interval even while the listener
//!   is down.
//!
//! A change this server made itself arrives too and finds the cache already
//! up to date.

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use warden::Engine;
use warden_core::ids::AgentId;
use warden_postgres::{Change, ChangeEvent, ChangeKind, ChangeStream, PgStore};
use warden_server::Metered;

use crate::store::AnyStore;

/// The engine a server runs.
type ServerEngine = Engine<Metered<AnyStore>>;

/// Apply every change from `changes` to `engine`'s cache, and reconcile the
/// whole hierarchy every `interval`, until the runtime stops.
pub async fn follow(
    store: PgStore,
    mut changes: ChangeStream,
    engine: ServerEngine,
    interval: Duration,
) {
    let mut heartbeat = tokio::time::interval(interval);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    heartbeat.reset();
    let mut listening = true;
    loop {
        tokio::select! {
            event = changes.recv(), if listening => match event {
                Some(ChangeEvent::Change(change)) => apply(&store, &engine, change).await,
                Some(ChangeEvent::Disconnected) => tracing::warn!(
                    "change listener disconnected: hierarchy changes by other servers apply at the next sync ({} ms)",
                    interval.as_millis()
                ),
                Some(ChangeEvent::Resumed { seq }) => {
                    tracing::info!(seq, "change listener resumed");
                    reconcile(&engine, "resumed").await;
                }
                None => {
                    tracing::warn!("change stream ended: syncing every interval only");
                    listening = false;
                }
            },
            _ = heartbeat.tick() => reconcile(&engine, "interval").await,
        }
    }
}

async fn apply(store: &PgStore, engine: &ServerEngine, change: Change) {
    match change.kind {
        ChangeKind::AgentInserted | ChangeKind::AgentStatus | ChangeKind::AgentCapabilities => {}
        ChangeKind::TokenRevoked => {
            let ids: Vec<&str> = change.ids.iter().map(String::as_str).collect();
            engine.forget_tokens(&ids);
            return;
        }
        // A token not cached is read from the database.
        ChangeKind::TokenInserted => return,
    }
    let ids: Vec<AgentId> = change
        .ids
        .iter()
        .filter_map(|id| AgentId::parse(id).ok())
        .collect();
    let agents = match store.agents_by_id(&ids).await {
        Ok(agents) => agents,
        Err(e) => {
            tracing::warn!(seq = change.seq, error = %e, "cannot read changed agents; reconciling at the next sync");
            return;
        }
    };
    match engine.apply_agents(agents).await {
        Ok(applied) if !applied.is_empty() => tracing::info!(
            seq = change.seq,
            registered = ?applied.registered,
            revoked = ?applied.revoked,
            capabilities_changed = ?applied.capabilities_changed,
            "applied a change made by another server"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(seq = change.seq, error = %e, "cannot apply a change; reconciling now");
            reconcile(engine, "failed change").await;
        }
    }
}

async fn reconcile(engine: &ServerEngine, why: &str) {
    // First, so a token revoked behind a lost notification is read again
    // even when the reload below fails.
    engine.forget_all_tokens();
    match engine.reload_agents().await {
        Ok(applied) if !applied.is_empty() => tracing::info!(
            why,
            registered = ?applied.registered,
            revoked = ?applied.revoked,
            capabilities_changed = ?applied.capabilities_changed,
            "reconciled the hierarchy with the database"
        ),
        Ok(_) => tracing::debug!(why, "hierarchy in step with the database"),
        Err(e) => tracing::warn!(why, error = %e, "cannot reconcile the hierarchy"),
    }
}
