//! Context envelopes and escalations: compare-and-set on versions, resolution and consumption exactly once.

use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, ConsumedEscalation, Entity, EscalationRecord, EscalationResolution, EscalationStatus,
    EscalationTarget, PutEnvelope, PutEscalation, ResolveEscalation, StoreError,
};

use crate::codec::{self, text_in, u64_in, u64_out};

use crate::sql;
use crate::store::PgStore;
use crate::tx::*;
use crate::writer::{Done, Route};

pub(crate) async fn put_envelope(
    store: &PgStore,
    record: EnvelopeRecord,
    expected_version: Option<u64>,
    audit: AuditFn<PutEnvelope>,
) -> Result<PutEnvelope, StoreError> {
    let route = record.envelope_id.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                let id = record.envelope_id.as_str();
                let version = u64_in(record.version, "envelope version")?;
                let text = codec::envelope_in(&record)?;
                let expected = expected_version
                    .map(|v| u64_in(v, "envelope version"))
                    .transpose()?;
                // The decision is one conditional statement on the envelope's head
                // row: a concurrent writer of the same envelope waits for this
                // transaction and then re-checks its condition against what it
                // committed (READ COMMITTED), so of two folds from one version
                // exactly one writes.
                let won = match expected {
                    None => {
                        tx.execute(sql::CREATE_ENVELOPE_HEAD, &[&id, &version])
                            .await?
                    }
                    Some(expected) => {
                        tx.execute(sql::ADVANCE_ENVELOPE_HEAD, &[&id, &version, &expected])
                            .await?
                    }
                } == 1;
                let outcome = if won {
                    tx.execute(sql::INSERT_ENVELOPE, &[&id, &version, &text])
                        .await?;
                    PutEnvelope::Written
                } else {
                    let current = tx
                        .query_opt(sql::ENVELOPE_HEAD, &[&id])
                        .await?
                        .map(|row| {
                            let v: i64 = row.try_get(0).map_err(crate::error::column)?;
                            u64_out(v, "envelope version")
                        })
                        .transpose()?;
                    PutEnvelope::Conflict { current }
                };
                let drafts = audit(&outcome);
                Ok(Done::new(outcome, drafts, None))
            })
        })
        .await
}

pub(crate) async fn get_envelope(
    store: &PgStore,
    envelope_id: EnvelopeId,
    version: Option<u64>,
) -> Result<Option<EnvelopeRecord>, StoreError> {
    let id = envelope_id.as_str();
    let rows = match version {
        None => {
            store
                .read(sql::LATEST_ENVELOPE, &[&id], codec::envelope_out)
                .await?
        }
        Some(v) => {
            let Ok(v) = i64::try_from(v) else {
                return Ok(None);
            };
            store
                .read(sql::ENVELOPE_VERSION, &[&id, &v], codec::envelope_out)
                .await?
        }
    };
    Ok(rows.into_iter().next())
}

pub(crate) async fn put_escalation(
    store: &PgStore,
    escalation: EscalationRecord,
    audit: AuditFn<PutEscalation>,
) -> Result<PutEscalation, StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("escalations"), move |tx| {
            Box::pin(async move {
                let e = &escalation;
                let escalation_id = text_in(&e.escalation_id).into_owned();
                let target = codec::target_in(&e.target)?;
                let requested_by = e.requested_by.to_string();
                let operation = text_in(&e.operation).into_owned();
                let resource = text_in(&e.resource).into_owned();
                let reason = text_in(e.reason.as_str()).into_owned();
                let envelope = e.envelope_id.as_ref().map(EnvelopeId::as_str);
                let envelope_version = e
                    .envelope_version
                    .map(|v| u64_in(v, "envelope version"))
                    .transpose()?;
                let classification = e.classification.as_str();
                let obligations = codec::obligations_in(&e.obligations)?;
                let status = e.status.as_str();
                let resolved_by = e.resolved_by.as_ref().map(Subject::to_string);
                let resolved_at = e.resolved_at.map(|t| t.0);
                let rejection_reason = e
                    .rejection_reason
                    .as_deref()
                    .map(|r| text_in(r).into_owned());
                let consumed_at = e.consumed_at.map(|t| t.0);
                let request = e.request.as_ref().map(|r| {
                    String::from_utf8_lossy(&warden_core::canonical::to_canonical(r)).into_owned()
                });
                for _ in 0..PUT_ATTEMPTS {
                    let inserted = tx
                        .execute(
                            sql::INSERT_ESCALATION,
                            &[
                                &escalation_id,
                                &target,
                                &requested_by,
                                &operation,
                                &resource,
                                &reason,
                                &envelope,
                                &envelope_version,
                                &classification,
                                &obligations,
                                &status,
                                &e.created_at.0,
                                &resolved_by,
                                &resolved_at,
                                &rejection_reason,
                                &consumed_at,
                                &request,
                            ],
                        )
                        .await?;
                    let outcome = if inserted == 1 {
                        PutEscalation::Created
                    } else if tx
                        .query_opt(sql::ESCALATION_EXISTS, &[&escalation_id])
                        .await?
                        .is_some()
                    {
                        return Err(StoreError::duplicate(
                            Entity::Escalation,
                            escalation.escalation_id,
                        ));
                    } else {
                        match tx.query_opt(sql::OPEN_ESCALATION, &[&target]).await? {
                            Some(row) => {
                                PutEscalation::Existing(Box::new(codec::escalation_out(&row)?))
                            }
                            // The open escalation that blocked the insert was
                            // consumed or rejected since: decide again.
                            None => {
                                continue;
                            }
                        }
                    };
                    let drafts = audit(&outcome);
                    return Ok(Done::new(outcome, drafts, None));
                }
                Err(StoreError::backend(format!(
                    "the escalation `{}` lost {PUT_ATTEMPTS} races with concurrent writers",
                    escalation.escalation_id
                )))
            })
        })
        .await
}

