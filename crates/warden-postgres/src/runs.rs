//! Runs: creation under the runs-in-flight limit, exactly-once steps.

use warden_core::audit::AuditDraft;
use warden_core::envelope::EnvelopeId;
use warden_core::ids::{RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CreateRun, Entity, LeaseStep, RecordStep, RunRecord, RunState, RunStep, RunsInFlight,
    StepLease, StepOutcome, StoreError,
};

use crate::codec::{self, json_in, text_in};

use crate::memory::*;
use crate::sql;
use crate::store::PgStore;
use crate::tx::*;
use crate::writer::{Done, Route};

/// A run from the rows of [`sql::GET_RUN`] (`None` when there are none).
pub(crate) fn run_out(
    run_id: &RunId,
    rows: &[tokio_postgres::Row],
) -> Result<Option<RunState>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let col = crate::error::column;
    let agent: &str = first.try_get(0).map_err(col)?;
    let sop_hash: &[u8] = first.try_get(1).map_err(col)?;
    let sop: &str = first.try_get(2).map_err(col)?;
    let policy_version: String = first.try_get(3).map_err(col)?;
    let created_at: i64 = first.try_get(4).map_err(col)?;
    let envelope: Option<&str> = first.try_get(13).map_err(col)?;
    let mut steps = Vec::with_capacity(rows.len());
    let mut outcomes = std::collections::BTreeMap::new();
    let mut leases = std::collections::BTreeMap::new();
    for row in rows {
        let step_id: Option<&str> = row.try_get(5).map_err(col)?;
        let Some(step_id) = step_id else {
            continue;
        };
        let step_id = codec::step_id(step_id)?;
        let action: &str = row.try_get(6).map_err(col)?;
        let operation_id: String = row.try_get(7).map_err(col)?;
        if let Some(outcome) = codec::outcome_out(row, 8)? {
            outcomes.insert(step_id.clone(), outcome);
        }
        if let Some(lease) = lease_out(row, 14)? {
            leases.insert(step_id.clone(), lease);
        }
        steps.push(RunStep {
            step_id,
            action: codec::action(action)?,
            operation_id: codec::text_out(operation_id)?,
        });
    }
    Ok(Some(RunState {
        run: RunRecord {
            run_id: codec::run_id(run_id.as_str())?,
            agent: codec::agent_id(agent)?,
            sop_hash: codec::digest_out(sop_hash, "a sop hash")?,
            sop: codec::json_out(sop)?,
            steps,
            policy_version: codec::text_out(policy_version)?,
            created_at: Timestamp(created_at),
            envelope_id: envelope.map(codec::envelope_id).transpose()?,
        },
        outcomes,
        leases,
    }))
}

/// A step's lease from the columns `lease_holder, lease_acquired_at,
/// lease_expires_at` starting at `at`.
fn lease_out(row: &tokio_postgres::Row, at: usize) -> Result<Option<StepLease>, StoreError> {
    let col = crate::error::column;
    let holder: Option<String> = row.try_get(at).map_err(col)?;
    let acquired: Option<i64> = row.try_get(at + 1).map_err(col)?;
    let expires: Option<i64> = row.try_get(at + 2).map_err(col)?;
    match (holder, acquired, expires) {
        (None, None, None) => Ok(None),
        (Some(holder), Some(acquired), Some(expires)) => Ok(Some(StepLease {
            holder: codec::text_out(holder)?,
            acquired_at: Timestamp(acquired),
            expires_at: Timestamp(expires),
        })),
        _ => Err(codec::corrupt("a step's lease is partly set")),
    }
}

pub(crate) async fn lease_step(
    store: &PgStore,
    run_id: RunId,
    step_id: StepId,
    lease: StepLease,
    audit: AuditFn<LeaseStep>,
) -> Result<LeaseStep, StoreError> {
    let route = run_id.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                let (run, step) = (run_id.as_str(), step_id.as_str());
                let holder = text_in(&lease.holder).into_owned();
                let updated = tx
                    .execute(
                        sql::LEASE_STEP,
                        &[
                            &run,
                            &step,
                            &holder,
                            &lease.acquired_at.0,
                            &lease.expires_at.0,
                        ],
                    )
                    .await?;
                let outcome = if updated == 1 {
                    LeaseStep::Granted
                } else {
                    let Some(row) = tx.query_opt(sql::STEP_OUTCOME, &[&run, &step]).await? else {
                        return Err(if tx.query_opt(sql::RUN_EXISTS, &[&run]).await?.is_none() {
                            not_found(Entity::Run, &run_id)
                        } else {
                            not_found(Entity::Step, format!("{run_id}/{step_id}"))
                        });
                    };
                    match (codec::outcome_out(&row, 0)?, lease_out(&row, 5)?) {
                        (Some(recorded), _) => LeaseStep::Recorded(recorded),
                        (None, Some(held)) => LeaseStep::Held(held),
                        (None, None) => {
                            return Err(StoreError::backend(format!(
                                "step `{run_id}/{step_id}` could not be leased"
                            )));
                        }
                    }
                };
                let drafts = audit(&outcome);
                Ok(Done::new(outcome, drafts, None))
            })
        })
        .await
}

