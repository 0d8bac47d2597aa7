//! Recording what a call's tool returned, and cancelling a session.

use serde_json::{Value, json};
use std::sync::Arc;
use warden_core::decision::{Subject, Verdict};
use warden_core::ids::{CallId, Label, SessionId};

use warden_core::provenance::{IndexMark, OutputTrust, SourceId, SourceIndex};
use warden_store::{
    CallStatus, EscalationTarget, IndexChange, SessionClosure, SessionStatus, SessionUpdate, Store,
};

use super::session_reasons as sr;
use super::{CallAnswer, MAX_RESULT_BYTES, MAX_SESSION_ATTEMPTS, SessionView, digest_of};
use crate::context::{Folded, check_text};
use crate::engine::{Caller, Engine, ops};
use crate::error::{ConflictKind, EngineError, Missing};

/// What a tool returned for an allowed call.
#[derive(Debug, Clone, Default)]
pub struct CallResult {
    /// The result (any JSON; structured results keep per-field trust).
    pub result: Value,
    /// The tool's error, if it failed (recorded as untrusted text).
    pub error: Option<String>,
    /// Labels the runtime reports for the result (folded into the
    /// envelope with the action's declared output labels).
    pub labels: Vec<Label>,
}

impl<S: Store> Engine<S> {
    /// Record the result of an allowed call: its fields join the session's
    /// index with the action's output trust (an action the catalogue does
    /// not declare is untrusted), its labels fold into the envelope. A
    /// second report of the same result answers the same; a different one,
    /// or one for a call that was not allowed, is a conflict and changes
    /// nothing. An unknown label is an input error and changes nothing.
    pub async fn record_call_result(
        &self,
        caller: &Caller,
        session_id: &SessionId,
        call_id: &CallId,
        report: CallResult,
    ) -> Result<CallAnswer, EngineError> {
        let size = warden_core::canonical::to_canonical(&report.result).len();
        if size > MAX_RESULT_BYTES {
            return Err(EngineError::input(
                "result",
                format!("{size} bytes is over the limit of {MAX_RESULT_BYTES}"),
            ));
        }
        if let Some(e) = &report.error
            && e.len() > MAX_RESULT_BYTES
        {
            return Err(EngineError::input("error", "too long"));
        }
        let hash = digest_of(&json!({
            "result": report.result, "error": report.error, "labels": report.labels,
        }));
        let resource = format!("{session_id}:{call_id}");
        // Unknown labels change nothing: the fold refuses them before
        // anything is written.
        for _ in 0..MAX_SESSION_ATTEMPTS {
            let now = self.now();
            let (state, cached) = self.head_for_call(caller, session_id, call_id).await?;
            let Some(call) = state.call.clone() else {
                return Err(EngineError::not_found(Missing::Call, resource));
            };
            match call.status {
                CallStatus::Completed | CallStatus::Failed => {
                    if call.result_hash != Some(hash) {
                        return Err(EngineError::Conflict {
                            kind: ConflictKind::CallResult,
                            id: call_id.to_string(),
                        });
                    }
                    let d = self.decision(
                        caller,
                        Verdict::Allow,
                        sr::CALL_REPLAYED,
                        ops::SESSION_RESULT,
                        resource.clone(),
                        now,
                    );
                    self.record(&d).await?;
                    return Ok(CallAnswer {
                        decision: d,
                        call,
                        replayed: true,
                        result: None,
                    });
                }
                CallStatus::Denied | CallStatus::Escalated => {
                    return Err(EngineError::Conflict {
                        kind: ConflictKind::CallNotAllowed,
                        id: call_id.to_string(),
                    });
                }
                CallStatus::Allowed if super::memory::executed_by_engine(call.action.as_str()) => {
                    // The engine performs memory calls and records their
                    // results itself; nobody else reports one.
                    return Err(EngineError::Conflict {
                        kind: ConflictKind::CallResult,
                        id: call_id.to_string(),
                    });
                }
                CallStatus::Allowed => {}
            }
            // The envelope first: folding only adds, so a failure after it
            // leaves the session more restricted, never less.
            let labels = self
                .fold_call_labels(caller, &state.session, &call, &report.labels, now)
                .await?;
            let mut index = self.index_to_record(&state, cached)?;
            let mark = index.mark();
            let source = SourceId::parse(call_id.as_str())
                .map_err(|e| EngineError::internal(format!("source id: {e}")))?;
            let trust = self
                .policy()
                .catalogue
                .by_name(call.action.as_str())
                .map_or_else(OutputTrust::untrusted, |a| a.provenance().output().clone());
            let recorded = match &report.error {
                None => index.record_result(source, call.action.clone(), &trust, &report.result),
                Some(e) => index.record_result(
                    source,
                    call.action.clone(),
                    &OutputTrust::untrusted(),
                    &json!({"error": e, "result": report.result}),
                ),
            }
            .map_err(|e| EngineError::input("result", e))?;
            let extra = json!({
                "fields_indexed": recorded.fields_indexed,
                "fields_unsearchable": recorded.fields_unsearchable,
            });
            if let Some((d, done)) = self
                .commit_result(
                    caller,
                    &state.session,
                    &call,
                    index,
                    Some(mark),
                    hash,
                    labels,
                    report.error.is_some(),
                    extra,
                    now,
                )
                .await?
            {
                return Ok(CallAnswer {
                    decision: d,
                    call: done,
                    replayed: false,
                    result: None,
                });
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::SessionContention,
            id: session_id.to_string(),
        })
    }

