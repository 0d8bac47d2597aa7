//! Tickets: what a step's gate decided, kept from `begin` to `complete`
//! (see the `steps` module). A ticket is this process's cache of the
//! decision; who may perform and complete the step is the lease in the
//! store (`Store::lease_step`), which every server sharing the database
//! sees. A leaf module: the engine holds the table, the
//! context gate fills [`Gated`], the step lifecycle issues and consumes
//! tickets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_core::envelope::{ContextGate as CoreGate, Envelope};
use warden_core::ids::{AgentId, RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{RunRecord, RunStep};

use crate::error::EngineError;

/// The run TTL when none is set: an hour.
pub(crate) const DEFAULT_RUN_TTL: Duration = Duration::from_secs(3600);

/// Most tickets kept at once; past it the oldest is dropped (its step must
/// begin again).
const MAX_TICKETS: usize = 65_536;

/// What `begin` decided for a step that may proceed.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    pub(crate) actor: AgentId,
    pub(crate) run: Arc<RunRecord>,
    pub(crate) step: RunStep,
    pub(crate) gated: Option<Box<Gated>>,
    pub(crate) issued_at: Timestamp,
    /// The holder of the step's lease in the store (see
    /// `Store::lease_step`): the completion records as this holder.
    pub(crate) holder: String,
}

/// Tickets of steps begun and not completed, by run and step.
#[derive(Debug, Default)]
pub(crate) struct Tickets {
    map: Mutex<HashMap<(RunId, StepId), Ticket>>,
}

impl Tickets {
    pub(crate) fn insert(
        &self,
        ticket: Ticket,
        now: Timestamp,
        ttl_ms: i64,
    ) -> Result<(), EngineError> {
        let mut map = self.map.lock().map_err(|_| poisoned())?;
        if map.len() >= MAX_TICKETS {
            map.retain(|_, t| now.0.saturating_sub(t.issued_at.0) < ttl_ms);
            if map.len() >= MAX_TICKETS
                && let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, t)| t.issued_at.0)
                    .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            (ticket.run.run_id.clone(), ticket.step.step_id.clone()),
            ticket,
        );
        Ok(())
    }

    /// The ticket of `run`/`step` begun by `actor`, if it is still valid
    /// and (when `holder` is given) held by `holder`.
    pub(crate) fn take(
        &self,
        actor: &AgentId,
        run: &RunId,
        step: &StepId,
        holder: Option<&str>,
        now: Timestamp,
        ttl_ms: i64,
    ) -> Result<Option<Ticket>, EngineError> {
        let mut map = self.map.lock().map_err(|_| poisoned())?;
        let key = (run.clone(), step.clone());
        match map.get(&key) {
            Some(t) if &t.actor != actor => Ok(None),
            Some(t) if holder.is_some_and(|h| h != t.holder) => Ok(None),
            Some(t) if now.0.saturating_sub(t.issued_at.0) >= ttl_ms => {
                map.remove(&key);
                Ok(None)
            }
            Some(_) => Ok(map.remove(&key)),
            None => Ok(None),
        }
    }
}

impl Tickets {
    /// Drop the ticket of `run`/`step`, whoever holds it: the step's outcome
    /// is recorded by someone else (the gate denied a later `begin` after the
    /// lease lapsed), so completing it from this ticket must not fold its
    /// labels into the run's envelope.
    pub(crate) fn forget(&self, run: &RunId, step: &StepId) -> Result<(), EngineError> {
        let mut map = self.map.lock().map_err(|_| poisoned())?;
        map.remove(&(run.clone(), step.clone()));
        Ok(())
    }
}

fn poisoned() -> EngineError {
    EngineError::internal("step tickets lock poisoned by an earlier panic")
}

/// What a step's gate decided against the run's envelope, kept in the
/// step's ticket for its completion.
#[derive(Debug, Clone)]
pub(crate) struct Gated {
    /// The envelope the gate decided against.
    pub(crate) envelope: Envelope,
    /// The core's gate: obligations, outcome labels, bypass.
    pub(crate) gate: CoreGate,
}
