//! Context envelopes over HTTP: the design document's customer example end
//! to end (accumulation, the export gate, external delegation, signed
//! export, receipts, declassification), the escalation queue, and bad input
//! on the new routes, each checked against the response, the stored state
//! and the audit log.

use serde_json::{Value, json};
use warden_core::decision::Verdict;
use warden_core::envelope::IssuerId;
use warden_core::envelope::sign::{Verifier, VerifyingKey};
use warden_core::ids::RunId;
use warden_store::{EscalationStatus, StepStatus, Store};

use crate::support::*;

/// The customer example as a run of the researcher: three lookups, each
/// harmless alone, then an export.
fn customer_sop() -> Value {
    json!({
        "sop_id": "customer-review",
        "version": 1,
        "steps": [
            {"step_id": "crm", "action": "crm.lookup", "arguments": {"customer_id": "c-42"}},
            {"step_id": "usage", "action": "analytics.usage", "arguments": {"customer_id": "c-42"}},
            {"step_id": "finance", "action": "finance.indicators", "arguments": {"customer_id": "c-42"}},
            {"step_id": "export", "action": "report.export", "arguments": {}}
        ]
    })
}

/// The lab bundle with the design document's aggregation backstop added:
/// four or more labels at `internal` or above that no rule covers escalate.
/// (The shipped bundle has no case that escalates: its one rule restricts
/// both flows out, and a restriction denies before the floor escalates.)
fn backstop_policy() -> String {
    format!(
        "{LAB_POLICY}\n  backstop: {{min_labels: 4, at_or_above: internal, verdict: escalate}}\n"
    )
}

async fn admit(s: &TestServer, token: &str, run_id: &str, sop: Value) {
    s.post("/v1/runs", token, json!({"sop": sop, "run_id": run_id}))
        .await
        .expect(201);
}

