//! Per-agent quotas from the bundle: 429 with a reason code, and a deny
//! decision in the audit log.

use serde_json::json;
use warden_core::decision::Verdict;
use warden_server::ServerConfig;

use crate::support::*;

fn policy() -> String {
    format!(
        "{LAB_POLICY}\nquotas:\n  agents:\n    researcher: {{max_records: 2, max_bytes: 64, max_runs_in_flight: 1}}\n    formatter: {{requests_per_second: 2}}\n"
    )
}

#[tokio::test]
async fn request_rate_is_a_token_bucket_on_the_server_clock() {
    let s = TestServer::with(&policy(), ServerConfig::default()).await;
    let formatter = s.token_for("formatter").await;
    s.get("/v1/memory/project/client_region", &formatter)
        .await
        .expect(200);
    s.get("/v1/memory/project/client_region", &formatter)
        .await
        .expect(200);
    let r = s
        .get("/v1/memory/project/client_region", &formatter)
        .await
        .expect_error(429, "quota_requests_per_second");
    assert_eq!(r.headers.get("retry-after").unwrap(), "1");
    assert_eq!(r.json()["error"]["details"]["retry_after_ms"], json!(500));
    let last = s.last_audit().await;
    assert_eq!(
        (
            last.draft.subject.as_str(),
            last.draft.verdict,
            last.draft.reason.as_str()
        ),
        ("formatter", Verdict::Deny, "quota_requests_per_second")
    );
    assert_eq!(last.draft.resource, "GET /v1/memory/{namespace}/{key}");
    // Other agents are not affected; time refills the bucket.
    let researcher = s.token_for("researcher").await;
    s.get("/v1/memory/project/client_region", &researcher)
        .await
        .expect(200);
    s.clock.advance(500);
    s.get("/v1/memory/project/client_region", &formatter)
        .await
        .expect(200);
    s.get("/v1/memory/project/client_region", &formatter)
        .await
        .expect_error(429, "quota_requests_per_second");
    s.stop().await;
}

#[tokio::test]
async fn record_and_byte_quotas_stop_growth_but_not_updates_or_deletes() {
    let s = TestServer::with(&policy(), ServerConfig::default()).await;
    let researcher = s.token_for("researcher").await;
    s.put("/v1/memory/notes/a", &researcher, json!({"value": "x"}))
        .await
        .expect(201);
    s.put("/v1/memory/notes/b", &researcher, json!({"value": "y"}))
        .await
        .expect(201);
    let before = s.snapshot(&[("notes", "c")]).await;
    s.put("/v1/memory/notes/c", &researcher, json!({"value": "z"}))
        .await
        .expect_error(429, "quota_max_records");
    assert_eq!(s.snapshot(&[("notes", "c")]).await, before);
    let last = s.last_audit().await;
    assert_eq!(
        (last.draft.operation.as_str(), last.draft.reason.as_str()),
        ("memory.write", "quota_max_records")
    );
    // Updating an existing record does not add a record.
    s.put("/v1/memory/notes/a", &researcher, json!({"value": "x2"}))
        .await
        .expect(200);
    // 64 bytes in all: enlarging `a` past it is refused, shrinking is fine.
    let big = "v".repeat(70);
    s.put("/v1/memory/notes/a", &researcher, json!({"value": big}))
        .await
        .expect_error(429, "quota_max_bytes");
    assert_eq!(
        s.record("researcher", "notes", "a").await.unwrap().value,
        json!("x2")
    );
    s.put("/v1/memory/notes/a", &researcher, json!({"value": 1}))
        .await
        .expect(200);
    // Deleting frees a slot.
    s.delete("/v1/memory/notes/b", &researcher)
        .await
        .expect(200);
    s.put("/v1/memory/notes/c", &researcher, json!({"value": "z"}))
        .await
        .expect(201);
    // A memory step of a run obeys the same quota: the step fails, nothing
    // is written.
    let sop = json!({"sop_id": "fill", "version": 1, "steps": [
        {"step_id": "w", "action": "memory.write",
         "arguments": {"namespace": "notes", "key": "d", "value": 1}}]});
    let run = s
        .post(
            "/v1/runs",
            &researcher,
            json!({"sop": sop, "run_id": "fill-1"}),
        )
        .await
        .expect(201);
    assert_eq!(run.json()["run_id"], json!("fill-1"));
    let g = s
        .post_empty("/v1/runs/fill-1/steps/w/begin", &researcher)
        .await
        .expect(200)
        .json();
    assert_eq!(g["outcome"]["status"], json!("failed"));
    assert_eq!(g["outcome"]["error"], json!("quota_max_records"));
    assert!(s.record("researcher", "notes", "d").await.is_none());
    s.stop().await;
}

