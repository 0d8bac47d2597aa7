//! The lab document's report-production scenario, over HTTP: the eight
//! acceptance criteria, runs through the gate, delegation and revocation,
//! each checked against the response, the stored state and the audit log.

use serde_json::{Value, json};
use warden_core::decision::Verdict;
use warden_core::ids::RunId;
use warden_store::Store;

use crate::support::*;

#[tokio::test]
async fn the_eight_acceptance_criteria_hold_over_http() {
    let s = TestServer::start().await;
    let (manager, researcher, formatter) = s.lab_tokens().await;

    // 1. The researcher reads the region; the record still names its owner.
    let r = s
        .get("/v1/memory/project/client_region", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(r["value"], json!("EU"));
    assert_eq!(r["owner_agent_id"], json!("report_manager"));
    assert_eq!(r["revision"], json!(1));
    assert_eq!(r["reason"], json!("visible_from:report_manager"));
    let last = s.last_audit().await;
    assert_eq!(
        (last.draft.subject.as_str(), last.draft.reason.as_str()),
        ("researcher", "visible_from:report_manager")
    );

    // 2. The formatter reads descendant-visible memory, cannot write.
    let r = s
        .get("/v1/memory/report/retention_days", &formatter)
        .await
        .expect(200)
        .json();
    assert_eq!(
        (r["value"].clone(), r["owner_agent_id"].clone()),
        (json!(30), json!("report_manager"))
    );
    s.put("/v1/memory/notes/x", &formatter, json!({"value": 1}))
        .await
        .expect_error(403, "capability_not_inherited");
    assert!(s.record("formatter", "notes", "x").await.is_none());
    let me = s
        .get("/v1/agents/self", &formatter)
        .await
        .expect(200)
        .json();
    let caps: Vec<&str> = me["effective_capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(!caps.contains(&"memory.write"), "{caps:?}");

    // 3. The manager's private token reaches neither descendant; a hidden
    //    record answers exactly like a missing one.
    let missing = s
        .get("/v1/memory/credentials/no_such_key", &researcher)
        .await;
    for t in [&researcher, &formatter] {
        let hidden = s
            .get("/v1/memory/credentials/storage_token", t)
            .await
            .expect_error(404, "not_found");
        assert_eq!(hidden.body, missing.body);
        assert_eq!(
            s.last_audit().await.draft.reason,
            "not_visible_from:report_manager"
        );
    }
    let own = s
        .get("/v1/memory/credentials/storage_token", &manager)
        .await
        .expect(200)
        .json();
    assert_eq!(own["value"], json!("test-only-placeholder"));

    // 4. The researcher writes its own note; its child reads it.
    let w = s
        .put(
            "/v1/memory/notes/summary",
            &researcher,
            json!({"value": "Draft is ready", "visibility": "children"}),
        )
        .await
        .expect(201)
        .json();
    assert_eq!(
        (w["owner_agent_id"].clone(), w["revision"].clone()),
        (json!("researcher"), json!(1))
    );
    let r = s
        .get("/v1/memory/notes/summary", &formatter)
        .await
        .expect(200)
        .json();
    assert_eq!(
        (r["value"].clone(), r["owner_agent_id"].clone()),
        (json!("Draft is ready"), json!("researcher"))
    );

    // 5. A write to the manager's retention record is denied, recorded, and
    //    changes neither value nor revision.
    s.put(
        "/v1/memory/report/retention_days",
        &researcher,
        json!({"value": 0, "owner_agent_id": "report_manager", "expected_revision": 1}),
    )
    .await
    .expect_error(403, "actor_is_not_owner");
    let stored = s
        .record("report_manager", "report", "retention_days")
        .await
        .unwrap();
    assert_eq!((stored.value, stored.revision), (json!(30), 1));
    let denied: Vec<_> = s
        .audit()
        .await
        .into_iter()
        .filter(|e| e.draft.reason == "actor_is_not_owner")
        .collect();
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].draft.subject, "researcher");
    assert_eq!(
        denied[0].draft.resource,
        "report_manager:report.retention_days"
    );

    // 6. The unsafe upload SOP is rejected whole: every step's decision,
    //    no run, nothing to begin.
    let r = s
        .post(
            "/v1/runs",
            &researcher,
            json!({"sop": sop_file("unsafe-upload"), "run_id": "unsafe-1"}),
        )
        .await
        .expect_error(403, "sop_rejected")
        .json();
    let decisions = r["error"]["details"]["decisions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(decisions.len(), 3);
    assert_eq!(
        decisions[2]["decision"]["reason"],
        json!("action_not_in_effective_capabilities")
    );
    assert_eq!(decisions[0]["decision"]["verdict"], json!("allow"));
    assert!(
        s.store()
            .get_run(RunId::parse("unsafe-1").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    s.post_empty("/v1/runs/unsafe-1/steps/summarize/begin", &researcher)
        .await
        .expect_error(404, "not_found");

    // 7. An unknown action fails closed.
    let v = s
        .post(
            "/v1/sops/validate",
            &researcher,
            json!({"sop": sop_file("unknown-action")}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(v["admitted"], json!(false));
    assert_eq!(
        v["decisions"][0]["decision"]["reason"],
        json!("unknown_action")
    );

    // 8. Every decision carries subject, resource, reason and policy
    //    version; the log (read over HTTP) verifies; the secret value never
    //    entered it.
    let mut after = 0;
    let mut entries = Vec::new();
    loop {
        let page = s
            .get(&format!("/v1/audit?after={after}&limit=7"), OP)
            .await
            .expect(200)
            .json();
        entries.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_u64() {
            Some(n) => after = n,
            None => break,
        }
    }
    assert_eq!(entries.len() as u64, s.verify_chain().await);
    for e in &entries {
        for field in ["subject", "operation", "resource", "reason"] {
            assert!(!e[field].as_str().unwrap().is_empty(), "{e}");
        }
        assert_eq!(e["policy_version"], json!("lab-1"));
        assert!(!e.to_string().contains("test-only-placeholder"), "{e}");
    }
    let v = s.get("/v1/audit/verify", OP).await.expect(200).json();
    assert_eq!(v["valid"], json!(true));
    assert_eq!(v["count"].as_u64().unwrap(), entries.len() as u64);
    s.stop().await;
}

#[tokio::test]
async fn a_valid_run_goes_through_the_gate_step_by_step_and_replays() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    let admitted = s
        .post(
            "/v1/runs",
            &researcher,
            json!({"sop": sop_file("valid-report"), "run_id": "report-1"}),
        )
        .await
        .expect(201)
        .json();
    assert_eq!(admitted["run_id"], json!("report-1"));
    assert_eq!(
        admitted["steps"][0]["operation_id"],
        json!("report-1:summarize")
    );
    // Out of order: the second step waits for the first.
    s.post_empty("/v1/runs/report-1/steps/save/begin", &researcher)
        .await
        .expect_error(409, "step_out_of_order");
    let gate = s
        .post_empty("/v1/runs/report-1/steps/summarize/begin", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(gate["gate"], json!("proceed"));
    assert_eq!(gate["arguments"], json!({"document_id": "fixture-1"}));
    let done = s
        .post(
            "/v1/runs/report-1/steps/summarize/complete",
            &researcher,
            json!({"result": {"summary": "ok"}, "result_labels": ["internal_document"]}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(done["status"], json!("completed"));
    // Completing again returns the first outcome; beginning again replays.
    let again = s
        .post(
            "/v1/runs/report-1/steps/summarize/complete",
            &researcher,
            json!({"result": {"summary": "DIFFERENT"}}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(again["result"], json!({"summary": "ok"}));
    let replay = s
        .post_empty("/v1/runs/report-1/steps/summarize/begin", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(replay["gate"], json!("replay"));
    assert_eq!(replay["outcome"]["result"], json!({"summary": "ok"}));
    // Re-admitting the same id with the same SOP is idempotent; with
    // another SOP it is a conflict.
    let same = s
        .post(
            "/v1/runs",
            &researcher,
            json!({"sop": sop_file("valid-report"), "run_id": "report-1"}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(same["existing"], json!(true));
    s.post(
        "/v1/runs",
        &researcher,
        json!({"sop": sop_file("unknown-action"), "run_id": "report-1"}),
    )
    .await
    .expect_error(403, "sop_rejected");
    let other = json!({"sop_id": "other", "version": 1,
        "steps": [{"step_id": "s", "action": "document.summarize", "arguments": {"document_id": "x"}}]});
    s.post(
        "/v1/runs",
        &researcher,
        json!({"sop": other, "run_id": "report-1"}),
    )
    .await
    .expect_error(409, "run_id_conflict");
    // Another agent cannot drive the run, not even an ancestor.
    let manager = s.token_for("report_manager").await;
    s.post_empty("/v1/runs/report-1/steps/save/begin", &manager)
        .await
        .expect_error(404, "not_found");
    s.post_empty("/v1/runs/report-1/steps/save/begin", &researcher)
        .await
        .expect(200);
    s.post(
        "/v1/runs/report-1/steps/save/complete",
        &researcher,
        json!({"result": "saved"}),
    )
    .await
    .expect(200);
    let state = s
        .store()
        .get_run(RunId::parse("report-1").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.outcomes.len(), 2);
    s.stop().await;
}

#[tokio::test]
async fn memory_steps_of_a_run_are_executed_by_the_server() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    let sop = json!({"sop_id": "notes", "version": 1, "steps": [
        {"step_id": "remember", "action": "memory.write",
         "arguments": {"namespace": "notes", "key": "plan", "value": {"steps": 2}}},
        {"step_id": "recall", "action": "memory.read",
         "arguments": {"namespace": "project", "key": "client_region"}}
    ]});
    let run = s
        .post("/v1/runs", &researcher, json!({"sop": sop}))
        .await
        .expect(201)
        .json();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let g = s
        .post_empty(
            &format!("/v1/runs/{run_id}/steps/remember/begin"),
            &researcher,
        )
        .await
        .expect(200)
        .json();
    assert_eq!(g["gate"], json!("executed"));
    assert_eq!(g["outcome"]["status"], json!("completed"));
    let stored = s.record("researcher", "notes", "plan").await.unwrap();
    assert_eq!(stored.value, json!({"steps": 2}));
    let g = s
        .post_empty(
            &format!("/v1/runs/{run_id}/steps/recall/begin"),
            &researcher,
        )
        .await
        .expect(200)
        .json();
    assert_eq!(g["outcome"]["result"]["value"], json!("EU"));
    assert_eq!(
        g["outcome"]["result"]["owner_agent_id"],
        json!("report_manager")
    );
    s.stop().await;
}

#[tokio::test]
async fn an_injected_approval_is_denied_exactly_like_a_plain_request() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    let plain = s
        .post(
            "/v1/sops/validate",
            &researcher,
            json!({"sop": sop_file("unsafe-upload")}),
        )
        .await
        .expect(200)
        .json();
    let injected = s
        .post(
            "/v1/sops/validate",
            &researcher,
            json!({"sop": sop_file("injection-claims-approval")}),
        )
        .await
        .expect(200)
        .json();
    let reasons = |v: &Value| -> Vec<Value> {
        v["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["decision"]["reason"].clone())
            .collect()
    };
    assert_eq!(reasons(&plain), reasons(&injected));
    assert_eq!(injected["admitted"], json!(false));
    s.stop().await;
}

#[tokio::test]
async fn delegation_narrows_capabilities_and_revocation_cascades() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    let created = s
        .post(
            "/v1/agents/self/children",
            &researcher,
            json!({"agent_id": "summarizer",
                   "capabilities": ["memory.read", "document.summarize", "external.upload"],
                   "config": {"prompt_block_self_edit": true}}),
        )
        .await
        .expect(201)
        .json();
    assert_eq!(created["parent_id"], json!("researcher"));
    let caps = created["effective_capabilities"].clone();
    assert_eq!(caps, json!(["document.summarize", "memory.read"]));
    let child = created["token"].as_str().unwrap().to_owned();
    // Lockdown cleared the self-edit flag and recorded it.
    let view = s
        .get("/v1/agents/summarizer", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(view["config"]["prompt_block_self_edit"], json!(false));
    assert_eq!(
        view["lineage"],
        json!(["summarizer", "researcher", "report_manager"])
    );
    assert!(
        s.audit()
            .await
            .iter()
            .any(|e| e.draft.reason == "child_self_edit_sanitised"
                && e.draft.subject == "researcher")
    );
    // The child acts as itself, with inherited visibility.
    let r = s
        .get("/v1/memory/project/client_region", &child)
        .await
        .expect(200)
        .json();
    assert_eq!(r["reason"], json!("visible_from:report_manager"));
    // The child may not see its parent's agent record; the manager may.
    s.get("/v1/agents/researcher", &child)
        .await
        .expect_error(404, "not_found");
    let manager = s.token_for("report_manager").await;
    s.get("/v1/agents/summarizer", &manager).await.expect(200);
    // A grandchild, then revoke the child: both go, on the next request.
    let grand = s
        .post(
            "/v1/agents/self/children",
            &child,
            json!({"agent_id": "grandchild", "capabilities": ["memory.read"]}),
        )
        .await
        .expect(201)
        .json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    s.get("/v1/memory/project/client_region", &grand)
        .await
        .expect(200);
    let revoked = s
        .delete("/v1/agents/summarizer", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(revoked["revoked"], json!(["summarizer", "grandchild"]));
    s.get("/v1/memory/project/client_region", &child)
        .await
        .expect_error(403, "agent_revoked");
    s.get("/v1/memory/project/client_region", &grand)
        .await
        .expect_error(403, "agent_revoked");
    let last = s.last_audit().await;
    assert_eq!(
        (
            last.draft.subject.as_str(),
            last.draft.verdict,
            last.draft.reason.as_str()
        ),
        ("grandchild", Verdict::Deny, "agent_revoked")
    );
    // The operator cannot issue new tokens for a revoked agent.
    s.post_empty("/v1/agents/summarizer/tokens", OP)
        .await
        .expect_error(409, "agent_revoked");
    s.stop().await;
}

#[tokio::test]
async fn compare_and_set_over_http_lets_exactly_one_concurrent_writer_win() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    s.put(
        "/v1/memory/notes/status",
        &researcher,
        json!({"value": "started"}),
    )
    .await
    .expect(201);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let addr = s.addr;
        let t = researcher.clone();
        tasks.push(tokio::spawn(async move {
            send(
                addr,
                Req::new("PUT", "/v1/memory/notes/status")
                    .token(&t)
                    .json(&json!({"value": format!("writer {i}"), "expected_revision": 1})),
            )
            .await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        15,
        "{statuses:?}"
    );
    let stored = s.record("researcher", "notes", "status").await.unwrap();
    assert_eq!(stored.revision, 2);
    // The lab's stale update: the newer value survives.
    let r = s
        .put(
            "/v1/memory/notes/status",
            &researcher,
            json!({"value": "stale", "expected_revision": 1}),
        )
        .await
        .expect_error(409, "revision_conflict")
        .json();
    assert_eq!(r["error"]["details"]["current_revision"], json!(2));
    assert_eq!(
        s.record("researcher", "notes", "status")
            .await
            .unwrap()
            .revision,
        2
    );
    // Delete with a stale revision conflicts; with the right one it works.
    s.delete("/v1/memory/notes/status?expected_revision=1", &researcher)
        .await
        .expect_error(409, "revision_conflict");
    s.delete("/v1/memory/notes/status?expected_revision=2", &researcher)
        .await
        .expect(200);
    assert!(s.record("researcher", "notes", "status").await.is_none());
    s.stop().await;
}

/// Eight workers begin one client-executed step at once: one gets
/// `proceed` with the lease, the seven others 409 `step_in_progress` with
/// the lease's expiry. A completion with another lease id is 409
/// `step_lease_held` and records nothing; the holder's completes it.
#[tokio::test]
async fn one_worker_holds_a_step_and_only_it_completes() {
    let s = std::sync::Arc::new(TestServer::start().await);
    let researcher = s.token_for("researcher").await;
    s.post(
        "/v1/runs",
        &researcher,
        json!({"sop": sop_file("valid-report"), "run_id": "lease-1"}),
    )
    .await
    .expect(201);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = std::sync::Arc::clone(&s);
            let token = researcher.clone();
            tokio::spawn(async move {
                let r = s
                    .post_empty(
                        &format!("/v1/runs/lease-1/steps/summarize/begin?lease_id=w-{i}"),
                        &token,
                    )
                    .await;
                (r.status, r.json())
            })
        })
        .collect();
    let mut proceeded = Vec::new();
    let mut in_progress = Vec::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            200 => proceeded.push(body),
            409 => {
                assert_eq!(body["error"]["code"], json!("step_in_progress"), "{body}");
                in_progress.push(body["error"]["details"]["lease_expires_at"].clone());
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(proceeded.len(), 1);
    assert_eq!(in_progress.len(), 7);
    let gate = proceeded.remove(0);
    assert_eq!(gate["gate"], json!("proceed"));
    let holder = gate["lease_id"].as_str().unwrap().to_owned();
    assert!(in_progress.iter().all(|t| *t == gate["lease_expires_at"]));
    let other = if holder == "w-0" { "w-1" } else { "w-0" };
    s.post(
        "/v1/runs/lease-1/steps/summarize/complete",
        &researcher,
        json!({"result": {"summary": "x"}, "lease_id": other}),
    )
    .await
    .expect_error(409, "step_lease_held");
    let state = s
        .state
        .engine()
        .store()
        .get_run(RunId::parse("lease-1").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(state.outcomes.is_empty());
    let done = s
        .post(
            "/v1/runs/lease-1/steps/summarize/complete",
            &researcher,
            json!({"result": {"summary": "x"}, "lease_id": holder}),
        )
        .await
        .expect(200)
        .json();
    assert_eq!(done["status"], json!("completed"));
    // A malformed lease id is refused before anything is decided.
    s.post_empty(
        "/v1/runs/lease-1/steps/save/begin?lease_id=not%20valid",
        &researcher,
    )
    .await
    .expect_error(422, "invalid_value");
}