pub(crate) async fn create_run(
    store: &PgStore,
    run: RunRecord,
    limit: Option<RunsInFlight>,
    audit: AuditFn<CreateRun>,
) -> Result<CreateRun, StoreError> {
    let route = run.agent.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                let sop = json_in(&run.sop)?;
                let sop_hash: &[u8] = &run.sop_hash.0;
                let policy_version = text_in(&run.policy_version).into_owned();
                let mut ords = Vec::with_capacity(run.steps.len());
                let mut step_ids = Vec::with_capacity(run.steps.len());
                let mut actions = Vec::with_capacity(run.steps.len());
                let mut operation_ids = Vec::with_capacity(run.steps.len());
                for (i, step) in run.steps.iter().enumerate() {
                    ords.push(
                        i32::try_from(i)
                            .map_err(|_| StoreError::backend("a run has too many steps"))?,
                    );
                    step_ids.push(step.step_id.as_str());
                    actions.push(step.action.as_str());
                    operation_ids.push(text_in(&step.operation_id).into_owned());
                }
                let run_id = run.run_id.as_str();
                let agent = run.agent.as_str();
                let envelope = run.envelope_id.as_ref().map(EnvelopeId::as_str);
                // A run without steps has nothing left to do.
                let finished_at = run.steps.is_empty().then_some(run.created_at.0);
                for _ in 0..PUT_ATTEMPTS {
                    if limit.is_some() {
                        // The agent's other limited creates (on any server) wait
                        // until this commits, so the count below stays exact.
                        tx.query(sql::QUOTA_LOCK, &[&QUOTA_LOCK_RUNS, &agent])
                            .await?;
                    }
                    // An existing run is returned whatever the quota.
                    let rows = tx.query(sql::GET_RUN, &[&run_id]).await?;
                    let outcome = if let Some(existing) = run_out(&run.run_id, &rows)? {
                        CreateRun::Existing(Box::new(existing))
                    } else {
                        let over = match limit {
                            None => None,
                            Some(l) => {
                                let row = tx
                                    .query_opt(sql::RUNS_IN_FLIGHT, &[&agent, &l.since.0])
                                    .await?;
                                let n: i64 = match row {
                                    Some(r) => r.try_get(0).map_err(crate::error::column)?,
                                    None => 0,
                                };
                                let n = u32::try_from(n).unwrap_or(u32::MAX);
                                (n >= l.max).then_some(CreateRun::OverQuota {
                                    limit: l.max,
                                    in_flight: n,
                                })
                            }
                        };
                        match over {
                            Some(over) => over,
                            None => {
                                let inserted = tx
                                    .execute(
                                        sql::INSERT_RUN,
                                        &[
                                            &run_id,
                                            &agent,
                                            &sop_hash,
                                            &sop,
                                            &policy_version,
                                            &run.created_at.0,
                                            &envelope,
                                            &finished_at,
                                        ],
                                    )
                                    .await?;
                                if inserted == 0 {
                                    // A concurrent creator of this id committed
                                    // after the read above: decide again.
                                    continue;
                                }
                                tx.execute(
                                    sql::INSERT_STEPS,
                                    &[&run_id, &ords, &step_ids, &actions, &operation_ids],
                                )
                                .await?;
                                CreateRun::Created
                            }
                        }
                    };
                    let drafts = audit(&outcome);
                    return Ok(Done::new(outcome, drafts, None));
                }
                Err(StoreError::backend(format!(
                    "the run `{}` lost {PUT_ATTEMPTS} races with concurrent creators",
                    run.run_id
                )))
            })
        })
        .await
}

pub(crate) async fn get_run(
    store: &PgStore,
    run_id: RunId,
) -> Result<Option<RunState>, StoreError> {
    let mut conn = store.inner.pool.get().await?;
    let rows = conn.query(sql::GET_RUN, &[&run_id.as_str()]).await?;
    run_out(&run_id, &rows)
}

pub(crate) async fn record_step(
    store: &PgStore,
    run_id: RunId,
    step_id: StepId,
    outcome: StepOutcome,
    holder: Option<String>,
    audit: Vec<AuditDraft>,
) -> Result<RecordStep, StoreError> {
    let route = run_id.to_string();
    store
        .inner
        .writers
        .write(Route::Key(&route), move |tx| {
            Box::pin(async move {
                let holder = holder.map(|h| text_in(&h).into_owned());
                let result = outcome.result.as_ref().map(json_in).transpose()?;
                let error = outcome.error.as_deref().map(|e| text_in(e).into_owned());
                let labels: Vec<&str> = outcome.labels.iter().map(|l| l.as_str()).collect();
                let status = codec::step_status_in(outcome.status);
                let (run, step) = (run_id.as_str(), step_id.as_str());
                // One recording per run at a time, so the one that records the last
                // outcome sees every other and marks the run finished.
                tx.query(sql::LOCK_RUN, &[&run]).await?;
                // Exactly once: only a step with no outcome yet is updated.
                let updated = tx
                    .execute(
                        sql::RECORD_STEP,
                        &[
                            &run,
                            &step,
                            &status,
                            &result,
                            &error,
                            &labels,
                            &outcome.recorded_at.0,
                            &holder,
                        ],
                    )
                    .await?;
                if updated == 1 {
                    tx.execute(sql::FINISH_RUN, &[&run, &outcome.recorded_at.0, &status])
                        .await?;
                    return Ok(Done::new(RecordStep::Recorded, audit, None));
                }
                let Some(row) = tx.query_opt(sql::STEP_OUTCOME, &[&run, &step]).await? else {
                    return Err(if tx.query_opt(sql::RUN_EXISTS, &[&run]).await?.is_none() {
                        not_found(Entity::Run, &run_id)
                    } else {
                        not_found(Entity::Step, format!("{run_id}/{step_id}"))
                    });
                };
                match (codec::outcome_out(&row, 0)?, lease_out(&row, 5)?) {
                    (Some(first), _) => Ok(Done::new(
                        RecordStep::AlreadyRecorded(first),
                        Vec::new(),
                        None,
                    )),
                    (None, Some(held)) => {
                        Ok(Done::new(RecordStep::LeaseHeld(held), Vec::new(), None))
                    }
                    (None, None) => Err(StoreError::backend(format!(
                        "step `{run_id}/{step_id}` could not be recorded"
                    ))),
                }
            })
        })
        .await
}
