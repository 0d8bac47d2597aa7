//! Context envelopes through the engine: the design document's customer
//! example end to end, same-step enforcement, escalation review,
//! declassification, inheritance down delegation, export, and property
//! tests over random label streams and delegation trees. Evidence comes from
//! decisions, stored envelope versions, step outcomes, handler effects and
//! the decision log.

use std::collections::BTreeSet;
use std::sync::Arc;
use warden::{Missing, Registration, RegistrationRefusal};

use proptest::prelude::*;
use serde_json::{Value, json};
use warden::{
    Admission, Caller, DelegationOptions, Engine, EngineError, ManualClock, RegisterAgent,
    StepGate, StepResult,
};
use warden_core::audit::AuditEntry;
use warden_core::decision::{Obligation, Verdict};
use warden_core::envelope::sign::{EnvelopeRef, SigningKey, Verifier};
use warden_core::envelope::{
    ContextRequest, Envelope, EnvelopeId, EnvelopeRecord, IssuerId, Sensitivity, TrustZone,
    WorkflowId, decide,
};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, Label, RunId, StepId};
use warden_core::time::Timestamp;
use warden_store::{
    EscalationStatus, EscalationTarget, MemoryStore, RunRecord, StepOutcome, StepStatus, Store,
    StoredAgent,
};

use crate::support::*;

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

const CUSTOMER_LABELS: [&str; 4] = [
    "customer_name",
    "renewal_status",
    "usage_analytics",
    "financial_indicators",
];

/// The lab bundle plus a label that is `restricted` on its own and implies
/// no restriction: flows out at that level are escalated, not denied.
fn escalating_policy() -> String {
    let p = LAB_POLICY.replace(
        "    internal_document: internal\n",
        "    internal_document: internal\n    special_category: restricted\n",
    );
    assert_ne!(p, LAB_POLICY);
    p
}

/// The lab bundle without its `context:` section.
fn policy_without_context() -> String {
    let at = LAB_POLICY.find("\n# Context accumulation").unwrap();
    LAB_POLICY[..at].to_string()
}

fn l(s: &str) -> Label {
    Label::parse(s).unwrap()
}

fn ls(xs: &[&str]) -> Vec<Label> {
    xs.iter().map(|s| l(s)).collect()
}

fn sid(s: &str) -> StepId {
    StepId::parse(s).unwrap()
}

fn rid(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

fn caps(list: &[&str]) -> BTreeSet<ActionName> {
    list.iter().map(|c| ActionName::parse(c).unwrap()).collect()
}

fn child(name: &str, c: &[&str]) -> RegisterAgent {
    RegisterAgent {
        id: id(name),
        parent: None,
        capabilities: caps(c),
        tools: None,
        config: None,
    }
}

fn args_for(action: &str) -> Value {
    match action {
        "crm.lookup" | "analytics.usage" | "finance.indicators" => json!({"customer_id": "c-42"}),
        "artifact.save" => json!({"path": "internal/notes.txt"}),
        "document.summarize" => json!({"document_id": "doc-1"}),
        "memory.read" => json!({"namespace": "project", "key": "client_region"}),
        _ => json!({}),
    }
}

/// An SOP of `(step_id, action)` with fixed arguments.
fn sop_of(e: &Engine<impl Store>, steps: &[(&str, &str)]) -> warden_core::sop::Sop {
    let steps: Vec<Value> = steps
        .iter()
        .map(|(s, a)| json!({"step_id": s, "action": a, "arguments": args_for(a)}))
        .collect();
    sop(
        e,
        &json!({"sop_id": "customer-review", "version": 1, "steps": steps}).to_string(),
    )
}

async fn admit(
    e: &Engine<impl Store>,
    agent: &str,
    run: &str,
    steps: &[(&str, &str)],
) -> RunRecord {
    match e
        .admit_run(&id(agent), &sop_of(e, steps), Some(rid(run)))
        .await
        .unwrap()
    {
        Admission::Admitted { run, .. } => run,
        Admission::Rejected(p) => panic!("rejected: {p:?}"),
        other => panic!("not admitted: {other:?}"),
    }
}

async fn begin(e: &Engine<impl Store>, agent: &str, run: &str, step: &str) -> StepGate {
    e.begin_step(&id(agent), &rid(run), &sid(step))
        .await
        .unwrap()
}

async fn complete(
    e: &Engine<impl Store>,
    agent: &str,
    run: &str,
    step: &str,
    labels: &[&str],
) -> StepOutcome {
    e.complete_step(
        &id(agent),
        &rid(run),
        &sid(step),
        StepResult {
            result: Some(json!({"ok": true})),
            result_labels: ls(labels),
            error: None,
        },
    )
    .await
    .unwrap()
}

/// Begin a step that must proceed, then complete it with `labels`.
async fn run_step(
    e: &Engine<impl Store>,
    agent: &str,
    run: &str,
    step: &str,
    labels: &[&str],
) -> StepOutcome {
    match begin(e, agent, run, step).await {
        StepGate::Proceed { .. } => {}
        other => panic!("{step}: {other:?}"),
    }
    complete(e, agent, run, step, labels).await
}

fn refused(gate: StepGate) -> warden_core::decision::Decision {
    match gate {
        StepGate::Refused { decision, .. } => decision,
        other => panic!("expected a refusal: {other:?}"),
    }
}

async fn envelope_of(e: &Engine<impl Store>, run: &str) -> EnvelopeRecord {
    e.run_envelope(&rid(run)).await.unwrap().unwrap()
}

/// Every stored version of an envelope, oldest first.
async fn history(e: &Engine<impl Store>, id: &EnvelopeId) -> Vec<EnvelopeRecord> {
    let latest = e.envelope(id, None).await.unwrap().unwrap().version;
    let mut out = Vec::new();
    for v in 0..=latest {
        out.push(e.envelope(id, Some(v)).await.unwrap().unwrap());
    }
    out
}

fn names(set: &BTreeSet<Label>) -> Vec<&str> {
    set.iter().map(Label::as_str).collect()
}

fn entries<'a>(log: &'a [AuditEntry], operation: &str) -> Vec<&'a AuditEntry> {
    log.iter()
        .filter(|a| a.draft.operation == operation)
        .collect()
}

fn sensitivity(v: &Value) -> Sensitivity {
    serde_json::from_value(v.clone()).unwrap()
}

// ---------------------------------------------------------------------------
// The customer example
// ---------------------------------------------------------------------------

/// Name, renewal status, usage analytics and financial indicators are each
/// at most confidential; together they are a restricted customer risk
/// profile, and the export step of the same run is denied, as is an
/// external delegation from it.
#[tokio::test]
async fn customer_example_end_to_end() {
    let e = lab().await;
    let steps = [
        ("crm", "crm.lookup"),
        ("usage", "analytics.usage"),
        ("finance", "finance.indicators"),
        ("export", "report.export"),
    ];
    let run = admit(&e, "researcher", "run-customer", &steps).await;
    let env_id = run.envelope_id.clone().unwrap();

    // Each lookup is permitted when it is asked for; the adapter reports no
    // labels, the catalogue's output labels are folded regardless.
    for (step, _) in &steps[..3] {
        match begin(&e, "researcher", "run-customer", step).await {
            StepGate::Proceed { decision, .. } => {
                assert_eq!(decision.verdict, Verdict::Allow);
                assert_eq!(decision.reason.as_str(), "step_allowed");
            }
            other => panic!("{other:?}"),
        }
        let out = complete(&e, "researcher", "run-customer", step, &[]).await;
        assert_eq!(out.status, StepStatus::Completed);
    }

    // The stored versions: one per transition, never lower.
    let versions = history(&e, &env_id).await;
    let levels: Vec<Sensitivity> = versions.iter().map(|r| r.aggregate_sensitivity).collect();
    assert_eq!(
        levels,
        [
            Sensitivity::Public,
            Sensitivity::Confidential,
            Sensitivity::Confidential,
            Sensitivity::Restricted
        ]
    );
    assert_eq!(
        versions.iter().map(|r| r.version).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    let last = versions.last().unwrap();
    assert_eq!(names(&last.labels), {
        let mut v = CUSTOMER_LABELS.to_vec();
        v.sort();
        v
    });
    assert_eq!(names(&last.derived), ["customer-risk-profile"]);
    assert_eq!(
        names(&last.restrictions),
        ["no_external_delegation", "no_external_export"]
    );
    assert_eq!(last.workflow_id.as_str(), "run-customer");
    assert_eq!(last.agent_id, id("researcher"));

    // The export step of the same run is denied, recorded and stops the run.
    let d = refused(begin(&e, "researcher", "run-customer", "export").await);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");
    let state = e
        .store()
        .get_run(rid("run-customer"))
        .await
        .unwrap()
        .unwrap();
    let export = &state.outcomes[&sid("export")];
    assert_eq!(export.status, StepStatus::Denied);
    assert_eq!(
        export.error.as_deref(),
        Some("restricted_by:no_external_export")
    );

    // An external delegation from the run is denied; nothing is created.
    let agents = e.store().load_agents().await.unwrap().len();
    let err = e
        .delegate_with(
            &id("researcher"),
            child("partner_agent", &["artifact.save"]),
            DelegationOptions {
                from_run: Some(rid("run-customer")),
                zone: Some(TrustZone::External),
                ..DelegationOptions::default()
            },
        )
        .await
        .unwrap();
    let Registration::Refused {
        decision: d,
        refusal: RegistrationRefusal::Context,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_delegation");
    assert!(e.agent(&id("partner_agent")).is_err());
    assert_eq!(e.store().load_agents().await.unwrap().len(), agents);

    // The decision log: each transition classified at its own level, the
    // denials with the envelope they were decided against, no data.
    let log = audit(&e).await;
    let folds = entries(&log, "context.accumulate");
    assert_eq!(folds.len(), 3);
    assert!(
        folds
            .iter()
            .all(|a| a.draft.reason == "context_accumulated")
    );
    let classes: Vec<Sensitivity> = folds
        .iter()
        .map(|a| sensitivity(&a.draft.details["classification"]))
        .collect();
    assert_eq!(
        classes,
        [
            Sensitivity::Confidential,
            Sensitivity::Confidential,
            Sensitivity::Restricted
        ]
    );
    let last_fold = &folds[2].draft.details;
    assert_eq!(last_fold["rules_applied"], json!(["customer_risk_profile"]));
    assert_eq!(
        last_fold["restrictions_added"],
        json!(["no_external_delegation", "no_external_export"])
    );
    assert_eq!(last_fold["derived_added"], json!(["customer-risk-profile"]));
    assert_eq!(last_fold["version"], json!(3));
    let denial = log
        .iter()
        .find(|a| a.draft.reason == "restricted_by:no_external_export")
        .unwrap();
    assert_eq!(denial.draft.operation, "step.begin");
    assert_eq!(denial.draft.resource, "run-customer:export");
    assert_eq!(denial.draft.details["classification"], json!("restricted"));
    assert_eq!(denial.draft.details["envelope_version"], json!(3));
    let refusal = log
        .iter()
        .find(|a| a.draft.reason == "restricted_by:no_external_delegation")
        .unwrap();
    assert_eq!(refusal.draft.operation, "agent.register");
    assert_eq!(refusal.draft.resource, "partner_agent");
    let opened = entries(&log, "context.open");
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].draft.reason, "context_created");
    // Labels and ids only: the customer id in the step arguments never
    // reaches the log.
    assert!(!serde_json::to_string(&log).unwrap().contains("c-42"));
    assert_eq!(verify(&e).await, log.len() as u64);
}