/// Begin (must proceed) and complete one tool step with `labels`.
async fn run_step(
    s: &TestServer,
    token: &str,
    run: &str,
    step: &str,
    result: Value,
    labels: &[&str],
) {
    let gate = s
        .post_empty(&format!("/v1/runs/{run}/steps/{step}/begin"), token)
        .await
        .expect(200)
        .json();
    assert_eq!(gate["gate"], json!("proceed"), "{gate}");
    let done = s
        .post(
            &format!("/v1/runs/{run}/steps/{step}/complete"),
            token,
            json!({"result": result, "result_labels": labels}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(done["status"], json!("completed"), "{done}");
}

async fn envelope(s: &TestServer, token: &str, run: &str) -> Value {
    s.get(&format!("/v1/runs/{run}/envelope"), token)
        .await
        .expect(200)
        .json()
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect()
}

async fn step_status(
    s: &TestServer,
    run: &str,
    step: &str,
) -> Option<(StepStatus, Option<String>)> {
    let state = s
        .store()
        .get_run(RunId::parse(run).unwrap())
        .await
        .unwrap()
        .unwrap();
    state
        .outcomes
        .iter()
        .find(|(id, _)| id.as_str() == step)
        .map(|(_, o)| (o.status, o.error.clone()))
}

#[tokio::test]
async fn the_customer_example_end_to_end_over_http() {
    let s = TestServer::start().await;
    let (manager, researcher, formatter) = s.lab_tokens().await;
    admit(&s, &researcher, "cust-1", customer_sop()).await;

    // A fresh run's envelope: empty, public, a root.
    let e = envelope(&s, &researcher, "cust-1").await;
    assert_eq!(
        (
            e["sensitivity"].clone(),
            e["version"].clone(),
            e["delegation_depth"].clone()
        ),
        (json!("public"), json!(0), json!(0)),
        "{e}"
    );
    assert_eq!(e["parent_envelope_id"], json!(null));
    assert_eq!(e["agent_id"], json!("researcher"));
    assert!(names(&e["labels"]).is_empty());

    // Each lookup is harmless alone; labels come from `complete`.
    run_step(
        &s,
        &researcher,
        "cust-1",
        "crm",
        json!({"name": "ACME Corp", "renewal": "at risk"}),
        &["customer_name", "renewal_status"],
    )
    .await;
    let e = envelope(&s, &researcher, "cust-1").await;
    assert_eq!(e["sensitivity"], json!("confidential"));
    assert!(names(&e["restrictions"]).is_empty());
    // The usage step reports nothing: the catalogue's `output_labels` fold
    // anyway (an adapter that under-reports lowers nothing).
    run_step(
        &s,
        &researcher,
        "cust-1",
        "usage",
        json!({"logins": 3}),
        &[],
    )
    .await;
    run_step(
        &s,
        &researcher,
        "cust-1",
        "finance",
        json!({"arr": 120000}),
        &["financial_indicators"],
    )
    .await;

    // Together they are a restricted customer risk profile.
    let e = envelope(&s, &researcher, "cust-1").await;
    assert_eq!(e["sensitivity"], json!("restricted"), "{e}");
    assert_eq!(
        names(&e["labels"]),
        [
            "customer_name",
            "financial_indicators",
            "renewal_status",
            "usage_analytics"
        ]
    );
    assert_eq!(names(&e["derived"]), ["customer-risk-profile"]);
    assert_eq!(
        names(&e["restrictions"]),
        ["no_external_delegation", "no_external_export"]
    );
    let version = e["version"].as_u64().unwrap();
    assert_eq!(version, 3, "one version per fold: {e}");
    // Never data: no result value appears in the envelope.
    let text = e.to_string();
    for data in ["ACME", "at risk", "120000", "logins"] {
        assert!(!text.contains(data), "{text}");
    }
    // The operator sees it too; the read is recorded.
    let by_op = envelope(&s, OP, "cust-1").await;
    assert_eq!(by_op["envelope_id"], e["envelope_id"]);
    let last = s.last_audit().await;
    assert_eq!(
        (
            last.draft.operation.as_str(),
            last.draft.reason.as_str(),
            last.draft.subject.as_str()
        ),
        ("context.read", "envelope_read", "@operator")
    );

    // The export step is denied by the restriction the rule implied, and
    // recorded Denied (the run stops).
    let denied = s
        .post_empty("/v1/runs/cust-1/steps/export/begin", &researcher)
        .await
        .expect_error(403, "step_denied")
        .json();
    assert_eq!(
        denied["error"]["details"]["decision"]["reason"],
        json!("restricted_by:no_external_export")
    );
    assert_eq!(
        step_status(&s, "cust-1", "export").await.map(|(st, _)| st),
        Some(StepStatus::Denied)
    );
    assert!(
        s.audit()
            .await
            .iter()
            .any(|a| a.draft.operation == "step.begin"
                && a.draft.verdict == Verdict::Deny
                && a.draft.reason == "restricted_by:no_external_export")
    );

    // An external delegation from that run is refused and creates nothing.
    let before = s.snapshot(&[]).await;
    let r = s
        .post(
            "/v1/agents/self/children",
            &researcher,
            json!({"agent_id": "partner_bot", "capabilities": ["document.summarize"],
                   "from_run": "cust-1", "zone": "external"}),
        )
        .await
        .expect_error(403, "delegation_denied")
        .json();
    assert_eq!(
        r["error"]["details"]["reason"],
        json!("restricted_by:no_external_delegation")
    );
    assert_eq!(r["error"]["details"]["decision"]["verdict"], json!("deny"));
    assert_eq!(s.snapshot(&[]).await, before);
    s.get("/v1/agents/partner_bot", OP)
        .await
        .expect_error(404, "not_found");
    assert!(
        s.store()
            .load_agents()
            .await
            .unwrap()
            .iter()
            .all(|a| a.id.as_str() != "partner_bot")
    );

    // An internal delegation from the run passes the restrictions on: the
    // child's runs start from them, one hop deeper.
    let child = s
        .post(
            "/v1/agents/self/children",
            &researcher,
            json!({"agent_id": "risk_helper", "capabilities": ["report.export", "document.summarize"],
                   "from_run": "cust-1", "restrictions": ["no_memory_write"]}),
        )
        .await
        .expect(201)
        .json();
    // Authority narrowed: the envelope forbids exports.
    assert_eq!(
        names(&child["effective_capabilities"]),
        ["document.summarize"]
    );
    let helper = child["token"].as_str().unwrap().to_owned();
    admit(&s, &helper, "helper-1", json!({"sop_id": "h", "version": 1,
        "steps": [{"step_id": "sum", "action": "document.summarize", "arguments": {"document_id": "d1"}}]})).await;
    let he = envelope(&s, &helper, "helper-1").await;
    assert_eq!(he["sensitivity"], json!("restricted"), "{he}");
    assert_eq!(
        names(&he["restrictions"]),
        [
            "no_external_delegation",
            "no_external_export",
            "no_memory_write"
        ]
    );
    assert!(he["delegation_depth"].as_u64().unwrap() >= 1, "{he}");
    assert!(he["parent_envelope_id"].is_string(), "{he}");

    // Declassification by a non-declassifier (the run's own agent): 403,
    // recorded, envelope unchanged.
    let body = json!({"to": "confidential",
        "remove_labels": ["financial_indicators", "customer-risk-profile"],
        "justification": "finance figures are removed from the shared report"});
    let r = s
        .post("/v1/runs/cust-1/declassify", &researcher, body.clone())
        .await
        .expect_error(403, "declassification_not_authorized")
        .json();
    assert_eq!(r["error"]["details"]["decision"]["verdict"], json!("deny"));
    let last = s.last_audit().await;
    assert_eq!(
        (
            last.draft.operation.as_str(),
            last.draft.subject.as_str(),
            last.draft.verdict,
            last.draft.reason.as_str()
        ),
        (
            "context.declassify",
            "researcher",
            Verdict::Deny,
            "declassification_not_authorized"
        )
    );
    assert_eq!(
        envelope(&s, &researcher, "cust-1").await["version"],
        json!(version)
    );
    // An agent outside the run's lineage sees nothing: 404 (recorded).
    s.post("/v1/runs/cust-1/declassify", &formatter, body.clone())
        .await
        .expect_error(404, "not_found");

    // By the declassifier (the researcher's parent), with a justification:
    // lowered, restrictions kept, recorded with the justification.
    let r = s
        .post("/v1/runs/cust-1/declassify", &manager, body.clone())
        .await
        .expect(200)
        .json();
    assert_eq!(r["decision"]["verdict"], json!("allow"));
    assert_eq!(r["envelope"]["sensitivity"], json!("confidential"), "{r}");
    assert_eq!(r["envelope"]["version"], json!(version + 1));
    assert_eq!(
        names(&r["envelope"]["labels"]),
        ["customer_name", "renewal_status", "usage_analytics"]
    );
    assert!(names(&r["envelope"]["derived"]).is_empty());
    assert_eq!(
        names(&r["envelope"]["restrictions"]),
        ["no_external_delegation", "no_external_export"]
    );
    let entry = s
        .audit()
        .await
        .into_iter()
        .rev()
        .find(|a| a.draft.operation == "context.declassify" && a.draft.verdict == Verdict::Allow)
        .expect("declassification recorded");
    assert_eq!(entry.draft.subject, "report_manager");
    assert_eq!(entry.draft.reason, "declassified");
    assert_eq!(
        entry.draft.details["justification"],
        json!("finance figures are removed from the shared report")
    );
    assert_eq!(
        envelope(&s, &researcher, "cust-1").await["sensitivity"],
        json!("confidential")
    );

    // Signed export: verifies with the published key; a tampered copy does not.
    let key = s.get("/v1/envelope-key", "unused").await.expect(200).json();
    assert_eq!(key["algorithm"], json!("ed25519"));
    assert_eq!(key["key_source"], json!("stored"));
    assert_eq!(key["generation"], json!(1));
    assert_eq!(key["verifying_keys"][0]["issuer"], key["issuer"]);
    let token = s
        .get("/v1/runs/cust-1/envelope/signed", &researcher)
        .await
        .expect(200);
    let token_json = token.json();
    assert_eq!(token_json["issuer"], key["issuer"]);
    assert_eq!(token_json["envelope"]["version"], json!(version + 1));
    let last = s.last_audit().await;
    assert_eq!(
        (last.draft.operation.as_str(), last.draft.reason.as_str()),
        ("context.export", "envelope_exported")
    );
    let mut public = [0u8; 32];
    hex::decode_to_slice(key["public_key"].as_str().unwrap(), &mut public).unwrap();
    let trusted = || {
        let mut v = Verifier::new();
        v.trust(
            IssuerId::parse(key["issuer"].as_str().unwrap()).unwrap(),
            VerifyingKey::from_bytes(&public).unwrap(),
        );
        v
    };
    let verified = trusted().verify_json(&token.text()).unwrap();
    assert_eq!(verified.envelope.version, version + 1);
    let mut tampered = token_json.clone();
    tampered["envelope"]["restrictions"] = json!([]);
    let err = trusted().verify_json(&tampered.to_string()).unwrap_err();
    assert_eq!(err.code(), "forged", "{err}");
    let mut tampered = token_json.clone();
    tampered["envelope"]["aggregate_sensitivity"] = json!("public");
    assert!(trusted().verify_json(&tampered.to_string()).is_err());
    // Signed under a key the verifier does not trust: rejected too.
    let mut untrusting = Verifier::new();
    assert!(untrusting.verify_json(&token.text()).is_err());

    // A receipt: opaque reference, coarse tier, a window; no labels.
    let receipt = s
        .get("/v1/runs/cust-1/receipt", &researcher)
        .await
        .expect(200)
        .json();
    let reference = receipt["envelope_ref"].as_str().unwrap();
    assert!(reference.len() == 64 && reference.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(receipt["sensitivity_tier"], json!("confidential"));
    assert_eq!(receipt["issuer"], key["issuer"]);
    assert_eq!(
        receipt["resolvable_until"],
        json!(1_700_000_000_000_i64 + 30 * 24 * 3600 * 1000)
    );
    assert!(!receipt.to_string().contains("customer"), "{receipt}");
    assert_eq!(s.last_audit().await.draft.reason, "receipt_issued");

    // The run's envelope is the run agent's and the operator's alone.
    for route in ["envelope", "envelope/signed", "receipt"] {
        s.get(&format!("/v1/runs/cust-1/{route}"), &formatter)
            .await
            .expect_error(404, "not_found");
    }
    s.get("/v1/runs/cust-1/envelope/signed", OP)
        .await
        .expect(200);
    assert!(s.verify_chain().await > 0);
}

#[tokio::test]
async fn an_escalated_step_proceeds_once_on_approval_and_a_rejection_stops_the_run() {
    let s = TestServer::with(&backstop_policy(), warden_server::ServerConfig::default()).await;
    let (manager, researcher, formatter) = s.lab_tokens().await;
    let sop = json!({
        "sop_id": "wide-lookup", "version": 1,
        "steps": [
            {"step_id": "crm", "action": "crm.lookup", "arguments": {"customer_id": "c-7"}},
            {"step_id": "usage", "action": "analytics.usage", "arguments": {"customer_id": "c-7"}},
            {"step_id": "doc", "action": "document.summarize", "arguments": {"document_id": "d-7"}},
            {"step_id": "save", "action": "artifact.save", "arguments": {"path": "internal/a.txt"}},
            {"step_id": "save2", "action": "artifact.save", "arguments": {"path": "internal/b.txt"}}
        ]
    });
    admit(&s, &researcher, "wide-1", sop).await;
    run_step(&s, &researcher, "wide-1", "crm", json!({}), &[]).await;
    run_step(&s, &researcher, "wide-1", "usage", json!({}), &[]).await;
    run_step(&s, &researcher, "wide-1", "doc", json!({}), &[]).await;

    // Four labels no rule covers: the backstop holds the next step.
    let r = s
        .post_empty("/v1/runs/wide-1/steps/save/begin", &researcher)
        .await
        .expect_error(403, "step_escalated")
        .json();
    let esc = r["error"]["details"]["escalation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        r["error"]["details"]["decision"]["reason"],
        json!("aggregation_backstop")
    );
    assert!(step_status(&s, "wide-1", "save").await.is_none());
    // Asking again finds the same pending escalation.
    let again = s
        .post_empty("/v1/runs/wide-1/steps/save/begin", &researcher)
        .await
        .expect_error(403, "step_escalated")
        .json();
    assert_eq!(again["error"]["details"]["escalation_id"], json!(esc));

    // A delegation from that run is held too, and creates nothing until
    // approved; the approved retry goes through once.
    let child = json!({"agent_id": "wide_helper", "capabilities": ["document.summarize"],
                       "from_run": "wide-1"});
    let before = s.snapshot(&[]).await;
    let held = s
        .post("/v1/agents/self/children", &researcher, child.clone())
        .await
        .expect_error(403, "delegation_escalated")
        .json();
    assert_eq!(
        held["error"]["details"]["reason"],
        json!("aggregation_backstop")
    );
    let desc = held["error"]["details"]["escalation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let after = s.snapshot(&[]).await;
    assert_eq!(after.agents, before.agents);
    let held_entry = s
        .get(&format!("/v1/escalations/{desc}"), OP)
        .await
        .expect(200)
        .json();
    let digest = held_entry["target"]["request_digest"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(digest.len(), 64);
    assert_eq!(
        held_entry["target"],
        json!({"kind": "delegation", "parent_id": "researcher", "child_id": "wide_helper",
               "from_run": "wide-1", "request_digest": digest})
    );
    // The reviewer sees the whole request an approval lets through.
    assert_eq!(
        held_entry["request"],
        json!({"child": "wide_helper", "parent": "researcher",
               "capabilities": ["document.summarize"], "tools": null, "config": null,
               "from_run": "wide-1", "from_session": null, "zone": "internal",
               "restrictions": [], "redact_labels": false})
    );
    s.post_empty(&format!("/v1/escalations/{desc}/approve"), OP)
        .await
        .expect(200);
    // The same child id asked for more does not ride on that approval: it
    // is held afresh and creates nothing.
    let wider = json!({"agent_id": "wide_helper",
                       "capabilities": ["document.summarize", "artifact.save", "memory.write"],
                       "from_run": "wide-1", "zone": "external"});
    let before = s.snapshot(&[]).await;
    let held_wider = s
        .post("/v1/agents/self/children", &researcher, wider)
        .await
        .expect_error(403, "delegation_escalated")
        .json();
    let wider_id = held_wider["error"]["details"]["escalation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(wider_id, desc);
    assert_eq!(s.snapshot(&[]).await.agents, before.agents);
    s.post("/v1/agents/self/children", &researcher, child)
        .await
        .expect(201);
    // The wider request can never proceed now: withdrawn.
    let withdrawn = s
        .get(&format!("/v1/escalations/{wider_id}"), OP)
        .await
        .expect(200)
        .json();
    assert_eq!(withdrawn["status"], json!("rejected"));
    assert_eq!(withdrawn["rejection_reason"], json!("escalation_withdrawn"));
    s.get("/v1/agents/wide_helper", OP).await.expect(200);

    // The queue (operator only).
    let list = s
        .get("/v1/escalations?status=pending", OP)
        .await
        .expect(200)
        .json();
    let ids: Vec<&str> = list["escalations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["escalation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [esc.as_str()]);
    let one = s
        .get(&format!("/v1/escalations/{esc}"), OP)
        .await
        .expect(200)
        .json();
    assert_eq!(one["status"], json!("pending"));
    assert_eq!(
        one["target"],
        json!({"kind": "step", "run_id": "wide-1", "step_id": "save",
               "request_digest": one["target"]["request_digest"]})
    );
    assert_eq!(
        one["target"]["request_digest"].as_str().map(str::len),
        Some(64)
    );
    assert_eq!(one["request"]["run_id"], json!("wide-1"));
    assert_eq!(one["request"]["step_id"], json!("save"));
    assert_eq!(one["request"]["action"], json!("artifact.save"));
    assert!(one["request"]["arguments"].is_object());
    assert_eq!(one["requested_by"], json!("researcher"));
    assert_eq!(one["reason"], json!("aggregation_backstop"));
    assert_eq!(
        s.get("/v1/escalations?status=approved", OP)
            .await
            .expect(200)
            .json()["escalations"],
        json!([])
    );
    s.get("/v1/escalations", &researcher)
        .await
        .expect_error(403, "operator_only");
    s.get(&format!("/v1/escalations/{esc}"), &manager)
        .await
        .expect_error(403, "operator_only");

    // The requester may not approve its own request; an agent outside its
    // lineage cannot even see it. Both are recorded; nothing changes.
    s.post_empty(&format!("/v1/escalations/{esc}/approve"), &researcher)
        .await
        .expect_error(403, "escalation_reviewer_not_authorized");
    s.post_empty(&format!("/v1/escalations/{esc}/approve"), &formatter)
        .await
        .expect_error(404, "not_found");
    let denials = s
        .audit()
        .await
        .into_iter()
        .filter(|a| a.draft.reason == "escalation_reviewer_not_authorized")
        .count();
    assert_eq!(denials, 2);
    assert_eq!(
        s.get(&format!("/v1/escalations/{esc}"), OP)
            .await
            .expect(200)
            .json()["status"],
        json!("pending")
    );

    // The requester's parent approves: the step proceeds once.
    let approved = s
        .post_empty(&format!("/v1/escalations/{esc}/approve"), &manager)
        .await
        .expect(200)
        .json();
    assert_eq!(approved["decision"]["reason"], json!("escalation_approved"));
    assert_eq!(approved["escalation"]["status"], json!("approved"));
    assert_eq!(
        approved["escalation"]["resolved_by"],
        json!("report_manager")
    );
    s.post_empty(&format!("/v1/escalations/{esc}/approve"), OP)
        .await
        .expect_error(409, "escalation_not_pending");
    run_step(
        &s,
        &researcher,
        "wide-1",
        "save",
        json!({"saved": true}),
        &[],
    )
    .await;
    let used = s
        .get(&format!("/v1/escalations/{esc}"), OP)
        .await
        .expect(200)
        .json();
    assert_eq!(used["status"], json!("consumed"));
    assert!(
        s.audit()
            .await
            .iter()
            .any(|a| a.draft.operation == "step.begin" && a.draft.reason == "escalation_approved")
    );

    // The next step escalates again (the approval covered one step once);
    // the operator rejects it: the step is denied and the run stops.
    let r = s
        .post_empty("/v1/runs/wide-1/steps/save2/begin", &researcher)
        .await
        .expect_error(403, "step_escalated")
        .json();
    let esc2 = r["error"]["details"]["escalation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(esc2, esc);
    s.post(
        &format!("/v1/escalations/{esc2}/reject"),
        OP,
        json!({"reason": ""}),
    )
    .await
    .expect_error(422, "invalid_value");
    s.post(
        &format!("/v1/escalations/{esc2}/reject"),
        OP,
        json!({"reason": "no", "actor": "x"}),
    )
    .await
    .expect_error(422, "unknown_field");
    let rejected = s
        .post(
            &format!("/v1/escalations/{esc2}/reject"),
            OP,
            json!({"reason": "too broad a profile for an artifact"}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(rejected["escalation"]["status"], json!("rejected"));
    assert_eq!(
        rejected["escalation"]["rejection_reason"],
        json!("too broad a profile for an artifact")
    );
    let (status, _) = step_status(&s, "wide-1", "save2").await.unwrap();
    assert_eq!(status, StepStatus::Denied);
    let begin = s
        .post_empty("/v1/runs/wide-1/steps/save2/begin", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(begin["gate"], json!("replay"), "{begin}");
    assert_eq!(begin["outcome"]["status"], json!("denied"), "{begin}");
    let store_status = s
        .store()
        .get_escalation(esc2.clone())
        .await
        .unwrap()
        .unwrap()
        .status;
    assert_eq!(store_status, EscalationStatus::Rejected);
    assert_eq!(
        s.get("/v1/escalations?status=rejected", OP)
            .await
            .expect(200)
            .json()["escalations"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "the rejected step and the withdrawn wider delegation"
    );
}

#[tokio::test]
async fn bad_input_on_the_context_routes_changes_nothing() {
    let s = TestServer::start().await;
    let (manager, researcher, formatter) = s.lab_tokens().await;
    admit(&s, &researcher, "cust-2", customer_sop()).await;
    run_step(
        &s,
        &researcher,
        "cust-2",
        "crm",
        json!({}),
        &["customer_name"],
    )
    .await;
    let env_before = envelope(&s, &researcher, "cust-2").await;
    let before = s.snapshot(&[]).await;

    // Unknown run: 404 on every run route.
    for route in ["envelope", "envelope/signed", "receipt"] {
        s.get(&format!("/v1/runs/nope/{route}"), &researcher)
            .await
            .expect_error(404, "not_found");
        s.get(&format!("/v1/runs/nope/{route}"), OP)
            .await
            .expect_error(404, "not_found");
    }
    let ok_body = json!({"to": "public", "justification": "test"});
    s.post("/v1/runs/nope/declassify", &manager, ok_body.clone())
        .await
        .expect_error(404, "not_found");
    // Another agent's run: the same 404 (recorded as a denial).
    s.get("/v1/runs/cust-2/envelope", &formatter)
        .await
        .expect_error(404, "not_found");
    assert_eq!(s.last_audit().await.draft.reason, "not_run_agent");
    // A malformed run id: 400.
    s.get("/v1/runs/bad%20id/envelope", &researcher)
        .await
        .expect_error(400, "invalid_identifier");

    // Declassify: bad `to`, unknown fields, missing / empty / oversized
    // justification, unknown labels: 422 before anything is decided.
    for (body, code) in [
        (
            json!({"to": "secret", "justification": "x"}),
            "invalid_value",
        ),
        (json!({"to": 3, "justification": "x"}), "wrong_type"),
        (
            json!({"to": "public", "justification": "x", "actor": "report_manager"}),
            "unknown_field",
        ),
        (json!({"to": "public"}), "missing_field"),
        (
            json!({"to": "public", "justification": "   "}),
            "invalid_value",
        ),
        (
            json!({"to": "public", "justification": "a\nb"}),
            "invalid_value",
        ),
        (
            json!({"to": "public", "justification": "j".repeat(1025)}),
            "limit_exceeded",
        ),
        (
            json!({"to": "public", "justification": "x", "remove_labels": ["no_such_label"]}),
            "unknown_label",
        ),
    ] {
        let r = s
            .post("/v1/runs/cust-2/declassify", &manager, body.clone())
            .await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert_eq!(r.code(), code, "{body}: {}", r.text());
    }
    // The operator is not an agent: declassification needs an agent token.
    s.post("/v1/runs/cust-2/declassify", OP, ok_body.clone())
        .await
        .expect_error(403, "agent_token_required");
    // Delegation: unknown fields, bad zone, unknown restriction, another
    // agent's run.
    for (body, status, code) in [
        (
            json!({"agent_id": "c1", "actor": "x"}),
            422,
            "unknown_field",
        ),
        (
            json!({"agent_id": "c1", "zone": "mars"}),
            422,
            "invalid_value",
        ),
        (
            json!({"agent_id": "c1", "restrictions": ["no_such_restriction"]}),
            422,
            "unknown_restriction",
        ),
        (
            json!({"agent_id": "c1", "redact_labels": "yes"}),
            422,
            "wrong_type",
        ),
        (
            json!({"agent_id": "c1", "from_run": "nope"}),
            404,
            "not_found",
        ),
    ] {
        let r = s
            .post("/v1/agents/self/children", &researcher, body.clone())
            .await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (status, code),
            "{body}: {}",
            r.text()
        );
    }
    s.post(
        "/v1/agents/self/children",
        &manager,
        json!({"agent_id": "c1", "from_run": "cust-2"}),
    )
    .await
    .expect_error(404, "not_found");
    // Escalations: unknown id, bad status filter.
    s.get("/v1/escalations/esc-nope", OP)
        .await
        .expect_error(404, "not_found");
    s.post_empty("/v1/escalations/esc-nope/approve", OP)
        .await
        .expect_error(404, "not_found");
    s.post(
        "/v1/escalations/esc-nope/reject",
        OP,
        json!({"reason": "r"}),
    )
    .await
    .expect_error(404, "not_found");
    s.get("/v1/escalations?status=open", OP)
        .await
        .expect_error(400, "invalid_query");
    s.get("/v1/escalations?state=pending", OP)
        .await
        .expect_error(400, "invalid_query");

    assert_eq!(s.snapshot(&[]).await, before);
    let env_after = envelope(&s, &researcher, "cust-2").await;
    assert_eq!(env_after, env_before);
    assert!(
        s.store()
            .load_agents()
            .await
            .unwrap()
            .iter()
            .all(|a| a.id.as_str() != "c1")
    );
}

#[tokio::test]
async fn a_configured_signing_seed_gives_a_stable_key_across_restarts() {
    let seed = [7u8; 32];
    let config = || warden_server::ServerConfig {
        envelope_key: warden_server::EnvelopeKeyConfig::Seed(seed),
        ..warden_server::ServerConfig::default()
    };
    let a = TestServer::with(LAB_POLICY, config()).await;
    let b = TestServer::with(LAB_POLICY, config()).await;
    let ka = a.get("/v1/envelope-key", "x").await.expect(200).json();
    let kb = b.get("/v1/envelope-key", "x").await.expect(200).json();
    assert_eq!(ka, kb);
    assert_eq!(ka["key_source"], json!("configured"));
    let c = TestServer::start().await;
    let kc = c.get("/v1/envelope-key", "x").await.expect(200).json();
    assert_ne!(kc["public_key"], ka["public_key"]);
    assert_ne!(kc["issuer"], ka["issuer"]);
}
