//! A run is a plan-bound session whose plan is fully literal: each step is
//! decided by the same gate as a session's call, so an action's provenance
//! rules apply to a run's steps too, and the SOP's literals vouch for them
//! (origin `plan`); the gate's other checks (capability, revocation) deny a
//! step mid-run and stop the run.

use std::sync::Arc;

use serde_json::json;
use warden::{Admission, Caller, Engine, ManualClock, StepGate, StepResult};
use warden_core::decision::Verdict;
use warden_core::ids::{RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, StepStatus, Store};

use super::support::id;

const POLICY: &str = r#"
policy_version: runs-as-plans
environment_capabilities: [read_file, send_money]
actions:
  read_file:
    arguments: {type: object, required: [file_path], properties: {file_path: {type: string}}}
  send_money:
    arguments:
      type: object
      required: [recipient, amount]
      properties: {recipient: {type: string}, amount: {type: number}}
    tags: [state_changing]
    provenance:
      - {argument: recipient, from: [user, trusted], otherwise: deny}
agents:
  - id: boss
    capabilities: [read_file, send_money]
  - id: agent
    parent: boss
    capabilities: [read_file, send_money]
"#;

const LANDLORD: &str = "GB29NWBK60161331926819";

async fn engine() -> Engine<MemoryStore> {
    Engine::open(
        warden_core::bundle::compile(POLICY).unwrap(),
        MemoryStore::new(),
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap()
}

fn sop(e: &Engine<MemoryStore>) -> warden_core::sop::Sop {
    let text = json!({
        "sop_id": "pay-rent", "version": 1,
        "steps": [
            {"step_id": "read", "action": "read_file", "arguments": {"file_path": "bill.txt"}},
            {"step_id": "pay", "action": "send_money",
             "arguments": {"recipient": LANDLORD, "amount": 1200}},
        ],
    })
    .to_string();
    warden_core::sop::parse_sop(&text, &e.policy().sop_limits).unwrap()
}

fn rid(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

fn step(s: &str) -> StepId {
    StepId::parse(s).unwrap()
}

/// The details of the last `step.begin` entry for `resource`.
async fn begin_details(e: &Engine<MemoryStore>, resource: &str) -> serde_json::Value {
    e.store()
        .audit_page(0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find(|a| a.draft.operation == "step.begin" && a.draft.resource == resource)
        .map(|a| a.draft.details)
        .unwrap()
}

#[tokio::test]
async fn a_runs_literals_vouch_for_its_steps_through_the_one_gate() {
    let e = engine().await;
    let agent = id("agent");
    let Admission::Admitted { .. } = e
        .admit_run(&agent, &sop(&e), Some(rid("r1")))
        .await
        .unwrap()
    else {
        panic!("not admitted");
    };
    for s in ["read", "pay"] {
        let gate = e.begin_step(&agent, &rid("r1"), &step(s)).await.unwrap();
        let StepGate::Proceed { decision, .. } = gate else {
            panic!("{s}: {gate:?}");
        };
        assert_eq!(decision.verdict, Verdict::Allow);
        e.complete_step(
            &agent,
            &rid("r1"),
            &step(s),
            StepResult {
                result: Some(json!({"ok": true})),
                ..StepResult::default()
            },
        )
        .await
        .unwrap();
    }
    // The payment's recipient was checked by its provenance rule and
    // vouched for by the plan (the SOP's own literal).
    let details = begin_details(&e, "r1:pay").await;
    assert_eq!(details["plan_step"], json!("pay"));
    let p = &details["provenance"][0];
    assert_eq!(p["path"], json!("recipient"));
    assert_eq!(p["origins"], json!(["plan"]));
    assert_eq!(p["vouched"], json!(true));
    assert_eq!(p["from"], json!(["user", "trusted"]));
    // A step no rule guards has no provenance to report.
    let read = begin_details(&e, "r1:read").await;
    assert_eq!(read["provenance"], json!([]));
}

#[tokio::test]
async fn a_revocation_mid_run_denies_the_next_step_through_the_gate_and_stops_the_run() {
    let e = engine().await;
    let agent = id("agent");
    let Admission::Admitted { .. } = e
        .admit_run(&agent, &sop(&e), Some(rid("r2")))
        .await
        .unwrap()
    else {
        panic!("not admitted");
    };
    let StepGate::Proceed { .. } = e
        .begin_step(&agent, &rid("r2"), &step("read"))
        .await
        .unwrap()
    else {
        panic!("first step refused");
    };
    e.complete_step(&agent, &rid("r2"), &step("read"), StepResult::default())
        .await
        .unwrap();
    e.revoke_agent(&Caller::Operator, &agent).await.unwrap();
    let gate = e
        .begin_step(&agent, &rid("r2"), &step("pay"))
        .await
        .unwrap();
    let StepGate::Refused { decision, .. } = gate else {
        panic!("{gate:?}");
    };
    assert_eq!(decision.verdict, Verdict::Deny);
    assert_eq!(decision.reason.as_str(), "agent_revoked");
    let state = e.store().get_run(rid("r2")).await.unwrap().unwrap();
    assert_eq!(state.outcomes[&step("pay")].status, StepStatus::Denied);
    // The run stopped: nothing later proceeds, and the denial is final.
    let again = e
        .begin_step(&agent, &rid("r2"), &step("pay"))
        .await
        .unwrap();
    assert!(matches!(again, StepGate::Replay { .. }), "{again:?}");
}