/// The same scenario through `execute_sop` with real handlers: the export
/// handler never runs.
#[tokio::test]
async fn customer_example_through_handlers() {
    let e = lab().await;
    let (mut handlers, effects) = recording_handlers();
    for action in ["crm.lookup", "analytics.usage", "finance.indicators"] {
        let effects = Arc::clone(&effects);
        handlers.register(
            ActionName::parse(action).unwrap(),
            move |call: warden::HandlerCall| {
                let effects = Arc::clone(&effects);
                async move {
                    effects
                        .lock()
                        .unwrap()
                        .push((call.action.to_string(), Value::Object(call.arguments)));
                    Ok(json!({"found": true}))
                }
            },
        );
    }
    let s = sop_of(
        &e,
        &[
            ("crm", "crm.lookup"),
            ("usage", "analytics.usage"),
            ("finance", "finance.indicators"),
            ("export", "report.export"),
        ],
    );
    let report = e
        .execute_sop(&id("researcher"), &s, &handlers, None)
        .await
        .unwrap();
    assert!(report.admitted && !report.completed);
    assert_eq!(report.steps.len(), 4);
    assert_eq!(
        report.steps[3].decision.reason.as_str(),
        "restricted_by:no_external_export"
    );
    let done: Vec<String> = effects
        .lock()
        .unwrap()
        .iter()
        .map(|(a, _)| a.clone())
        .collect();
    assert_eq!(
        done,
        ["crm.lookup", "analytics.usage", "finance.indicators"]
    );
    let env = e
        .run_envelope(report.run_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(env.aggregate_sensitivity, Sensitivity::Restricted);
}

/// The restriction implied by the step that just completed binds the very
/// next step: an export right after three of the four labels runs; the one
/// right after the fourth does not.
#[tokio::test]
async fn same_step_enforcement() {
    let e = lab().await;
    let steps = [
        ("collect", "artifact.save"),
        ("export1", "report.export"),
        ("finance", "artifact.save"),
        ("export2", "report.export"),
    ];
    admit(&e, "researcher", "run-same", &steps).await;
    // The adapter reports the labels (the action declares none).
    run_step(
        &e,
        "researcher",
        "run-same",
        "collect",
        &["customer_name", "renewal_status", "usage_analytics"],
    )
    .await;
    match begin(&e, "researcher", "run-same", "export1").await {
        StepGate::Proceed { decision, .. } => assert_eq!(decision.verdict, Verdict::Allow),
        other => panic!("{other:?}"),
    }
    complete(&e, "researcher", "run-same", "export1", &[]).await;
    let before = envelope_of(&e, "run-same").await;
    assert!(before.restrictions.is_empty());
    run_step(
        &e,
        "researcher",
        "run-same",
        "finance",
        &["financial_indicators"],
    )
    .await;
    let d = refused(begin(&e, "researcher", "run-same", "export2").await);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");
    // The version the denial was decided against is the one the previous
    // completion wrote.
    let after = envelope_of(&e, "run-same").await;
    assert_eq!(after.version, before.version + 1);
    let denial = audit(&e)
        .await
        .into_iter()
        .rev()
        .find(|a| a.draft.resource == "run-same:export2")
        .unwrap();
    assert_eq!(
        denial.draft.details["envelope_version"],
        json!(after.version)
    );
}

/// At or above the inherit threshold, a permitted step is constrained: its
/// result must carry the envelope's labels, and the engine attaches them to
/// the recorded outcome whatever the caller reports.
#[tokio::test]
async fn result_labels_obligation_is_enforced_by_the_engine() {
    let e = lab().await;
    admit(
        &e,
        "researcher",
        "run-oblige",
        &[("collect", "artifact.save"), ("write", "artifact.save")],
    )
    .await;
    run_step(&e, "researcher", "run-oblige", "collect", &CUSTOMER_LABELS).await;
    let StepGate::Proceed { decision, .. } = begin(&e, "researcher", "run-oblige", "write").await
    else {
        panic!()
    };
    assert_eq!(decision.verdict, Verdict::Constrain);
    assert_eq!(decision.reason.as_str(), "context_constrained");
    let obliged = decision
        .obligations
        .iter()
        .find_map(|o| match o {
            Obligation::ResultLabels { labels } => Some(labels.clone()),
            _ => None,
        })
        .unwrap();
    assert!(obliged.contains(&l("customer-risk-profile")));
    assert!(decision.obligations.iter().any(|o| matches!(
        o,
        Obligation::InheritRestrictions { restrictions } if restrictions.contains(&l("no_external_export"))
    )));
    // The caller reports nothing; the outcome carries the obligation anyway.
    let out = complete(&e, "researcher", "run-oblige", "write", &[]).await;
    for label in &obliged {
        assert!(out.labels.contains(label), "{label} missing from {out:?}");
    }
    let fold = audit(&e)
        .await
        .into_iter()
        .rev()
        .find(|a| a.draft.operation == "context.accumulate")
        .unwrap();
    assert_eq!(
        fold.draft.details["result_sensitivity"],
        json!("restricted")
    );
}

/// An unknown result label fails the completion: the step is recorded
/// failed with `unknown_label:<label>`, the envelope is unchanged and the
/// run stops.
#[tokio::test]
async fn unknown_result_label_fails_closed() {
    let e = lab().await;
    admit(
        &e,
        "researcher",
        "run-unknown",
        &[
            ("a", "crm.lookup"),
            ("b", "artifact.save"),
            ("c", "artifact.save"),
        ],
    )
    .await;
    run_step(&e, "researcher", "run-unknown", "a", &[]).await;
    let before = envelope_of(&e, "run-unknown").await;
    let out = run_step(
        &e,
        "researcher",
        "run-unknown",
        "b",
        &["usage_analytics", "mystery"],
    )
    .await;
    assert_eq!(out.status, StepStatus::Failed);
    assert_eq!(out.error.as_deref(), Some("unknown_label:mystery"));
    assert_eq!(out.result, None);
    assert_eq!(envelope_of(&e, "run-unknown").await, before);
    let d = refused(begin(&e, "researcher", "run-unknown", "c").await);
    assert_eq!(d.reason.as_str(), "run_stopped");
    let last = audit(&e)
        .await
        .into_iter()
        .rev()
        .find(|a| a.draft.operation == "step.complete")
        .unwrap();
    assert_eq!(last.draft.verdict, Verdict::Deny);
    assert_eq!(last.draft.reason, "unknown_label:mystery");
    assert_eq!(last.draft.details["unknown_labels"], json!(["mystery"]));
    // A second report returns the recorded outcome and folds nothing.
    let again = complete(&e, "researcher", "run-unknown", "b", &["usage_analytics"]).await;
    assert_eq!(again, out);
    assert_eq!(envelope_of(&e, "run-unknown").await, before);
}

/// A completion the run's restrictions would have denied (the caller
/// skipped the gate) still folds its labels, but the step is recorded
/// denied and the run stops.
#[tokio::test]
async fn completing_a_restricted_step_without_the_gate_is_recorded_denied() {
    let e = lab().await;
    admit(
        &e,
        "researcher",
        "run-bypass",
        &[("collect", "artifact.save"), ("export", "report.export")],
    )
    .await;
    run_step(&e, "researcher", "run-bypass", "collect", &CUSTOMER_LABELS).await;
    let before = envelope_of(&e, "run-bypass").await;
    let out = complete(
        &e,
        "researcher",
        "run-bypass",
        "export",
        &["internal_document"],
    )
    .await;
    assert_eq!(out.status, StepStatus::Denied);
    assert_eq!(out.error.as_deref(), Some("completed_without_gate"));
    let after = envelope_of(&e, "run-bypass").await;
    assert_eq!(after.version, before.version + 1);
    assert!(after.labels.contains(&l("internal_document")));
}

// ---------------------------------------------------------------------------
// Escalation
// ---------------------------------------------------------------------------

async fn escalate_export(e: &Engine<impl Store>, run: &str) -> String {
    admit(
        e,
        "researcher",
        run,
        &[("collect", "artifact.save"), ("export", "report.export")],
    )
    .await;
    run_step(e, "researcher", run, "collect", &["special_category"]).await;
    match begin(e, "researcher", run, "export").await {
        StepGate::Escalated {
            decision,
            escalation_id,
        } => {
            assert_eq!(decision.verdict, Verdict::Escalate);
            assert_eq!(decision.reason.as_str(), "sensitivity_floor");
            escalation_id
        }
        other => panic!("{other:?}"),
    }
}

/// escalate → listed → approved → the step proceeds exactly once; a second
/// begin after completion replays; a fresh attempt escalates again.
#[tokio::test]
async fn escalation_approval_lets_the_step_proceed_once() {
    let e = lab_with(&escalating_policy()).await;
    let esc = escalate_export(&e, "run-esc").await;

    // Held, not recorded; asking again finds the same pending escalation.
    let state = e.store().get_run(rid("run-esc")).await.unwrap().unwrap();
    assert!(!state.outcomes.contains_key(&sid("export")));
    match begin(&e, "researcher", "run-esc", "export").await {
        StepGate::Escalated { escalation_id, .. } => assert_eq!(escalation_id, esc),
        other => panic!("{other:?}"),
    }
    let pending = e
        .list_escalations(Some(EscalationStatus::Pending))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1);
    let p = &pending[0];
    assert_eq!(p.escalation_id, esc);
    assert_eq!(
        p.target,
        EscalationTarget::Step {
            run_id: rid("run-esc"),
            step_id: sid("export"),
            request_digest: p.target.request_digest(),
        }
    );
    assert!(p.target.request_digest().is_some());
    assert_eq!(p.requested_by, Caller::Agent(id("researcher")));
    assert_eq!(p.classification, Sensitivity::Restricted);
    assert_eq!(p.reason.as_str(), "sensitivity_floor");

    // Neither the requester nor an agent outside its lineage may approve.
    for who in ["researcher", "formatter"] {
        let out = e
            .approve_escalation(&esc, &Caller::Agent(id(who)))
            .await
            .unwrap();
        assert_eq!(out.decision.verdict, Verdict::Deny);
        assert_eq!(
            out.decision.reason.as_str(),
            "escalation_reviewer_not_authorized"
        );
        assert_eq!(out.escalation.status, EscalationStatus::Pending);
    }
    // An ancestor may; the approval is recorded with the approver.
    let out = e
        .approve_escalation(&esc, &Caller::Agent(id("report_manager")))
        .await
        .unwrap();
    assert_eq!(out.decision.verdict, Verdict::Allow);
    assert_eq!(out.decision.reason.as_str(), "escalation_approved");
    assert_eq!(out.escalation.status, EscalationStatus::Approved);
    assert_eq!(
        out.escalation.resolved_by,
        Some(Caller::Agent(id("report_manager")))
    );
    let approval = audit(&e)
        .await
        .into_iter()
        .rev()
        .find(|a| a.draft.operation == "escalation.approve")
        .unwrap();
    assert_eq!(approval.draft.subject, "report_manager");
    assert_eq!(approval.draft.resource, esc);
    assert_eq!(approval.draft.details["reviewer"], json!("report_manager"));
    // Approving twice changes nothing.
    let twice = e.approve_escalation(&esc, &Caller::Operator).await.unwrap();
    assert_eq!(twice.decision.reason.as_str(), "escalation_not_pending");

    // The step proceeds once, constrained by the envelope's obligations.
    match begin(&e, "researcher", "run-esc", "export").await {
        StepGate::Proceed { decision, .. } => {
            assert_eq!(decision.reason.as_str(), "escalation_approved");
            assert_eq!(decision.verdict, Verdict::Constrain);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.escalation(&esc).await.unwrap().status,
        EscalationStatus::Consumed
    );
    // Exactly once: asking again before completing finds the approved
    // attempt's lease (it is running); nothing new is held or decided.
    match begin(&e, "researcher", "run-esc", "export").await {
        StepGate::InProgress { decision, .. } => {
            assert_eq!(decision.reason.as_str(), "step_in_progress");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.list_escalations(Some(EscalationStatus::Pending))
            .await
            .unwrap()
            .is_empty()
    );
    // The approved attempt completes; afterwards the step only replays.
    let out = complete(&e, "researcher", "run-esc", "export", &[]).await;
    assert_eq!(out.status, StepStatus::Completed);
    match begin(&e, "researcher", "run-esc", "export").await {
        StepGate::Replay { outcome, .. } => assert_eq!(outcome, out),
        other => panic!("{other:?}"),
    }
    let state = e.store().get_run(rid("run-esc")).await.unwrap().unwrap();
    assert_eq!(state.outcomes[&sid("export")].status, StepStatus::Completed);

    // A fresh attempt (a new run) escalates again.
    let fresh = escalate_export(&e, "run-esc-2").await;
    assert_ne!(fresh, esc);
    let log = audit(&e).await;
    let consumed = log
        .iter()
        .filter(|a| a.draft.reason == "escalation_consumed")
        .count();
    assert_eq!(consumed, 1);
}

/// A rejected escalation denies the step: recorded denied, run stopped.
#[tokio::test]
async fn escalation_rejection_denies_the_step() {
    let e = lab_with(&escalating_policy()).await;
    let esc = escalate_export(&e, "run-rej").await;
    let err = e
        .reject_escalation(&esc, &Caller::Operator, "  ")
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Input { .. }));
    let out = e
        .reject_escalation(&esc, &Caller::Operator, "no export of restricted notes")
        .await
        .unwrap();
    assert_eq!(out.decision.reason.as_str(), "escalation_rejected");
    assert_eq!(out.escalation.status, EscalationStatus::Rejected);
    assert_eq!(
        out.escalation.rejection_reason.as_deref(),
        Some("no export of restricted notes")
    );
    let state = e.store().get_run(rid("run-rej")).await.unwrap().unwrap();
    let export = &state.outcomes[&sid("export")];
    assert_eq!(export.status, StepStatus::Denied);
    assert_eq!(export.error.as_deref(), Some("escalation_rejected"));
    match begin(&e, "researcher", "run-rej", "export").await {
        StepGate::Replay { outcome, .. } => assert_eq!(outcome.status, StepStatus::Denied),
        other => panic!("{other:?}"),
    }
    // The approval can no longer be given.
    let late = e.approve_escalation(&esc, &Caller::Operator).await.unwrap();
    assert_eq!(late.decision.reason.as_str(), "escalation_not_pending");
    let log = audit(&e).await;
    let denial = log
        .iter()
        .find(|a| a.draft.operation == "step.begin" && a.draft.reason == "escalation_rejected")
        .unwrap();
    assert_eq!(denial.draft.subject, "researcher");
    assert_eq!(denial.draft.details["rejected_by"], json!("@operator"));
    assert!(matches!(
        e.approve_escalation("esc-nope", &Caller::Operator).await,
        Err(EngineError::NotFound {
            what: Missing::Escalation,
            ..
        })
    ));
}

