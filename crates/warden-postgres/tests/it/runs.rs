//! Runs and exactly-once step outcomes.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::Barrier;
use warden_core::audit::Digest;
use warden_core::decision::Verdict;
use warden_core::ids::{Label, RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{CreateRun, RecordStep, RunRecord, RunStep, StepOutcome, StepStatus, Store};

use crate::support::*;

fn run_id(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

fn step_id(s: &str) -> StepId {
    StepId::parse(s).unwrap()
}

fn sample_run(name: &str, sop_hash: Digest) -> RunRecord {
    RunRecord {
        run_id: run_id(name),
        agent: id("researcher"),
        sop_hash,
        sop: json!({"sop_id": "report", "version": 1, "steps": [{"step_id": "s1"}, {"step_id": "s2"}, {"step_id": "s3"}]}),
        steps: ["s1", "s2", "s3"]
            .iter()
            .enumerate()
            .map(|(i, s)| RunStep {
                step_id: step_id(s),
                action: action(if i == 0 {
                    "document.summarize"
                } else {
                    "artifact.save"
                }),
                operation_id: format!("{name}:{s}"),
            })
            .collect(),
        policy_version: "pg-1".to_string(),
        created_at: Timestamp(77),
        envelope_id: Some(
            warden_core::envelope::EnvelopeId::parse(&format!("env-{name}")).unwrap(),
        ),
    }
}

fn completed(result: Value) -> StepOutcome {
    StepOutcome {
        status: StepStatus::Completed,
        result: Some(result),
        error: None,
        labels: vec![
            Label::parse("pii").unwrap(),
            Label::parse("financial").unwrap(),
        ],
        recorded_at: Timestamp(88),
    }
}

fn admit(name: &str) -> Vec<warden_core::audit::AuditDraft> {
    vec![draft(
        "researcher",
        "run.admit",
        name,
        Verdict::Allow,
        "admitted",
    )]
}

/// Eight servers' worth of retries race to record one step and to create
/// one run: exactly one of each wins, and the others see its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_recorders_and_creators_exactly_once() {
    let scratch = scratch_or_skip!();
    let stores = [scratch.store_with(4).await, scratch.store_with(4).await];
    const RACERS: usize = 8;
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for i in 0..RACERS {
        let store = stores[i % 2].clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let created = store
                .create_run(
                    sample_run("run-x", Digest::of(format!("sop-{i}").as_bytes())),
                    None,
                    warden_store::audit_if_created(admit("run-x")),
                )
                .await
                .unwrap();
            let recorded = store
                .record_step(
                    run_id("run-x"),
                    step_id("s2"),
                    completed(json!({"by": i})),
                    admit("s2"),
                )
                .await
                .unwrap();
            (created, recorded)
        }));
    }
    let mut created = 0;
    let mut recorded = Vec::new();
    let mut replayed = Vec::new();
    for t in tasks {
        let (c, r) = t.await.unwrap();
        if c == CreateRun::Created {
            created += 1;
        }
        match r {
            RecordStep::Recorded => recorded.push(()),
            RecordStep::AlreadyRecorded(o) => replayed.push(o),
            RecordStep::LeaseHeld(l) => panic!("no lease was taken: {l:?}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(recorded.len(), 1);
    let state = stores[0].get_run(run_id("run-x")).await.unwrap().unwrap();
    let winner = state.outcomes.get(&step_id("s2")).unwrap();
    assert!(replayed.iter().all(|o| o == winner));
    assert_eq!(head_count(&stores[0]).await, 2);
    assert_chain(&stores[1]).await;
}
