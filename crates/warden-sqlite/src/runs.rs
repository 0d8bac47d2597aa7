//! Runs inside the writer's transaction: creation under the runs-in-flight
//! limit, exactly-once steps, and reading a run back.

use std::collections::BTreeMap;

use rusqlite::{Connection, params};
use warden_core::audit::AuditDraft;
use warden_core::ids::{AgentId, RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CreateRun, Entity, LeaseStep, RecordStep, RunRecord, RunState, RunsInFlight,
    StepLease, StepOutcome, StoreError,
};

use crate::codec::{self};
use crate::error::{SqlResultExt, duplicate_or};
use crate::writer::Tx;

pub(crate) fn load_run(conn: &Connection, run_id: &RunId) -> Result<Option<RunState>, StoreError> {
    let what = format!("run `{run_id}`");
    let mut stmt = conn
        .prepare_cached(
            "SELECT agent, sop_hash, sop, policy_version, created_at, envelope_id \
             FROM runs WHERE run_id = ?1",
        )
        .store()?;
    let mut rows = stmt.query([run_id.as_str()]).store()?;
    let Some(row) = rows.next().store()? else {
        return Ok(None);
    };
    let agent: String = codec::column(row, 0, &what)?;
    let sop: String = codec::column(row, 2, &what)?;
    let mut run = RunRecord {
        run_id: run_id.clone(),
        agent: AgentId::parse(&agent).map_err(|e| crate::error::corrupt(&what, e))?,
        sop_hash: codec::digest_col(row, 1, &what)?,
        sop: codec::from_json(&what, &sop)?,
        steps: Vec::new(),
        policy_version: codec::column(row, 3, &what)?,
        created_at: Timestamp(codec::column(row, 4, &what)?),
        envelope_id: codec::envelope_id_col(row, 5, &what)?,
    };
    drop(rows);
    let mut outcomes = BTreeMap::new();
    let mut leases = BTreeMap::new();
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {} FROM run_steps WHERE run_id = ?1 ORDER BY position",
            codec::STEP_COLUMNS
        ))
        .store()?;
    let mut rows = stmt.query([run_id.as_str()]).store()?;
    while let Some(row) = rows.next().store()? {
        let (step, outcome) = codec::step_from_row(row, run_id)?;
        if let Some(outcome) = outcome {
            outcomes.insert(step.step_id.clone(), outcome);
        }
        let what = format!("step `{run_id}/{}`", step.step_id);
        if let Some(lease) = codec::lease_from_row(row, &what)? {
            leases.insert(step.step_id.clone(), lease);
        }
        run.steps.push(step);
    }
    Ok(Some(RunState {
        run,
        outcomes,
        leases,
    }))
}