/// Through `execute_sop`: the run pauses at the escalated step without
/// running its handler; after approval, re-executing the same run id
/// replays the completed steps and runs the approved one.
#[tokio::test]
async fn escalated_run_resumes_after_approval() {
    let e = lab_with(&escalating_policy()).await;
    let (handlers, effects) = recording_handlers();
    let s = sop(
        &e,
        r#"{"sop_id":"notes","version":1,"steps":[
            {"step_id":"summarize","action":"document.summarize","arguments":{"document_id":"d1"}},
            {"step_id":"export","action":"report.export","arguments":{}}]}"#,
    );
    // The summary is reported restricted by the adapter; the export after
    // it escalates.
    let run = rid("run-resume");
    e.admit_run(&id("researcher"), &s, Some(run.clone()))
        .await
        .unwrap();
    run_step(
        &e,
        "researcher",
        "run-resume",
        "summarize",
        &["special_category"],
    )
    .await;
    let report = e
        .execute_sop(&id("researcher"), &s, &handlers, Some(run.clone()))
        .await
        .unwrap();
    assert!(!report.completed);
    assert_eq!(report.steps[1].decision.verdict, Verdict::Escalate);
    assert!(effects.lock().unwrap().is_empty());
    let esc = e
        .list_escalations(Some(EscalationStatus::Pending))
        .await
        .unwrap()
        .pop()
        .unwrap();
    e.approve_escalation(&esc.escalation_id, &Caller::Operator)
        .await
        .unwrap();
    let report = e
        .execute_sop(&id("researcher"), &s, &handlers, Some(run))
        .await
        .unwrap();
    assert!(report.completed);
    assert!(!report.steps[0].executed && report.steps[1].executed);
    let done = effects.lock().unwrap().clone();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, "report.export");
}

// ---------------------------------------------------------------------------
// Declassification
// ---------------------------------------------------------------------------

async fn restricted_run(e: &Engine<impl Store>, run: &str) -> EnvelopeRecord {
    admit(
        e,
        "researcher",
        run,
        &[("collect", "artifact.save"), ("export", "report.export")],
    )
    .await;
    run_step(e, "researcher", run, "collect", &CUSTOMER_LABELS).await;
    let env = envelope_of(e, run).await;
    assert_eq!(env.aggregate_sensitivity, Sensitivity::Restricted);
    env
}

#[tokio::test]
async fn declassification_needs_a_listed_principal_and_a_justification() {
    let e = lab().await;
    let start = restricted_run(&e, "run-declass").await;
    let run = rid("run-declass");
    let everything = ls(&[
        "renewal_status",
        "usage_analytics",
        "financial_indicators",
        "customer-risk-profile",
    ]);

    // Refused: not a declassifier; no justification; labels left that still
    // imply more. Each refusal is recorded and changes nothing.
    let attempts = [
        (
            "researcher",
            "needed for the QBR",
            "declassification_not_authorized",
        ),
        (
            "formatter",
            "needed for the QBR",
            "declassification_not_authorized",
        ),
        ("report_manager", "   ", "declassification_invalid"),
        (
            "report_manager",
            "bad\njustification",
            "declassification_invalid",
        ),
    ];
    for (who, why, reason) in attempts {
        let out = e
            .declassify(&id(who), &run, Sensitivity::Internal, &everything, why)
            .await
            .unwrap();
        assert_eq!(out.decision.verdict, Verdict::Deny, "{who}");
        assert_eq!(out.decision.reason.as_str(), reason, "{who}");
        assert!(out.envelope.is_none());
        assert_eq!(envelope_of(&e, "run-declass").await, start);
    }
    let out = e
        .declassify(
            &id("report_manager"),
            &run,
            Sensitivity::Internal,
            &ls(&["customer-risk-profile"]),
            "needed for the QBR",
        )
        .await
        .unwrap();
    assert_eq!(out.decision.reason.as_str(), "declassification_invalid");
    assert_eq!(envelope_of(&e, "run-declass").await, start);

    // Allowed: a listed principal, a justification, nothing left above the
    // target. Restrictions stay.
    let out = e
        .declassify(
            &id("report_manager"),
            &run,
            Sensitivity::Internal,
            &everything,
            "aggregate approved for the internal QBR deck",
        )
        .await
        .unwrap();
    assert_eq!(out.decision.verdict, Verdict::Allow);
    assert_eq!(out.decision.reason.as_str(), "declassified");
    let lowered = out.envelope.unwrap();
    assert_eq!(lowered.version, start.version + 1);
    assert_eq!(lowered.aggregate_sensitivity, Sensitivity::Internal);
    assert_eq!(names(&lowered.labels), ["customer_name"]);
    assert!(lowered.derived.is_empty());
    assert_eq!(lowered.restrictions, start.restrictions);
    assert_eq!(envelope_of(&e, "run-declass").await, lowered);
    // Still no export: restrictions are never removed.
    let d = refused(begin(&e, "researcher", "run-declass", "export").await);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");

    let log = audit(&e).await;
    let declass = entries(&log, "context.declassify");
    assert_eq!(declass.len(), 6);
    let refusals: Vec<_> = declass
        .iter()
        .filter(|a| a.draft.verdict == Verdict::Deny)
        .collect();
    assert_eq!(refusals.len(), 5);
    assert!(
        refusals
            .iter()
            .all(|a| a.draft.details["envelope_version"] == json!(start.version))
    );
    let allowed = declass.last().unwrap();
    assert_eq!(allowed.draft.subject, "report_manager");
    assert_eq!(allowed.draft.reason, "declassified");
    assert_eq!(
        allowed.draft.details["justification"],
        json!("aggregate approved for the internal QBR deck")
    );
    assert_eq!(
        allowed.draft.details["declassified_by"],
        json!("report_manager")
    );
    assert_eq!(allowed.draft.details["classification"], json!("restricted"));
    assert_eq!(allowed.draft.details["sensitivity_to"], json!("internal"));
}

