//! Memory calls of a session, executed by the engine (it owns memory).
//!
//! A session's `memory.read` or `memory.write` call passes the gate like
//! any call. Once allowed, the engine performs it (the read or write
//! records its own decision, as a run's memory step does) and records its
//! result in the session at once: a resolved value joins the session's
//! index with origin `memory` and its owner, so an argument a rule accepts
//! `from: [memory]` can be vouched for by a record the session resolved;
//! a write's result (owner and revision) is kept as a fingerprint only.
//! The runtime never reports a memory call's result; a report for one is
//! a conflict like any second, different report.
//!
//! The call's decision and its result are two compare-and-sets of the
//! session. If the process stops between them the call stays allowed with
//! no result; repeating the call (same call id, same arguments) performs
//! it then. A repeated call whose result is recorded answers from the
//! record, without the value (only its fingerprint is kept): read again
//! under a new call id.

use serde_json::{Map, Value, json};
use warden_core::decision::Decision;
use warden_core::ids::{AgentId, SessionId};
use warden_core::preflight::{MEMORY_READ, MEMORY_WRITE};
use warden_core::provenance::SourceId;
use warden_store::{CallRecord, CallStatus, Store};

use super::{CallAnswer, MAX_SESSION_ATTEMPTS, digest_of};
use crate::engine::{Caller, Engine};
use crate::error::{ConflictKind, EngineError, Missing};
use crate::steps::{MemoryCall, StepResult};

/// Whether the engine executes calls of `action` itself.
pub(crate) fn executed_by_engine(action: &str) -> bool {
    action == MEMORY_READ || action == MEMORY_WRITE
}

impl<S: Store> Engine<S> {
    /// Perform an allowed memory call of `actor`'s session and record its
    /// result (see the module docs). `decision` is the call's gate
    /// decision, answered with the call as recorded.
    pub(super) async fn execute_session_memory(
        &self,
        caller: &Caller,
        actor: &AgentId,
        session_id: &SessionId,
        call: CallRecord,
        decision: Decision,
        arguments: &Value,
    ) -> Result<CallAnswer, EngineError> {
        let empty = Map::new();
        let args = arguments.as_object().unwrap_or(&empty);
        let outcome = match MemoryCall::parse(call.action.as_str(), args) {
            Ok(m) => self.execute_memory_call(actor, m, Vec::new()).await?,
            Err(problem) => StepResult {
                error: Some(problem),
                ..StepResult::default()
            },
        };
        let report = json!({"result": outcome.result, "error": outcome.error});
        let hash = digest_of(&report);
        let resource = format!("{session_id}:{}", call.call_id);
        let source = SourceId::parse(call.call_id.as_str())
            .map_err(|e| EngineError::internal(format!("source id: {e}")))?;
        for _ in 0..MAX_SESSION_ATTEMPTS {
            let now = self.now();
            let (state, cached) = self
                .head_for_call(caller, session_id, &call.call_id)
                .await?;
            let Some(stored) = state.call.clone() else {
                return Err(EngineError::not_found(Missing::Call, resource));
            };
            if stored.status != CallStatus::Allowed {
                // Recorded meanwhile (a concurrent repeat of the call).
                return Ok(CallAnswer {
                    decision,
                    call: stored,
                    replayed: true,
                    result: None,
                });
            }
            let labels = self
                .fold_call_labels(caller, &state.session, &stored, &[], now)
                .await?;
            let mut index = self.index_to_record(&state, cached)?;
            let mark = index.mark();
            let resolved = outcome
                .result
                .as_ref()
                .filter(|_| stored.action.as_str() == MEMORY_READ);
            let mut indexed = 0;
            let mut changed = None;
            if let Some(r) = resolved {
                let owner = r
                    .get("owner_agent_id")
                    .and_then(Value::as_str)
                    .and_then(|o| AgentId::parse(o).ok());
                if let (Some(owner), Some(value)) = (owner, r.get("value")) {
                    indexed = index
                        .record_memory(source.clone(), owner, value)
                        .map_err(|e| EngineError::input("result", e))?
                        .fields_indexed;
                    changed = Some(mark);
                }
            }
            let extra = json!({
                "executed_by": "engine",
                "error": outcome.error,
                "fields_indexed": indexed,
            });
            if let Some((_, done)) = self
                .commit_result(
                    caller,
                    &state.session,
                    &stored,
                    index,
                    changed,
                    hash,
                    labels,
                    outcome.error.is_some(),
                    extra,
                    now,
                )
                .await?
            {
                let result = match &outcome.error {
                    Some(e) => json!({"error": e}),
                    None => outcome.result.clone().unwrap_or(Value::Null),
                };
                return Ok(CallAnswer {
                    decision,
                    call: done,
                    replayed: false,
                    result: Some(result),
                });
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::SessionContention,
            id: session_id.to_string(),
        })
    }
}