pub(crate) async fn get_escalation(
    store: &PgStore,
    escalation_id: String,
) -> Result<Option<EscalationRecord>, StoreError> {
    let id = text_in(&escalation_id).into_owned();
    Ok(store
        .read(sql::GET_ESCALATION, &[&id], codec::escalation_out)
        .await?
        .into_iter()
        .next())
}

pub(crate) async fn list_escalations(
    store: &PgStore,
    status: Option<EscalationStatus>,
) -> Result<Vec<EscalationRecord>, StoreError> {
    let status = status.map(EscalationStatus::as_str);
    store
        .read(sql::LIST_ESCALATIONS, &[&status], codec::escalation_out)
        .await
}

pub(crate) async fn resolve_escalation(
    store: &PgStore,
    escalation_id: String,
    resolution: EscalationResolution,
    by: Subject,
    at: Timestamp,
    audit: AuditFn<ResolveEscalation>,
) -> Result<ResolveEscalation, StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("escalations"), move |tx| {
            Box::pin(async move {
                let id = text_in(&escalation_id).into_owned();
                let (status, rejection_reason) = match &resolution {
                    EscalationResolution::Approve => (EscalationStatus::Approved, None),
                    EscalationResolution::Reject { reason } => (
                        EscalationStatus::Rejected,
                        Some(text_in(reason).into_owned()),
                    ),
                };
                let by = by.to_string();
                // Exactly once: a concurrent resolver's update waits for this one
                // and then finds the escalation no longer pending.
                let resolved = tx
                    .query_opt(
                        sql::RESOLVE_ESCALATION,
                        &[&id, &status.as_str(), &by, &at.0, &rejection_reason],
                    )
                    .await?;
                let outcome = match resolved {
                    Some(row) => {
                        ResolveEscalation::Resolved(Box::new(codec::escalation_out(&row)?))
                    }
                    None => match tx.query_opt(sql::GET_ESCALATION, &[&id]).await? {
                        Some(row) => {
                            ResolveEscalation::NotPending(Box::new(codec::escalation_out(&row)?))
                        }
                        None => ResolveEscalation::NotFound,
                    },
                };
                let drafts = audit(&outcome);
                Ok(Done::new(outcome, drafts, None))
            })
        })
        .await
}

pub(crate) async fn consume_escalation(
    store: &PgStore,
    target: EscalationTarget,
    at: Timestamp,
    audit: AuditFn<Option<ConsumedEscalation>>,
) -> Result<Option<ConsumedEscalation>, StoreError> {
    store
        .inner
        .writers
        .write(Route::Key("escalations"), move |tx| {
            Box::pin(async move {
                let key = codec::target_in(&target)?;
                // At most one approved escalation per target (the partial unique
                // index), and one conditional update: two concurrent consumers
                // never both get it.
                let consumed = tx
                    .query_opt(sql::CONSUME_ESCALATION, &[&key, &at.0])
                    .await?
                    .map(|row| codec::escalation_out(&row))
                    .transpose()?;
                let outcome = match consumed {
                    None => None,
                    Some(escalation) => {
                        // The other requests of the slot can no longer proceed:
                        // withdrawn in this transaction.
                        let mut withdrawn = Vec::new();
                        let pending = tx
                            .query(sql::PENDING_ESCALATIONS_FOR_UPDATE, &[])
                            .await?
                            .iter()
                            .map(codec::escalation_out)
                            .collect::<Result<Vec<_>, _>>()?;
                        for p in pending {
                            if !p.target.same_slot(&target) {
                                continue;
                            }
                            let w = ConsumedEscalation::withdraw(&escalation, p, at);
                            let by = w.resolved_by.as_ref().map(Subject::to_string);
                            let reason = w.rejection_reason.clone();
                            if tx
                                .query_opt(
                                    sql::RESOLVE_ESCALATION,
                                    &[
                                        &w.escalation_id,
                                        &EscalationStatus::Rejected.as_str(),
                                        &by,
                                        &at.0,
                                        &reason,
                                    ],
                                )
                                .await?
                                .is_some()
                            {
                                withdrawn.push(w);
                            }
                        }
                        Some(ConsumedEscalation {
                            escalation,
                            withdrawn,
                        })
                    }
                };
                let drafts = audit(&outcome);
                Ok(Done::new(outcome, drafts, None))
            })
        })
        .await
}