#[tokio::test]
async fn revoked_declassifier_is_refused() {
    let e = lab().await;
    let start = restricted_run(&e, "run-revoked").await;
    e.revoke_agent(&Caller::Operator, &id("report_manager"))
        .await
        .unwrap()
        .revoked()
        .unwrap();
    let out = e
        .declassify(
            &id("report_manager"),
            &rid("run-revoked"),
            Sensitivity::Public,
            &ls(&CUSTOMER_LABELS),
            "cleanup",
        )
        .await
        .unwrap();
    assert_eq!(out.decision.reason.as_str(), "agent_revoked");
    assert_eq!(envelope_of(&e, "run-revoked").await, start);
}

/// A store that yields to the scheduler before every call, so concurrent
/// engine calls interleave at every storage access, and counts envelope
/// compare-and-set conflicts.
struct Yielding {
    inner: MemoryStore,
    conflicts: std::sync::atomic::AtomicUsize,
}

impl Store for Yielding {
    warden_store::forward_store!(field inner before { tokio::task::yield_now().await };
        load_agents, insert_agent, set_agent_status, set_agent_capabilities, insert_token,
        find_token, revoke_token, get_records, put_record, delete_record, owner_usage,
        append_audit, audit_page, audit_head, create_run, get_run, record_step, record_step_as,
        lease_step, get_envelope,
        put_escalation, get_escalation, list_escalations, resolve_escalation, consume_escalation,
        create_session, get_session, get_session_head, update_session, list_sessions,
        take_request_tokens, signing_keys, insert_signing_key);

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: warden_store::AuditFn<warden_store::PutEnvelope>,
    ) -> Result<warden_store::PutEnvelope, warden_store::StoreError> {
        tokio::task::yield_now().await;
        let out = self
            .inner
            .put_envelope(record, expected_version, audit)
            .await?;
        if matches!(out, warden_store::PutEnvelope::Conflict { .. }) {
            self.conflicts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(out)
    }
}