    /// Write a call's result: the call completed (or failed, `failed`) with
    /// `hash` and `labels`, the session's index now `index`, stored as
    /// what was recorded into it since `mark` (appended to the stored
    /// bytes; `None`: the index did not change), by compare-and-set on
    /// `session`'s revision, with its decision
    /// (`call_result_recorded` / `call_failed`) and `extra` in the audit
    /// entry. The decision and the call as written; `None` when another
    /// writer won (the caller reads the head again).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_result(
        &self,
        caller: &Caller,
        session: &warden_store::SessionRecord,
        call: &warden_store::CallRecord,
        index: SourceIndex,
        mark: Option<IndexMark>,
        hash: warden_core::audit::Digest,
        labels: Vec<Label>,
        failed: bool,
        extra: Value,
        now: warden_core::time::Timestamp,
    ) -> Result<Option<(warden_core::decision::Decision, warden_store::CallRecord)>, EngineError>
    {
        let mut done = call.clone();
        done.status = if failed {
            CallStatus::Failed
        } else {
            CallStatus::Completed
        };
        done.result_hash = Some(hash);
        done.result_labels = labels.clone();
        done.completed_at = Some(now);
        let d = self.decision(
            caller,
            Verdict::Allow,
            if failed {
                sr::CALL_FAILED
            } else {
                sr::CALL_RESULT_RECORDED
            },
            ops::SESSION_RESULT,
            format!("{}:{}", session.session_id, call.call_id),
            now,
        );
        let mut details = json!({
            "session_id": session.session_id,
            "call_id": call.call_id,
            "action": call.action,
            "result_hash": hash.to_hex(),
            "labels": labels,
        });
        if let (Value::Object(d), Value::Object(more)) = (&mut details, extra) {
            d.extend(more);
        }
        let draft = self.draft(&d).with_details(details);
        let mut next = session.clone();
        next.revision += 1;
        let update = SessionUpdate {
            session: next,
            sources: mark.map(|m| IndexChange::Append(index.delta_since(m))),
            call: Some(done.clone()),
        };
        if !self.commit_session(update, session.revision, draft).await? {
            return Ok(None);
        }
        self.inner.session_indexes.put(
            session.session_id.clone(),
            session.revision + 1,
            Arc::new(index),
        );
        Ok(Some((d, done)))
    }

    /// Fold a result's labels (reported, declared by the action, and the
    /// labels the gate's obligations demand) into the session's envelope
    /// through the one fold of runs and sessions; the labels the outcome
    /// carries. An unknown label is an input error and changes nothing.
    pub(super) async fn fold_call_labels(
        &self,
        caller: &Caller,
        session: &warden_store::SessionRecord,
        call: &warden_store::CallRecord,
        reported: &[Label],
        now: warden_core::time::Timestamp,
    ) -> Result<Vec<Label>, EngineError> {
        let (Some(_), Some(envelope_id)) = (self.context_policy(), &session.envelope_id) else {
            return Ok(reported.to_vec());
        };
        let extra = json!({"session_id": session.session_id, "call_id": call.call_id});
        match self
            .fold_labels(
                caller,
                envelope_id,
                call.action.as_str(),
                // The call's record proves it passed the gate; no argument
                // origins are needed (a restriction applied by origin does
                // not touch the labels the outcome carries).
                &[],
                reported,
                None,
                extra,
                now,
            )
            .await?
        {
            Folded::Unknown(labels) => Err(EngineError::input(
                "labels",
                format!("unknown label(s): {labels:?}"),
            )),
            Folded::Done { labels, .. } => Ok(labels),
        }
    }

    /// Cancel a session: later calls are refused, pending escalations of
    /// its calls are withdrawn (rejected, `session_cancelled`), recorded.
    /// The agent, an active ancestor or the operator may cancel.
    /// Cancelling a cancelled session answers it as it is.
    pub async fn cancel_session(
        &self,
        caller: &Caller,
        session_id: &SessionId,
        reason: &str,
    ) -> Result<SessionView, EngineError> {
        check_text("reason", reason)?;
        let resource = session_id.to_string();
        for _ in 0..MAX_SESSION_ATTEMPTS {
            let now = self.now();
            let state = self.session_for(caller, session_id, true).await?;
            if state.session.status == SessionStatus::Cancelled {
                return self.view_of(state).await;
            }
            let mut session = state.session.clone();
            session.revision += 1;
            session.status = SessionStatus::Cancelled;
            session.closure = Some(SessionClosure {
                by: caller.clone(),
                at: now,
                reason: reason.to_owned(),
            });
            let d = self.decision(
                caller,
                Verdict::Allow,
                sr::SESSION_CANCELLED,
                ops::SESSION_CANCEL,
                resource.clone(),
                now,
            );
            let draft = self
                .draft(&d)
                .with_details(json!({"reason": reason, "agent_id": state.session.agent}));
            let update = SessionUpdate {
                session,
                sources: None,
                call: None,
            };
            if self
                .commit_session(update, state.session.revision, draft)
                .await?
            {
                self.withdraw_escalations(caller, session_id, now).await?;
                let state = self.session_for(caller, session_id, true).await?;
                return self.view_of(state).await;
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::SessionContention,
            id: session_id.to_string(),
        })
    }

    /// Reject every pending escalation of a cancelled session's calls.
    async fn withdraw_escalations(
        &self,
        caller: &Caller,
        session_id: &SessionId,
        now: warden_core::time::Timestamp,
    ) -> Result<(), EngineError> {
        self.withdraw_pending(
            caller,
            |t| matches!(t, EscalationTarget::Call { session_id: s, .. } if s == session_id),
            sr::SESSION_CANCELLED,
            now,
        )
        .await?;
        Ok(())
    }

    /// A rejected call: recorded `Denied` (`escalation_rejected`).
    pub(crate) async fn deny_rejected_call(
        &self,
        requested_by: &Subject,
        session_id: &SessionId,
        call_id: &CallId,
        escalation_id: &str,
        now: warden_core::time::Timestamp,
    ) -> Result<(), EngineError> {
        for _ in 0..MAX_SESSION_ATTEMPTS {
            let Some(state) = self
                .inner
                .store
                .get_session_head(session_id.clone(), Some(call_id.clone()), None)
                .await?
            else {
                return Ok(());
            };
            let Some(call) = &state.call else {
                return Ok(());
            };
            if call.status != CallStatus::Escalated {
                return Ok(());
            }
            let mut denied = call.clone();
            denied.status = CallStatus::Denied;
            denied.verdict = Verdict::Deny;
            denied.reason = crate::engine::engine_reasons::ESCALATION_REJECTED;
            denied.decided_at = now;
            let d = self.decision(
                requested_by,
                Verdict::Deny,
                crate::engine::engine_reasons::ESCALATION_REJECTED,
                ops::SESSION_CALL,
                format!("{session_id}:{call_id}"),
                now,
            );
            let draft = self
                .draft(&d)
                .with_details(json!({"escalation_id": escalation_id}));
            let mut session = state.session.clone();
            session.revision += 1;
            let update = SessionUpdate {
                session,
                sources: None,
                call: Some(denied),
            };
            if self
                .commit_session(update, state.session.revision, draft)
                .await?
            {
                return Ok(());
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::SessionContention,
            id: session_id.to_string(),
        })
    }
}