#[tokio::test]
async fn runs_in_flight_are_limited_until_a_run_finishes() {
    let s = TestServer::with(&policy(), ServerConfig::default()).await;
    let researcher = s.token_for("researcher").await;
    let body = |run: &str| json!({"sop": sop_file("valid-report"), "run_id": run});
    s.post("/v1/runs", &researcher, body("r1"))
        .await
        .expect(201);
    s.post("/v1/runs", &researcher, body("r2"))
        .await
        .expect_error(429, "quota_max_runs_in_flight");
    assert_eq!(
        s.last_audit().await.draft.reason,
        "quota_max_runs_in_flight"
    );
    // Re-admitting the run in flight is idempotent, not a new run.
    s.post("/v1/runs", &researcher, body("r1"))
        .await
        .expect(200);
    for step in ["summarize", "save"] {
        s.post_empty(&format!("/v1/runs/r1/steps/{step}/begin"), &researcher)
            .await
            .expect(200);
        s.post(
            &format!("/v1/runs/r1/steps/{step}/complete"),
            &researcher,
            json!({"result": step}),
        )
        .await
        .expect(200);
    }
    s.post("/v1/runs", &researcher, body("r2"))
        .await
        .expect(201);
    // A failed step finishes a run too.
    s.post_empty("/v1/runs/r2/steps/summarize/begin", &researcher)
        .await
        .expect(200);
    s.post(
        "/v1/runs/r2/steps/summarize/complete",
        &researcher,
        json!({"error": "tool crashed"}),
    )
    .await
    .expect(200);
    s.post_empty("/v1/runs/r2/steps/save/begin", &researcher)
        .await
        .expect_error(409, "run_stopped");
    s.post("/v1/runs", &researcher, body("r3"))
        .await
        .expect(201);
    s.stop().await;
}

fn tree_policy() -> String {
    format!(
        "{LAB_POLICY}\nquotas:\n  default: {{requests_per_second: 50}}\n  agents:\n    researcher: {{tree_requests_per_second: 3}}\n"
    )
}

#[tokio::test]
async fn a_subtree_shares_its_tree_rate_and_refusals_do_not_flood_the_log() {
    let s = TestServer::with(&tree_policy(), ServerConfig::default()).await;
    let researcher = s.token_for("researcher").await;
    let formatter = s.token_for("formatter").await;
    let manager = s.token_for("report_manager").await;
    let path = "/v1/memory/project/client_region";
    // The researcher and its child share 3 per second, though each may do
    // 50 alone; the manager (outside the subtree) is not limited by it.
    s.get(path, &researcher).await.expect(200);
    s.get(path, &formatter).await.expect(200);
    s.get(path, &formatter).await.expect(200);
    let r = s
        .get(path, &researcher)
        .await
        .expect_error(429, "quota_requests_per_second");
    assert_eq!(
        r.json()["error"]["details"]["requests_per_second"],
        json!(3)
    );
    let first = s.last_audit().await;
    s.get(path, &manager).await.expect(200);
    let before = s.audit().await.len();
    assert_eq!(first.draft.details["limit"], json!("tree"));
    assert_eq!(first.draft.details["tree"], json!("researcher"));
    // 500 refusals of the formatter in the same second: its first is
    // recorded, the others only counted.
    for _ in 0..500 {
        s.get(path, &formatter)
            .await
            .expect_error(429, "quota_requests_per_second");
    }
    assert_eq!(s.audit().await.len(), before + 1);
    // The next second: one accepted request records the count first.
    s.clock.advance(1_000);
    s.get(path, &formatter).await.expect(200);
    let counts: Vec<_> = s
        .audit()
        .await
        .into_iter()
        .filter(|e| e.draft.details.get("suppressed").is_some())
        .collect();
    assert_eq!(counts.len(), 1, "{counts:#?}");
    assert_eq!(counts[0].draft.details["suppressed"], json!(499));
    assert_eq!(counts[0].draft.reason, "quota_requests_per_second");
    s.stop().await;
}