/// A fold and a declassification racing on one envelope both land: the
/// loser of the compare-and-set re-reads and re-applies, nothing is lost.
#[tokio::test]
async fn concurrent_transitions_never_lose_a_fold() {
    let policy = warden_core::bundle::compile(LAB_POLICY).unwrap();
    let store = Yielding {
        inner: MemoryStore::new(),
        conflicts: Default::default(),
    };
    let e = Engine::open(
        policy,
        store,
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap();
    let (researcher, manager) = (id("researcher"), id("report_manager"));
    let run = rid("run-race");
    let s = warden_core::sop::parse_sop(
        r#"{"sop_id":"race","version":1,"steps":[
            {"step_id":"collect","action":"artifact.save","arguments":{"path":"internal/a"}},
            {"step_id":"more","action":"artifact.save","arguments":{"path":"internal/b"}}]}"#,
        &e.policy().sop_limits,
    )
    .unwrap();
    e.admit_run(&researcher, &s, Some(run.clone()))
        .await
        .unwrap();
    // `more` is left un-begun: its completion below then loads the
    // envelope itself (no ticket holding the gate's copy), which is what
    // lets it read the same version as the declassification and race it.
    for (step, labels) in [("collect", &["customer_name"][..])] {
        let step = sid(step);
        assert!(matches!(
            e.begin_step(&researcher, &run, &step).await.unwrap(),
            StepGate::Proceed { .. }
        ));
        if !labels.is_empty() {
            e.complete_step(
                &researcher,
                &run,
                &step,
                StepResult {
                    result: None,
                    result_labels: ls(labels),
                    error: None,
                },
            )
            .await
            .unwrap();
        }
    }
    let start = e.run_envelope(&run).await.unwrap().unwrap();
    let more = sid("more");
    // The fold adds an `internal` label, so the declassification to
    // `internal` is valid whichever lands first.
    let fold = e.complete_step(
        &researcher,
        &run,
        &more,
        StepResult {
            result: None,
            result_labels: ls(&["internal_document"]),
            error: None,
        },
    );
    let declass = e.declassify(&manager, &run, Sensitivity::Internal, &[], "routine");
    let (f, d) = tokio::join!(fold, declass);
    assert_eq!(f.unwrap().status, StepStatus::Completed);
    assert_eq!(d.unwrap().decision.verdict, Verdict::Allow);
    assert!(
        e.store()
            .conflicts
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 1,
        "the two transitions never raced"
    );
    let end = e.run_envelope(&run).await.unwrap().unwrap();
    assert_eq!(end.version, start.version + 2);
    assert!(end.labels.contains(&l("internal_document")));
    assert!(end.labels.contains(&l("customer_name")));
    let mut versions = Vec::new();
    for v in 0..=end.version {
        versions.push(
            e.envelope(&end.envelope_id, Some(v))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert!(
        versions
            .windows(2)
            .all(|w| w[1].version == w[0].version + 1)
    );
    // One transition entry per stored version after the first.
    let log = e.store().audit_page(0, usize::MAX).await.unwrap();
    let transitions = log
        .iter()
        .filter(|a| {
            matches!(
                a.draft.operation.as_str(),
                "context.accumulate" | "context.declassify"
            ) && a.draft.verdict == Verdict::Allow
        })
        .count() as u64;
    assert_eq!(transitions, end.version);
}

// ---------------------------------------------------------------------------
// Delegation
// ---------------------------------------------------------------------------

/// A child delegated from a restricted run inherits its restrictions and
/// sensitivity, loses the authority they forbid, and passes them on to its
/// own runs and children on every registration path.
#[tokio::test]
async fn delegation_inherits_on_every_path() {
    let e = lab().await;
    let parent_env = restricted_run(&e, "run-parent").await;

    let view = e
        .delegate_from_run(
            &id("researcher"),
            child(
                "analyst",
                &["artifact.save", "report.export", "memory.read"],
            ),
            rid("run-parent"),
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    // Laundering refused: report.export is not the analyst's.
    assert_eq!(
        view.declared_capabilities,
        caps(&["artifact.save", "memory.read"])
            .into_iter()
            .collect::<Vec<_>>()
    );
    assert!(
        !view
            .effective_capabilities
            .iter()
            .any(|c| c.as_str() == "report.export")
    );
    let env_id = view.envelope_id.clone().unwrap();
    let inherited = e.envelope(&env_id, None).await.unwrap().unwrap();
    assert_eq!(
        inherited.parent_envelope_id,
        Some(parent_env.envelope_id.clone())
    );
    assert_eq!(inherited.delegation_depth, 1);
    assert_eq!(inherited.agent_id, id("analyst"));
    assert_eq!(inherited.restrictions, parent_env.restrictions);
    assert_eq!(inherited.aggregate_sensitivity, Sensitivity::Restricted);
    assert_eq!(inherited.workflow_id, parent_env.workflow_id);
    let stored = e.store().load_agents().await.unwrap();
    let analyst = stored.iter().find(|a| a.id == id("analyst")).unwrap();
    assert_eq!(analyst.envelope_id, Some(env_id.clone()));

    let log = audit(&e).await;
    let narrowed = log
        .iter()
        .find(|a| a.draft.reason == "delegated_authority_narrowed")
        .unwrap();
    assert_eq!(narrowed.draft.details["removed"], json!(["report.export"]));
    let registered = log
        .iter()
        .find(|a| a.draft.reason == "agent_registered" && a.draft.resource == "analyst")
        .unwrap();
    assert_eq!(registered.draft.verdict, Verdict::Constrain);
    assert!(registered.draft.details["obligations"].is_array());
    let delegated = entries(&log, "context.delegate");
    assert_eq!(delegated.len(), 1);
    assert_eq!(delegated[0].draft.reason, "context_delegated");
    assert_eq!(
        delegated[0].draft.details["source_envelope_id"],
        json!(parent_env.envelope_id)
    );

    // The child's runs start from its envelope.
    admit(&e, "analyst", "run-analyst", &[("save", "artifact.save")]).await;
    let run_env = envelope_of(&e, "run-analyst").await;
    assert_eq!(run_env.parent_envelope_id, Some(env_id.clone()));
    assert_eq!(run_env.restrictions, inherited.restrictions);
    assert!(run_env.aggregate_sensitivity >= inherited.aggregate_sensitivity);
    match begin(&e, "analyst", "run-analyst", "save").await {
        StepGate::Proceed { decision, .. } => assert_eq!(decision.verdict, Verdict::Constrain),
        other => panic!("{other:?}"),
    }

    // A grandchild without `from_run` inherits from the child's envelope:
    // through `delegate` and through the operator's `register_agent`.
    let g1 = e
        .delegate(&id("analyst"), child("g1", &["artifact.save"]))
        .await
        .unwrap()
        .registered()
        .unwrap();
    let mut req = child("g2", &["artifact.save"]);
    req.parent = Some(id("analyst"));
    let g2 = e
        .register_agent(&Caller::Operator, req)
        .await
        .unwrap()
        .registered()
        .unwrap();
    for g in [g1, g2] {
        let env = e
            .envelope(g.envelope_id.as_ref().unwrap(), None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(env.parent_envelope_id, Some(env_id.clone()));
        assert_eq!(env.delegation_depth, 2);
        assert!(env.restrictions.is_superset(&inherited.restrictions));
        assert!(env.aggregate_sensitivity >= inherited.aggregate_sensitivity);
    }
    // ... and an external delegation from down there is still denied.
    let err = e
        .delegate_with(
            &id("analyst"),
            child("outside", &["artifact.save"]),
            DelegationOptions {
                zone: Some(TrustZone::External),
                ..DelegationOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(&err, Registration::Refused { decision: d, refusal: RegistrationRefusal::Context } if d.reason.as_str() == "restricted_by:no_external_delegation"),
        "{err:?}"
    );

    // A delegation from someone else's run is refused.
    let err = e
        .delegate_from_run(
            &id("analyst"),
            child("thief", &["artifact.save"]),
            rid("run-parent"),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::NotFound {
            what: Missing::Run,
            ..
        }
    ));
    assert!(e.agent(&id("thief")).is_err());
}

/// Declared restrictions and redaction: the child gets the restrictions it
/// is given on top of the inherited ones, and a redacted child keeps the
/// sensitivity and restrictions without the labels.
#[tokio::test]
async fn declared_restrictions_and_redaction() {
    let e = lab().await;
    let parent_env = restricted_run(&e, "run-redact").await;
    let view = e
        .delegate_with(
            &id("researcher"),
            child("scribe", &["artifact.save", "memory.write", "memory.read"]),
            DelegationOptions {
                from_run: Some(rid("run-redact")),
                restrictions: ls(&["no_memory_write"]),
                redact_labels: true,
                ..DelegationOptions::default()
            },
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    assert!(
        !view
            .effective_capabilities
            .iter()
            .any(|c| c.as_str() == "memory.write")
    );
    let env = e
        .envelope(view.envelope_id.as_ref().unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    assert!(env.labels.is_empty() && env.derived.is_empty());
    assert_eq!(env.aggregate_sensitivity, parent_env.aggregate_sensitivity);
    assert!(env.restrictions.is_superset(&parent_env.restrictions));
    assert!(env.restrictions.contains(&l("no_memory_write")));

    // With nothing to inherit, declared restrictions still bind the child.
    let view = e
        .delegate_with(
            &id("researcher"),
            child("fresh", &["artifact.save", "report.export"]),
            DelegationOptions {
                restrictions: ls(&["no_external_export"]),
                ..DelegationOptions::default()
            },
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    assert_eq!(
        view.declared_capabilities,
        caps(&["artifact.save"]).into_iter().collect::<Vec<_>>()
    );
    let env = e
        .envelope(view.envelope_id.as_ref().unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&env.restrictions), ["no_external_export"]);
    assert_eq!(env.aggregate_sensitivity, Sensitivity::Public);

    // An unknown restriction refuses the delegation; nothing is created.
    let err = e
        .delegate_with(
            &id("researcher"),
            child("odd", &["artifact.save"]),
            DelegationOptions {
                restrictions: ls(&["no_such_restriction"]),
                ..DelegationOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(
            err,
            Registration::Refused {
                refusal: RegistrationRefusal::Envelope(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(e.agent(&id("odd")).is_err());
    assert_eq!(
        audit(&e).await.last().unwrap().draft.reason,
        "unknown_restriction"
    );
}

/// An escalated delegation creates nothing until approved; the approval
/// lets exactly that delegation through once.
#[tokio::test]
async fn escalated_delegation_waits_for_approval() {
    let e = lab_with(&escalating_policy()).await;
    admit(
        &e,
        "researcher",
        "run-deleg",
        &[("collect", "artifact.save")],
    )
    .await;
    run_step(
        &e,
        "researcher",
        "run-deleg",
        "collect",
        &["special_category"],
    )
    .await;
    let options = DelegationOptions {
        from_run: Some(rid("run-deleg")),
        zone: Some(TrustZone::External),
        ..DelegationOptions::default()
    };
    let agents = e.store().load_agents().await.unwrap().len();
    let err = e
        .delegate_with(
            &id("researcher"),
            child("vendor", &["artifact.save"]),
            options.clone(),
        )
        .await
        .unwrap();
    let Registration::Escalated {
        decision,
        escalation_id,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(decision.reason.as_str(), "sensitivity_floor");
    assert_eq!(e.store().load_agents().await.unwrap().len(), agents);
    let esc = e.escalation(&escalation_id).await.unwrap();
    assert!(matches!(
        &esc.target,
        EscalationTarget::Delegation { parent, child, from_run, request_digest: Some(_) }
            if *parent == id("researcher") && *child == id("vendor")
                && *from_run == Some(rid("run-deleg"))
    ));
    e.approve_escalation(&escalation_id, &Caller::Operator)
        .await
        .unwrap();
    let view = e
        .delegate_with(
            &id("researcher"),
            child("vendor", &["artifact.save"]),
            options.clone(),
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    let env = e
        .envelope(view.envelope_id.as_ref().unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(env.aggregate_sensitivity, Sensitivity::Restricted);
    // Once: the next such delegation escalates again.
    let err = e
        .delegate_with(
            &id("researcher"),
            child("vendor2", &["artifact.save"]),
            options,
        )
        .await
        .unwrap();
    assert!(matches!(err, Registration::Escalated { .. }));
}

/// A run of `researcher` whose envelope holds a `restricted` label: an
/// external delegation from it escalates.
async fn restricted_source(e: &Engine<impl Store>, run: &str) {
    admit(e, "researcher", run, &[("collect", "artifact.save")]).await;
    run_step(e, "researcher", run, "collect", &["special_category"]).await;
}

/// The narrow delegation a reviewer approves: one capability, a declared
/// restriction, redacted labels.
fn narrow(run: &str) -> (RegisterAgent, DelegationOptions) {
    (
        child("vendor", &["artifact.save"]),
        DelegationOptions {
            from_run: Some(rid(run)),
            zone: Some(TrustZone::External),
            restrictions: ls(&["no_external_export"]),
            redact_labels: true,
            ..DelegationOptions::default()
        },
    )
}

/// The wide delegation of the same child id: every capability, no
/// restriction, no redaction, a config.
fn wide(run: &str) -> (RegisterAgent, DelegationOptions) {
    let mut req = child(
        "vendor",
        &[
            "memory.read",
            "memory.write",
            "document.summarize",
            "artifact.save",
            "report.export",
            "crm.lookup",
            "analytics.usage",
        ],
    );
    req.config = Some(json!({"model": "any"}));
    (
        req,
        DelegationOptions {
            from_run: Some(rid(run)),
            zone: Some(TrustZone::External),
            ..DelegationOptions::default()
        },
    )
}

async fn delegate(
    e: &Engine<impl Store>,
    (req, options): (RegisterAgent, DelegationOptions),
) -> Registration {
    e.delegate_with(&id("researcher"), req, options)
        .await
        .unwrap()
}

fn escalated(r: Registration) -> String {
    match r {
        Registration::Escalated { escalation_id, .. } => escalation_id,
        other => panic!("expected an escalation: {other:?}"),
    }
}

/// The attack: a reviewer approves a narrow delegation; the same child id
/// asked for with every capability, no restriction and no redaction does
/// not ride on that approval. It escalates afresh (its own escalation,
/// showing its own request) and creates nothing; the narrow request then
/// proceeds once, and the wide one's escalation is withdrawn with it.
#[tokio::test]
async fn an_approval_binds_the_exact_request_reviewed() {
    let e = lab_with(&escalating_policy()).await;
    restricted_source(&e, "run-bind").await;
    let agents = e.store().load_agents().await.unwrap().len();
    let narrow_id = escalated(delegate(&e, narrow("run-bind")).await);
    e.approve_escalation(&narrow_id, &Caller::Operator)
        .await
        .unwrap();

    let head = e.store().audit_head().await.unwrap().count;
    let wide_id = escalated(delegate(&e, wide("run-bind")).await);
    assert_ne!(wide_id, narrow_id);
    assert_eq!(e.store().load_agents().await.unwrap().len(), agents);
    assert!(e.agent(&id("vendor")).is_err(), "nothing was created");
    // The approval is untouched and the wide request waits on its own.
    assert_eq!(
        e.escalation(&narrow_id).await.unwrap().status,
        EscalationStatus::Approved
    );
    let wide_esc = e.escalation(&wide_id).await.unwrap();
    assert_eq!(wide_esc.status, EscalationStatus::Pending);
    let shown = wide_esc.request.clone().unwrap();
    assert_eq!(shown["capabilities"].as_array().unwrap().len(), 7);
    assert_eq!(shown["restrictions"], json!([]));
    assert_eq!(shown["redact_labels"], json!(false));
    assert_eq!(shown["zone"], json!("external"));
    assert_eq!(shown["config"], json!({"model": "any"}));
    let entries = audit(&e).await;
    let after: Vec<&AuditEntry> = entries.iter().filter(|x| x.seq >= head).collect();
    assert!(
        !after
            .iter()
            .any(|x| x.draft.reason.as_str() == "escalation_consumed"),
        "the wide request consumed nothing"
    );

    // The narrow request proceeds, once, exactly as reviewed.
    let view = delegate(&e, narrow("run-bind")).await.registered().unwrap();
    assert_eq!(
        view.declared_capabilities,
        vec![ActionName::parse("artifact.save").unwrap()]
    );
    let env = e
        .envelope(view.envelope_id.as_ref().unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    assert!(env.restrictions.contains(&l("no_external_export")));
    assert_eq!(
        e.escalation(&narrow_id).await.unwrap().status,
        EscalationStatus::Consumed
    );
    // The wide request can never proceed now: withdrawn in the same
    // transaction, recorded.
    let wide_esc = e.escalation(&wide_id).await.unwrap();
    assert_eq!(wide_esc.status, EscalationStatus::Rejected);
    assert_eq!(
        wide_esc.rejection_reason.as_deref(),
        Some("escalation_withdrawn")
    );
    assert!(audit(&e).await.iter().any(|x| {
        x.draft.reason.as_str() == "escalation_withdrawn"
            && x.draft.details["escalation_id"] == json!(wide_id)
            && x.draft.details["withdrawn_for"] == json!(narrow_id)
    }));
    assert!(
        e.list_escalations(Some(EscalationStatus::Pending))
            .await
            .unwrap()
            .is_empty()
    );
    // Once: the same request again is refused (the child exists).
    assert!(matches!(
        delegate(&e, narrow("run-bind")).await,
        Registration::Refused { .. }
    ));
    assert!(verify(&e).await > 0);
}

/// The reviewer is shown every field of the request, and the target's
/// digest is the SHA-256 of that request's canonical JSON.
#[tokio::test]
async fn the_escalation_shows_every_field_of_the_request() {
    let e = lab_with(&escalating_policy()).await;
    restricted_source(&e, "run-show").await;
    let id_ = escalated(delegate(&e, narrow("run-show")).await);
    let esc = e.escalation(&id_).await.unwrap();
    let request = esc.request.clone().unwrap();
    assert_eq!(
        request,
        json!({
            "child": "vendor",
            "parent": "researcher",
            "capabilities": ["artifact.save"],
            "tools": null,
            "config": null,
            "from_run": "run-show",
            "from_session": null,
            "zone": "external",
            "restrictions": ["no_external_export"],
            "redact_labels": true,
        })
    );
    let digest = warden_core::audit::Digest::of(&warden_core::canonical::to_canonical(&request));
    assert_eq!(esc.target.request_digest(), Some(digest));
    // A step's escalation shows the run, step, action and arguments.
    let step_esc = escalate_export(&e, "run-show-step").await;
    let step_esc = e.escalation(&step_esc).await.unwrap();
    let r = step_esc.request.clone().unwrap();
    assert_eq!(r["run_id"], json!("run-show-step"));
    assert_eq!(r["action"], json!("report.export"));
    assert!(r.get("arguments").is_some_and(Value::is_object));
    assert_eq!(
        step_esc.target.request_digest(),
        Some(warden_core::audit::Digest::of(
            &warden_core::canonical::to_canonical(&r)
        ))
    );
}

/// N concurrent delegations of one approved request: exactly one child is
/// created, the approval is consumed once and no pending escalation is
/// left behind.
#[tokio::test]
async fn concurrent_delegations_of_one_approval_create_one_child() {
    let e = lab_with(&escalating_policy()).await;
    restricted_source(&e, "run-race").await;
    let esc = escalated(delegate(&e, narrow("run-race")).await);
    // A competing request for the same child waits too.
    let other = escalated(delegate(&e, wide("run-race")).await);
    e.approve_escalation(&esc, &Caller::Operator).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let e = e.clone();
            tokio::spawn(async move {
                let (req, options) = narrow("run-race");
                e.delegate_with(&id("researcher"), req, options)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut registered = 0;
    for t in tasks {
        match t.await.unwrap() {
            Registration::Registered { .. } => registered += 1,
            Registration::Refused { .. } => {}
            Registration::Escalated { escalation_id, .. } => {
                panic!("left an escalation behind: {escalation_id}")
            }
        }
    }
    assert_eq!(registered, 1);
    let vendors = e
        .store()
        .load_agents()
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.id == id("vendor"))
        .count();
    assert_eq!(vendors, 1);
    assert!(
        e.list_escalations(Some(EscalationStatus::Pending))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        e.escalation(&other).await.unwrap().status,
        EscalationStatus::Rejected
    );
    let consumed = audit(&e)
        .await
        .iter()
        .filter(|x| x.draft.reason.as_str() == "escalation_consumed")
        .count();
    assert_eq!(consumed, 1);
}

/// An escalation stored before requests were bound (no digest, no
/// request) cannot be approved (refused, recorded, nothing changes) and no
/// request matches it: the request escalates afresh, and once that one is
/// approved and used, the old one is withdrawn.
#[tokio::test]
async fn an_unbound_escalation_is_never_approvable() {
    let e = lab_with(&escalating_policy()).await;
    restricted_source(&e, "run-old").await;
    // What an earlier version stored: the target without a digest.
    let fresh = escalated(delegate(&e, narrow("run-old")).await);
    let mut old = e.escalation(&fresh).await.unwrap();
    e.reject_escalation(&fresh, &Caller::Operator, "set aside")
        .await
        .unwrap();
    old.escalation_id = "esc-legacy".into();
    old.request = None;
    if let EscalationTarget::Delegation { request_digest, .. } = &mut old.target {
        *request_digest = None;
    }
    e.store()
        .put_escalation(old.clone(), Box::new(|_| Vec::new()))
        .await
        .unwrap();
    // Its stored form has no digest at all (as an old record's has not).
    let text = serde_json::to_string(&old.target).unwrap();
    assert!(!text.contains("request_digest"), "{text}");

    let head = e.store().audit_head().await.unwrap().count;
    let out = e
        .approve_escalation("esc-legacy", &Caller::Operator)
        .await
        .unwrap();
    assert_eq!(out.decision.verdict, Verdict::Deny);
    assert_eq!(out.decision.reason.as_str(), "escalation_unbound");
    assert_eq!(
        e.escalation("esc-legacy").await.unwrap(),
        old,
        "nothing changed"
    );
    let entries = audit(&e).await;
    assert_eq!(entries.len() as u64, head + 1);
    assert_eq!(
        entries.last().unwrap().draft.reason.as_str(),
        "escalation_unbound"
    );
    // The request escalates afresh rather than matching the old record.
    let new_id = escalated(delegate(&e, narrow("run-old")).await);
    assert_ne!(new_id, "esc-legacy");
    e.approve_escalation(&new_id, &Caller::Operator)
        .await
        .unwrap();
    delegate(&e, narrow("run-old")).await.registered().unwrap();
    let legacy = e.escalation("esc-legacy").await.unwrap();
    assert_eq!(legacy.status, EscalationStatus::Rejected);
    assert_eq!(
        legacy.rejection_reason.as_deref(),
        Some("escalation_withdrawn")
    );
}

/// Envelopes stored outside the narrowing path (a record restored under
/// this policy) still bind at admission: a step its restrictions deny
/// rejects the SOP before anything runs.
#[tokio::test]
async fn admission_rejects_steps_the_starting_restrictions_deny() {
    let store = MemoryStore::new();
    let now = Timestamp(1_700_000_000_000);
    let env_id = EnvelopeId::parse("env-legacy").unwrap();
    let record = EnvelopeRecord {
        envelope_id: env_id.clone(),
        parent_envelope_id: Some(EnvelopeId::parse("env-upstream").unwrap()),
        workflow_id: WorkflowId::parse("wf-legacy").unwrap(),
        agent_id: id("legacy"),
        labels: BTreeSet::new(),
        aggregate_sensitivity: Sensitivity::Confidential,
        derived: BTreeSet::new(),
        delegation_depth: 1,
        restrictions: [l("no_external_export")].into_iter().collect(),
        version: 0,
    };
    store
        .put_envelope(record, None, Box::new(|_| Vec::new()))
        .await
        .unwrap();
    for (agent, parent, c, env) in [
        (
            "report_manager",
            None,
            vec!["artifact.save", "report.export"],
            None,
        ),
        (
            "legacy",
            Some("report_manager"),
            vec!["artifact.save", "report.export"],
            Some(env_id.clone()),
        ),
    ] {
        store
            .insert_agent(
                StoredAgent {
                    id: id(agent),
                    parent: parent.map(id),
                    capabilities: caps(&c),
                    tools: Vec::new(),
                    config: None,
                    status: AgentStatus::Active,
                    created_at: now,
                    envelope_id: env,
                },
                Vec::new(),
            )
            .await
            .unwrap();
    }
    let policy = warden_core::bundle::compile(LAB_POLICY).unwrap();
    let e = Engine::open(policy, store, Arc::new(ManualClock::new(now)))
        .await
        .unwrap();
    let (handlers, effects) = recording_handlers();
    let s = sop_of(
        &e,
        &[("save", "artifact.save"), ("export", "report.export")],
    );
    let report = e
        .execute_sop(&id("legacy"), &s, &handlers, None)
        .await
        .unwrap();
    assert!(!report.admitted);
    assert_eq!(
        report.preflight.steps[1].reason().as_str(),
        "restricted_by:no_external_export"
    );
    assert!(effects.lock().unwrap().is_empty());
    // Without the export step the run starts from that envelope.
    let s = sop_of(&e, &[("save", "artifact.save")]);
    let report = e
        .execute_sop(&id("legacy"), &s, &handlers, None)
        .await
        .unwrap();
    assert!(report.completed);
    let env = e
        .run_envelope(report.run_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(env.parent_envelope_id, Some(env_id));
    assert_eq!(names(&env.restrictions), ["no_external_export"]);
    assert_eq!(env.aggregate_sensitivity, Sensitivity::Confidential);
}

// ---------------------------------------------------------------------------
// Authenticity across trust boundaries
// ---------------------------------------------------------------------------

#[tokio::test]
async fn exported_envelopes_verify_and_receipts_join() {
    let e = lab().await;
    admit(
        &e,
        "researcher",
        "run-export",
        &[("a", "crm.lookup"), ("b", "analytics.usage")],
    )
    .await;
    run_step(&e, "researcher", "run-export", "a", &[]).await;
    let issuer = IssuerId::parse("warden.test-1").unwrap();
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let mut verifier = Verifier::new();
    verifier.trust(issuer.clone(), key.verifying_key());
    let run = rid("run-export");

    let first = e
        .export_envelope(&Caller::Operator, &run, &issuer, &key)
        .await
        .unwrap();
    assert_eq!(first.envelope, envelope_of(&e, "run-export").await);
    let accepted = verifier.verify(&first).unwrap();
    assert_eq!(accepted.envelope.version, 1);
    // Replayed, tampered and forged tokens are rejected.
    assert_eq!(verifier.verify(&first).unwrap_err().code(), "replayed");
    let mut tampered = first.clone();
    tampered.envelope.aggregate_sensitivity = Sensitivity::Public;
    tampered.envelope.version = 9;
    assert_eq!(verifier.verify(&tampered).unwrap_err().code(), "forged");

    run_step(&e, "researcher", "run-export", "b", &[]).await;
    let second = e
        .export_envelope(&Caller::Operator, &run, &issuer, &key)
        .await
        .unwrap();
    assert_eq!(verifier.verify(&second).unwrap().envelope.version, 2);
    assert_eq!(verifier.verify(&first).unwrap_err().code(), "downgraded");

    let until = Timestamp(1_800_000_000_000);
    let receipt = e
        .receipt(&Caller::Operator, &run, &issuer, until)
        .await
        .unwrap();
    assert_eq!(
        receipt.envelope_ref,
        EnvelopeRef::compute(&issuer, &second.envelope.envelope_id, 2)
    );
    assert_eq!(receipt.sensitivity_tier, Sensitivity::Confidential);
    assert_eq!(receipt.resolvable_until, until);

    let log = audit(&e).await;
    let exports = entries(&log, "context.export");
    assert_eq!(exports.len(), 2);
    assert_eq!(exports[1].draft.reason, "envelope_exported");
    assert_eq!(exports[1].draft.details["envelope_version"], json!(2));
    assert_eq!(
        exports[1].draft.details["classification"],
        json!("confidential")
    );
    assert_eq!(entries(&log, "context.receipt").len(), 1);
}

// ---------------------------------------------------------------------------
// Without a context section nothing changes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn without_context_there_are_no_envelopes() {
    let e = lab_with(&policy_without_context()).await;
    assert!(e.context_policy().is_none());
    let run = admit(
        &e,
        "researcher",
        "run-plain",
        &[("a", "crm.lookup"), ("b", "report.export")],
    )
    .await;
    assert_eq!(run.envelope_id, None);
    let out = run_step(&e, "researcher", "run-plain", "a", &["anything"]).await;
    assert_eq!(out.status, StepStatus::Completed);
    assert_eq!(out.labels, ls(&["anything"]));
    run_step(&e, "researcher", "run-plain", "b", &[]).await;
    let view = e
        .delegate(&id("researcher"), child("plain_child", &["artifact.save"]))
        .await
        .unwrap()
        .registered()
        .unwrap();
    assert_eq!(view.envelope_id, None);
    assert!(e.run_envelope(&rid("run-plain")).await.unwrap().is_none());
    assert!(matches!(
        e.declassify(
            &id("report_manager"),
            &rid("run-plain"),
            Sensitivity::Public,
            &[],
            "x"
        )
        .await,
        Err(EngineError::NotFound {
            what: Missing::RunEnvelope,
            ..
        })
    ));
    let log = audit(&e).await;
    assert!(
        log.iter()
            .all(|a| !a.draft.operation.starts_with("context."))
    );
    assert!(
        log.iter()
            .all(|a| a.draft.details.get("envelope_id").is_none())
    );
}

#[test]
fn output_labels_must_be_declared_context_labels() {
    let bad = LAB_POLICY.replace(
        "output_labels: [usage_analytics]",
        "output_labels: [usage_analytics, clickstream]",
    );
    let err = warden_core::bundle::compile(&bad).unwrap_err();
    assert!(
        err.issues
            .iter()
            .any(|i| i.location == "actions.analytics.usage.output_labels[0]"
                && i.message.contains("clickstream")),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------

/// Labels a result may carry (one unknown to the policy).
const POOL: [&str; 7] = [
    "internal_document",
    "customer_name",
    "renewal_status",
    "usage_analytics",
    "financial_indicators",
    "customer-risk-profile",
    "mystery",
];

fn label_set() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(prop::sample::select(POOL.to_vec()), 0..4)
}

/// The reference model of the lab policy's sensitivity: the highest base
/// level of the labels seen, restricted once the four customer labels are
/// all there (or the derived profile label was reported).
fn model_level(seen: &BTreeSet<&str>) -> Sensitivity {
    let mut s = Sensitivity::Public;
    for l in seen {
        s = s.max(match *l {
            "internal_document" | "customer_name" => Sensitivity::Internal,
            "renewal_status" | "usage_analytics" | "financial_indicators" => {
                Sensitivity::Confidential
            }
            "customer-risk-profile" => Sensitivity::Restricted,
            _ => Sensitivity::Public,
        });
    }
    if CUSTOMER_LABELS.iter().all(|l| seen.contains(l)) {
        s = Sensitivity::Restricted;
    }
    s
}

fn declassify_versions(log: &[AuditEntry], env: &EnvelopeId) -> BTreeSet<u64> {
    log.iter()
        .filter(|a| {
            a.draft.operation == "context.declassify"
                && a.draft.verdict == Verdict::Allow
                && a.draft.details["envelope_id"] == json!(env)
        })
        .filter_map(|a| a.draft.details["version"].as_u64())
        .collect()
}

/// Over a stored history: versions strictly increase by one, restrictions
/// only grow, sensitivity and labels only drop at an allowed
/// declassification.
fn check_history(versions: &[EnvelopeRecord], declassified: &BTreeSet<u64>) {
    for w in versions.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        assert_eq!(b.version, a.version + 1);
        assert!(
            b.restrictions.is_superset(&a.restrictions),
            "{a:?} -> {b:?}"
        );
        if !declassified.contains(&b.version) {
            assert!(
                b.aggregate_sensitivity >= a.aggregate_sensitivity,
                "{a:?} -> {b:?}"
            );
            assert!(b.labels.is_superset(&a.labels));
            assert!(b.derived.is_superset(&a.derived));
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Step(Vec<&'static str>),
    Declassify { by_manager: bool, to: Sensitivity },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => label_set().prop_map(Op::Step),
        1 => (prop::bool::weighted(0.75), prop::sample::select(Sensitivity::ALL.to_vec()))
            .prop_map(|(by_manager, to)| Op::Declassify { by_manager, to }),
    ];
    prop::collection::vec(op, 1..10)
}

/// Random label streams through real runs (begin/complete with random
/// result labels, random declassification attempts): restrictions only
/// grow, sensitivity never drops without an allowed declassification, the
/// version strictly increases, the envelope matches the reference model
/// until the first declassification, and an unknown label stops the run
/// without touching the envelope.
#[test]
fn random_label_streams_through_runs() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    proptest!(ProptestConfig { cases: 64, ..ProptestConfig::default() }, |(ops in ops())| {
        rt.block_on(async {
            let e = lab().await;
            let steps: Vec<(String, &str)> = ops
                .iter()
                .enumerate()
                .filter(|(_, o)| matches!(o, Op::Step(_)))
                .map(|(i, _)| (format!("s{i}"), "artifact.save"))
                .collect();
            let step_refs: Vec<(&str, &str)> = steps.iter().map(|(s, a)| (s.as_str(), *a)).collect();
            if step_refs.is_empty() {
                return;
            }
            let run = admit(&e, "researcher", "run-prop", &step_refs).await;
            let env_id = run.envelope_id.clone().unwrap();
            let mut seen: BTreeSet<&str> = BTreeSet::new();
            let mut lowered = false;
            let mut stopped = false;
            for (i, op) in ops.iter().enumerate() {
                let before = envelope_of(&e, "run-prop").await;
                match op {
                    Op::Step(labels) => {
                        let step = format!("s{i}");
                        let gate = begin(&e, "researcher", "run-prop", &step).await;
                        if stopped {
                            assert_eq!(refused(gate).reason.as_str(), "run_stopped");
                            continue;
                        }
                        assert!(matches!(gate, StepGate::Proceed { .. }), "{gate:?}");
                        let out = complete(&e, "researcher", "run-prop", &step, labels).await;
                        let after = envelope_of(&e, "run-prop").await;
                        if labels.contains(&"mystery") {
                            assert_eq!(out.status, StepStatus::Failed);
                            assert_eq!(out.error.as_deref(), Some("unknown_label:mystery"));
                            assert_eq!(after, before);
                            stopped = true;
                        } else {
                            assert_eq!(out.status, StepStatus::Completed);
                            assert_eq!(after.version, before.version + 1);
                            seen.extend(labels.iter().copied());
                            if !lowered {
                                assert_eq!(after.aggregate_sensitivity, model_level(&seen));
                            }
                            for label in labels {
                                assert!(after.labels.contains(&l(label)));
                            }
                        }
                    }
                    Op::Declassify { by_manager, to } => {
                        let by = if *by_manager { "report_manager" } else { "researcher" };
                        // Remove what is above the target on its own, and
                        // break the combination if it would still imply more.
                        let mut remove: Vec<Label> = before
                            .labels
                            .iter()
                            .chain(before.derived.iter())
                            .filter(|l| model_level(&[l.as_str()].into_iter().collect()) > *to)
                            .cloned()
                            .collect();
                        if *to < Sensitivity::Restricted
                            && CUSTOMER_LABELS.iter().all(|c| before.labels.contains(&l(c)))
                        {
                            remove.push(l("financial_indicators"));
                        }
                        let out = e
                            .declassify(&id(by), &rid("run-prop"), *to, &remove, "periodic review")
                            .await
                            .unwrap();
                        let after = envelope_of(&e, "run-prop").await;
                        if *by_manager && *to <= before.aggregate_sensitivity {
                            assert_eq!(out.decision.verdict, Verdict::Allow, "{out:?}");
                            assert_eq!(after.aggregate_sensitivity, *to);
                            assert_eq!(after.restrictions, before.restrictions);
                            lowered = true;
                        } else {
                            assert_eq!(out.decision.verdict, Verdict::Deny);
                            assert_eq!(after, before);
                        }
                    }
                }
            }
            let log = audit(&e).await;
            check_history(&history(&e, &env_id).await, &declassify_versions(&log, &env_id));
        });
    });
}

#[derive(Debug, Clone)]
struct Delegation {
    /// Index into the agents created so far (0 = researcher).
    parent: prop::sample::Index,
    /// Delegate from the parent's run, or from the parent agent itself.
    from_run: bool,
    external: bool,
    declared: Vec<&'static str>,
    redact: bool,
    caps: Vec<&'static str>,
    labels: Vec<&'static str>,
}

fn delegation() -> impl Strategy<Value = Delegation> {
    (
        any::<prop::sample::Index>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::collection::vec(
            prop::sample::select(vec!["no_memory_write", "no_external_export"]),
            0..2,
        ),
        any::<bool>(),
        prop::collection::vec(
            prop::sample::select(vec![
                "artifact.save",
                "memory.read",
                "memory.write",
                "report.export",
            ]),
            1..4,
        ),
        prop::collection::vec(prop::sample::select(POOL[..6].to_vec()), 0..4),
    )
        .prop_map(
            |(parent, from_run, external, declared, redact, caps, labels)| Delegation {
                parent,
                from_run,
                external,
                declared,
                redact,
                caps,
                labels,
            },
        )
}

/// Random delegation trees: every child's envelope is at least as
/// restrictive and as sensitive as what it was delegated from, its runs
/// start from it, it holds no authority its envelope restricts, and a
/// refused delegation creates nothing.
#[test]
fn random_delegation_trees() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    proptest!(ProptestConfig { cases: 48, ..ProptestConfig::default() }, |(
        root_labels in prop::collection::vec(prop::sample::select(POOL[..6].to_vec()), 0..6),
        tree in prop::collection::vec(delegation(), 1..7),
    )| {
        rt.block_on(async {
            let e = lab().await;
            let policy = e.context_policy().unwrap().clone();
            // agent name, its (latest) run id
            let mut agents: Vec<(String, String)> = Vec::new();
            admit(&e, "researcher", "run-a0", &[("s", "artifact.save")]).await;
            run_step(&e, "researcher", "run-a0", "s", &root_labels).await;
            agents.push(("researcher".into(), "run-a0".into()));
            for (n, d) in tree.iter().enumerate() {
                let (parent, parent_run) = agents[d.parent.index(agents.len())].clone();
                let parent_view = e.agent(&id(&parent)).unwrap();
                // The source the child must inherit from, as it is now.
                let source = if d.from_run {
                    Some(envelope_of(&e, &parent_run).await)
                } else {
                    match &parent_view.envelope_id {
                        Some(env) => Some(e.envelope(env, None).await.unwrap().unwrap()),
                        None => None,
                    }
                };
                let name = format!("c{n}");
                let options = DelegationOptions {
                    from_run: d.from_run.then(|| rid(&parent_run)),
                    from_session: None,
                    from_envelope: None,
                    zone: d.external.then_some(TrustZone::External),
                    restrictions: ls(&d.declared),
                    redact_labels: d.redact,
                };
                let before = e.store().load_agents().await.unwrap().len();
                let out = e
                    .delegate_with(&id(&parent), child(&name, &d.caps), options)
                    .await;
                let view = match out {
                    Ok(Registration::Registered { agent, .. }) => *agent,
                    Ok(Registration::Refused { refusal: RegistrationRefusal::Context, .. })
                    | Ok(Registration::Escalated { .. }) => {
                        assert!(e.agent(&id(&name)).is_err());
                        assert_eq!(e.store().load_agents().await.unwrap().len(), before);
                        // Refused only with something to refuse on.
                        assert!(source.is_some() || !d.declared.is_empty());
                        continue;
                    }
                    Ok(other) => panic!("{other:?}"),
                    Err(other) => panic!("{other:?}"),
                };
                // Authority: within the parent's, nothing the envelope restricts.
                for c in &view.effective_capabilities {
                    assert!(parent_view.effective_capabilities.contains(c));
                }
                let Some(env_id) = view.envelope_id.clone() else {
                    assert!(source.is_none() && d.declared.is_empty());
                    continue;
                };
                let env = e.envelope(&env_id, None).await.unwrap().unwrap();
                if let Some(src) = &source {
                    assert_eq!(env.parent_envelope_id.as_ref(), Some(&src.envelope_id));
                    assert!(env.restrictions.is_superset(&src.restrictions), "{src:?} -> {env:?}");
                    assert!(env.aggregate_sensitivity >= src.aggregate_sensitivity);
                    assert_eq!(env.delegation_depth, src.delegation_depth + 1);
                    if !d.redact {
                        assert!(env.labels.is_superset(&src.labels));
                    }
                }
                for r in &d.declared {
                    assert!(env.restrictions.contains(&l(r)));
                }
                let restored = Envelope::restore(&env, &policy).unwrap();
                for c in &view.effective_capabilities {
                    let tags = e.policy().catalogue.by_name(c.as_str()).unwrap().tags();
                    let cd = decide(
                        &restored,
                        &policy,
                        &ContextRequest::Action(warden_core::envelope::ActionRef { name: c.as_str(), tags }),
                    );
                    assert!(!cd.reason.as_str().starts_with("restricted_by"), "{c} under {env:?}");
                }
                // The child's own run starts from its envelope and accumulates.
                if view.effective_capabilities.iter().any(|c| c.as_str() == "artifact.save") {
                    let run = format!("run-{name}");
                    admit(&e, &name, &run, &[("s", "artifact.save")]).await;
                    let start = envelope_of(&e, &run).await;
                    assert_eq!(start.parent_envelope_id.as_ref(), Some(&env_id));
                    assert!(start.restrictions.is_superset(&env.restrictions));
                    assert!(start.aggregate_sensitivity >= env.aggregate_sensitivity);
                    run_step(&e, &name, &run, "s", &d.labels).await;
                    let end = envelope_of(&e, &run).await;
                    assert!(end.restrictions.is_superset(&start.restrictions));
                    assert!(end.aggregate_sensitivity >= start.aggregate_sensitivity);
                    agents.push((name, run));
                }
            }
        });
    });
}

// ---------------------------------------------------------------------------
// Races for one slot between two servers
// ---------------------------------------------------------------------------

/// Every escalation, by id.
async fn escalation_of(
    e: &Engine<impl Store>,
    escalation_id: &str,
) -> warden_store::EscalationRecord {
    e.escalation(escalation_id).await.unwrap()
}

fn withdrawn(esc: &warden_store::EscalationRecord) -> bool {
    esc.status == EscalationStatus::Rejected
        && esc.rejection_reason.as_deref() == Some("escalation_withdrawn")
}

async fn no_pending(e: &Engine<impl Store>) {
    let pending = e
        .list_escalations(Some(EscalationStatus::Pending))
        .await
        .unwrap();
    assert!(pending.is_empty(), "left for a reviewer: {pending:?}");
}

async fn chain_verifies(e: &Engine<impl Store>) {
    let v = e.verify_audit().await.unwrap();
    assert!(v.is_valid(), "{v:?}");
}

/// Server B's wide request for a child id looks for an approval (none: the
/// reviewer approved the narrow one) and, before it stores its escalation,
/// server A's narrow request uses the approval and registers the child,
/// withdrawing the slot's pending escalations (B's is not stored yet). B's
/// escalation, stored after, could be approved but never used: it is
/// withdrawn at once and B is told the child exists.
#[tokio::test]
async fn a_delegation_that_lost_the_race_before_its_insert_is_withdrawn() {
    let ((a, _pa), (b, pb)) = two_servers(&escalating_policy()).await;
    restricted_source(&a, "run-race").await;
    let narrow_id = escalated(delegate(&a, narrow("run-race")).await);
    a.approve_escalation(&narrow_id, &Caller::Operator)
        .await
        .unwrap();

    pb.arm("put_escalation", 0);
    let (lost, won) = tokio::join!(delegate(&b, wide("run-race")), async {
        pb.reached().await;
        let won = delegate(&a, narrow("run-race")).await;
        pb.release();
        won
    });
    let view = won.registered().unwrap();
    assert_eq!(
        view.declared_capabilities,
        vec![ActionName::parse("artifact.save").unwrap()]
    );
    match lost {
        Registration::Refused {
            decision,
            refusal: RegistrationRefusal::Hierarchy(_),
        } => assert_eq!(decision.reason.as_str(), "duplicate_agent"),
        other => panic!("expected the child to exist: {other:?}"),
    }
    no_pending(&a).await;
    let all = a.list_escalations(None).await.unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    let wide_esc = all.iter().find(|x| x.escalation_id != narrow_id).unwrap();
    assert!(withdrawn(wide_esc), "{wide_esc:?}");
    assert_eq!(
        escalation_of(&a, &narrow_id).await.status,
        EscalationStatus::Consumed
    );
    // Recorded: the withdrawal names the escalation.
    let log = a.store().audit_page(0, usize::MAX).await.unwrap();
    assert!(
        log.iter()
            .any(|x| x.draft.reason.as_str() == "escalation_withdrawn"
                && x.draft.details["escalation_id"] == json!(wide_esc.escalation_id))
    );
    chain_verifies(&a).await;
}

/// The other order: B stores its escalation and looks for the child after
/// A used the approval but before A registered the child, so B's look
/// finds nothing and B's request is held. A, once the child is
/// registered, withdraws every pending escalation of the child id: B's
/// too.
#[tokio::test]
async fn a_delegation_held_just_before_the_child_is_registered_is_withdrawn() {
    let ((a, pa), (b, _pb)) = two_servers(&escalating_policy()).await;
    restricted_source(&a, "run-race2").await;
    let narrow_id = escalated(delegate(&a, narrow("run-race2")).await);
    a.approve_escalation(&narrow_id, &Caller::Operator)
        .await
        .unwrap();

    pa.arm("insert_agent", 0);
    let (won, lost) = tokio::join!(delegate(&a, narrow("run-race2")), async {
        pa.reached().await;
        let lost = delegate(&b, wide("run-race2")).await;
        pa.release();
        lost
    });
    won.registered().unwrap();
    let held = escalated(lost);
    assert!(withdrawn(&escalation_of(&a, &held).await));
    no_pending(&a).await;
    // Nothing left to approve: a reviewer's approval is refused.
    let out = a
        .approve_escalation(&held, &Caller::Operator)
        .await
        .unwrap();
    assert_ne!(out.escalation.status, EscalationStatus::Approved);
    chain_verifies(&a).await;
}

/// Server B begins an escalated step whose approval server A uses at the
/// same moment: B loaded the run before A took the lease, and looks for
/// the approval only after A took it, ran the step and recorded it. B's
/// escalation, stored after, could never be used (the step is never
/// begun again): withdrawn at once, and B is answered the step's outcome.
#[tokio::test]
async fn a_step_escalation_stored_after_the_step_ran_is_withdrawn() {
    let ((a, _pa), (b, pb)) = two_servers(&escalating_policy()).await;
    let esc = escalate_export(&a, "run-step-race").await;
    a.approve_escalation(&esc, &Caller::Operator).await.unwrap();

    pb.arm("consume_escalation", 0);
    let (lost, ()) = tokio::join!(begin(&b, "researcher", "run-step-race", "export"), async {
        pb.reached().await;
        assert!(matches!(
            begin(&a, "researcher", "run-step-race", "export").await,
            StepGate::Proceed { .. }
        ));
        complete(&a, "researcher", "run-step-race", "export", &[]).await;
        pb.release();
    });
    match lost {
        StepGate::Replay { outcome, .. } => assert_eq!(outcome.status, StepStatus::Completed),
        other => panic!("expected the recorded outcome: {other:?}"),
    }
    no_pending(&a).await;
    let all = a.list_escalations(None).await.unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(withdrawn(
        all.iter().find(|x| x.escalation_id != esc).unwrap()
    ));
    chain_verifies(&a).await;
}

/// The other order for a step: B stores its escalation and looks at the
/// run before A records the step (A holds the approval and the lease), so
/// B is held; A, once the outcome is recorded, withdraws B's escalation.
#[tokio::test]
async fn a_step_escalation_held_while_the_step_runs_is_withdrawn_when_it_is_recorded() {
    let ((a, pa), (b, pb)) = two_servers(&escalating_policy()).await;
    let esc = escalate_export(&a, "run-step-race2").await;
    a.approve_escalation(&esc, &Caller::Operator).await.unwrap();

    pb.arm("consume_escalation", 0);
    let (b_done, b_waits) = tokio::sync::oneshot::channel();
    let (lost, ()) = tokio::join!(
        async {
            let lost = begin(&b, "researcher", "run-step-race2", "export").await;
            b_done.send(()).unwrap();
            lost
        },
        async {
            pb.reached().await;
            assert!(matches!(
                begin(&a, "researcher", "run-step-race2", "export").await,
                StepGate::Proceed { .. }
            ));
            pa.arm("record_step_as", 0);
            tokio::join!(
                complete(&a, "researcher", "run-step-race2", "export", &[]),
                async {
                    pa.reached().await;
                    pb.release();
                    b_waits.await.unwrap();
                    pa.release();
                }
            );
        }
    );
    let StepGate::Escalated { escalation_id, .. } = lost else {
        panic!("B is held while A runs the step: {lost:?}");
    };
    assert_ne!(escalation_id, esc);
    assert!(withdrawn(&escalation_of(&a, &escalation_id).await));
    no_pending(&a).await;
    chain_verifies(&a).await;
}