pub(crate) fn create_run_in(
    tx: &mut Tx<'_>,
    run: RunRecord,
    limit: Option<RunsInFlight>,
    audit: AuditFn<CreateRun>,
) -> Result<CreateRun, StoreError> {
    let conn = tx.conn();
    // An existing run is returned whatever the quota.
    if let Some(existing) = load_run(conn, &run.run_id)? {
        let outcome = CreateRun::Existing(Box::new(existing));
        tx.append(audit(&outcome))?;
        return Ok(outcome);
    }
    if let Some(limit) = limit {
        let in_flight: i64 = conn
            .prepare_cached(
                "SELECT count(*) FROM runs \
                 WHERE agent = ?1 AND finished_at IS NULL AND created_at >= ?2",
            )
            .store()?
            .query_row(params![run.agent.as_str(), limit.since.0], |r| r.get(0))
            .store()?;
        let in_flight = u32::try_from(in_flight).unwrap_or(u32::MAX);
        if in_flight >= limit.max {
            let outcome = CreateRun::OverQuota {
                limit: limit.max,
                in_flight,
            };
            tx.append(audit(&outcome))?;
            return Ok(outcome);
        }
    }
    conn.prepare_cached(
        "INSERT INTO runs (run_id, agent, sop_hash, sop, policy_version, created_at, \
         envelope_id, finished_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .store()?
    .execute(params![
        run.run_id.as_str(),
        run.agent.as_str(),
        run.sop_hash.0,
        codec::json_text(&run.sop)?,
        run.policy_version,
        run.created_at.0,
        run.envelope_id.as_ref().map(|e| e.as_str()),
        // A run without steps has nothing left to do.
        run.steps.is_empty().then_some(run.created_at.0),
    ])
    .map_err(|e| duplicate_or(e, Entity::Run, run.run_id.as_str()))?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO run_steps (run_id, position, step_id, action, operation_id) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .store()?;
    for (position, step) in run.steps.iter().enumerate() {
        stmt.execute(params![
            run.run_id.as_str(),
            i64::try_from(position).unwrap_or(i64::MAX),
            step.step_id.as_str(),
            step.action.as_str(),
            step.operation_id,
        ])
        .map_err(|e| duplicate_or(e, Entity::Step, &format!("{}/{}", run.run_id, step.step_id)))?;
    }
    let outcome = CreateRun::Created;
    tx.append(audit(&outcome))?;
    Ok(outcome)
}

pub(crate) fn record_step_in(
    tx: &mut Tx<'_>,
    run_id: RunId,
    step_id: StepId,
    outcome: StepOutcome,
    holder: Option<String>,
    audit: Vec<AuditDraft>,
) -> Result<RecordStep, StoreError> {
    let conn = tx.conn();
    // Exactly once: the outcome is set only while none is recorded, and
    // only by the holder of a lease still live (anyone when none is).
    let changed = conn
        .prepare_cached(
            "UPDATE run_steps SET status = ?3, result = ?4, error = ?5, labels = ?6, \
             recorded_at = ?7, lease_holder = NULL, lease_acquired_at = NULL, \
             lease_expires_at = NULL \
             WHERE run_id = ?1 AND step_id = ?2 AND status IS NULL \
             AND (lease_holder IS NULL OR lease_expires_at <= ?7 OR lease_holder = ?8)",
        )
        .store()?
        .execute(params![
            run_id.as_str(),
            step_id.as_str(),
            codec::step_status_to_sql(outcome.status),
            outcome.result.as_ref().map(codec::json_text).transpose()?,
            outcome.error,
            codec::json_text(&outcome.labels)?,
            outcome.recorded_at.0,
            holder,
        ])
        .store()?;
    if changed == 1 {
        // The run is finished by a step that did not complete, or by the
        // last step without an outcome.
        conn.prepare_cached(
            "UPDATE runs SET finished_at = ?2 WHERE run_id = ?1 AND finished_at IS NULL \
             AND (?3 != 'completed' OR NOT EXISTS \
               (SELECT 1 FROM run_steps WHERE run_id = ?1 AND status IS NULL))",
        )
        .store()?
        .execute(params![
            run_id.as_str(),
            outcome.recorded_at.0,
            codec::step_status_to_sql(outcome.status),
        ])
        .store()?;
        tx.append(audit)?;
        return Ok(RecordStep::Recorded);
    }
    let Some(state) = load_run(conn, &run_id)? else {
        return Err(StoreError::not_found(Entity::Run, &run_id));
    };
    match (state.outcomes.get(&step_id), state.leases.get(&step_id)) {
        (Some(first), _) => Ok(RecordStep::AlreadyRecorded(first.clone())),
        (None, Some(held)) => Ok(RecordStep::LeaseHeld(held.clone())),
        (None, None) => Err(StoreError::not_found(
            Entity::Step,
            format!("{run_id}/{step_id}"),
        )),
    }
}

/// The compare-and-set of a step's lease (see `Store::lease_step`).
pub(crate) fn lease_step_in(
    tx: &mut Tx<'_>,
    run_id: RunId,
    step_id: StepId,
    lease: StepLease,
    audit: AuditFn<LeaseStep>,
) -> Result<LeaseStep, StoreError> {
    let conn = tx.conn();
    let changed = conn
        .prepare_cached(
            "UPDATE run_steps SET lease_holder = ?3, lease_acquired_at = ?4, \
             lease_expires_at = ?5 \
             WHERE run_id = ?1 AND step_id = ?2 AND status IS NULL \
             AND (lease_holder IS NULL OR lease_holder = ?3 OR lease_expires_at <= ?4)",
        )
        .store()?
        .execute(params![
            run_id.as_str(),
            step_id.as_str(),
            lease.holder,
            lease.acquired_at.0,
            lease.expires_at.0,
        ])
        .store()?;
    let outcome = if changed == 1 {
        LeaseStep::Granted
    } else {
        let Some(state) = load_run(conn, &run_id)? else {
            return Err(StoreError::not_found(Entity::Run, &run_id));
        };
        match (state.outcomes.get(&step_id), state.leases.get(&step_id)) {
            (Some(recorded), _) => LeaseStep::Recorded(recorded.clone()),
            (None, Some(held)) => LeaseStep::Held(held.clone()),
            (None, None) => {
                return Err(StoreError::not_found(
                    Entity::Step,
                    format!("{run_id}/{step_id}"),
                ));
            }
        }
    };
    tx.append(audit(&outcome))?;
    Ok(outcome)
}
