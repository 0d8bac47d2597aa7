//! Every route driven through its success and its refusals, beyond what the
//! topic tests ask: unknown references, wrong callers, repeated and
//! out-of-order requests, bad labels, envelopes that are not envelopes. Each
//! answer is checked against the OpenAPI document
//! ([`crate::conformance::problems`]) and every departure is listed at
//! once.

use serde_json::{Value, json};
use warden_server::ServerConfig;

use crate::conformance::problems;
use crate::support::*;

struct Probe<'a> {
    s: &'a TestServer,
    found: Vec<String>,
    statuses: Vec<(String, u16)>,
}

impl Probe<'_> {
    async fn send(&mut self, req: Req) -> Resp {
        let (method, path) = (req.method, req.path.clone());
        let resp = exchange(self.s.addr, req).await;
        self.found.extend(problems(method, &path, &resp));
        self.statuses
            .push((format!("{method} {path}"), resp.status));
        resp
    }

    async fn call(
        &mut self,
        method: &'static str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Resp {
        let mut req = Req::new(method, path).token(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(req).await
    }
}

fn backstop_policy() -> String {
    format!(
        "{LAB_POLICY}\n  backstop: {{min_labels: 4, at_or_above: internal, verdict: escalate}}\n"
    )
}

#[tokio::test]
async fn every_answer_on_the_edges_is_documented() {
    let s = TestServer::with(&backstop_policy(), ServerConfig::default()).await;
    let (manager, researcher, formatter) = s.lab_tokens().await;
    let mut p = Probe {
        s: &s,
        found: Vec::new(),
        statuses: Vec::new(),
    };
    let (m, r, f) = (manager.as_str(), researcher.as_str(), formatter.as_str());

    // Agents: unknown parent, the reserved id, a duplicate, a child of
    // another, tokens for unknown and revoked agents.
    p.call(
        "POST",
        "/v1/agents",
        OP,
        Some(json!({"agent_id": "x1", "parent_id": "nobody"})),
    )
    .await;
    p.call("POST", "/v1/agents", OP, Some(json!({"agent_id": "self"})))
        .await;
    p.call(
        "POST",
        "/v1/agents",
        OP,
        Some(json!({"agent_id": "researcher"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents",
        OP,
        Some(json!({"agent_id": "x2", "capabilities": ["no.such"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents",
        OP,
        Some(json!({"agent_id": "x3", "config": 7})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents",
        OP,
        Some(json!({"agent_id": "x4", "parent_id": "formatter", "tools": ["update_memory_block"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents",
        OP,
        Some(json!({"agent_id": "x5", "parent_id": "formatter"})),
    )
    .await;
    p.call("POST", "/v1/agents", m, Some(json!({"agent_id": "x6"})))
        .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c1", "parent_id": "report_manager"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c2", "from_run": "nope"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c3", "from_session": "nope"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c4", "from_envelope": {"x": 1}})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c5", "restrictions": ["no_such"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c6", "zone": "external"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "c6"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        OP,
        Some(json!({"agent_id": "c7"})),
    )
    .await;
    p.call("GET", "/v1/agents/self", OP, None).await;
    p.call("GET", "/v1/agents/self", f, None).await;
    p.call("GET", "/v1/agents/report_manager", f, None).await;
    p.call("GET", "/v1/agents/nobody", OP, None).await;
    p.call("POST", "/v1/agents/nobody/tokens", OP, None).await;
    p.call("DELETE", "/v1/agents/researcher", r, None).await;
    p.call("DELETE", "/v1/agents/report_manager", r, None).await;
    p.call("DELETE", "/v1/agents/nobody", OP, None).await;
    p.call("DELETE", "/v1/agents/x5", OP, None).await;
    p.call("POST", "/v1/agents/x5/tokens", OP, None).await;
    p.call("DELETE", "/v1/agents/x5", OP, None).await;
    p.call("DELETE", "/v1/tokens/tok_nope", OP, None).await;
    p.call("DELETE", "/v1/tokens/..x", OP, None).await;
    p.call("DELETE", "/v1/agents/self", OP, None).await;

    // Memory: secret, hidden, conflicts, another owner, classes.
    p.call("GET", "/v1/memory/credentials/storage_token", r, None)
        .await;
    p.call("GET", "/v1/memory/policy/external_upload", r, None)
        .await;
    p.call("GET", "/v1/memory/nope/nope", r, None).await;
    p.call(
        "PUT",
        "/v1/memory/n/k",
        r,
        Some(json!({"value": 1, "expected_revision": 3})),
    )
    .await;
    p.call(
        "PUT",
        "/v1/memory/n/k",
        r,
        Some(json!({"value": 1, "owner_agent_id": "formatter"})),
    )
    .await;
    p.call(
        "PUT",
        "/v1/memory/n/k",
        r,
        Some(json!({"value": 1, "class": "policy"})),
    )
    .await;
    p.call(
        "PUT",
        "/v1/memory/n/k2",
        r,
        Some(json!({"value": 1, "class": "secret", "grants": ["nobody"]})),
    )
    .await;
    p.call(
        "PUT",
        "/v1/memory/n/k3",
        r,
        Some(json!({"value": 1, "class": "task", "expires_at": 1})),
    )
    .await;
    p.call(
        "PUT",
        "/v1/memory/n/k4",
        r,
        Some(json!({"value": 1, "class": "policy", "combine": "all"})),
    )
    .await;
    p.call("PUT", "/v1/memory/n/k", r, Some(json!({"value": 2})))
        .await;
    p.call(
        "PUT",
        "/v1/memory/n/k",
        r,
        Some(json!({"value": 2, "expected_revision": 0})),
    )
    .await;
    p.call("GET", "/v1/memory/n/k", f, None).await;
    p.call("DELETE", "/v1/memory/n/k?expected_revision=9", r, None)
        .await;
    p.call("DELETE", "/v1/memory/n/k?expected_revision=x", r, None)
        .await;
    p.call("DELETE", "/v1/memory/n/k", r, None).await;
    p.call("DELETE", "/v1/memory/n/k", r, None).await;
    p.call("DELETE", "/v1/memory/project/client_region", r, None)
        .await;

    // Runs: validate, admit, reuse, out of order, escalation, review.
    let sop = json!({"sop_id": "wide", "version": 1, "steps": [
        {"step_id": "crm", "action": "crm.lookup", "arguments": {"customer_id": "c-7"}},
        {"step_id": "usage", "action": "analytics.usage", "arguments": {"customer_id": "c-7"}},
        {"step_id": "doc", "action": "document.summarize", "arguments": {"document_id": "d-7"}},
        {"step_id": "save", "action": "artifact.save", "arguments": {"path": "internal/a.txt"}},
        {"step_id": "save2", "action": "artifact.save", "arguments": {"path": "internal/b.txt"}}
    ]});
    p.call("POST", "/v1/sops/validate", r, Some(json!({"sop": sop})))
        .await;
    p.call(
        "POST",
        "/v1/sops/validate",
        r,
        Some(json!({"sop": {"sop_id": "x"}})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sops/validate",
        r,
        Some(json!({"sop": sop_file("unsafe-upload")})),
    )
    .await;
    p.call(
        "POST",
        "/v1/runs",
        r,
        Some(json!({"sop": sop_file("unsafe-upload")})),
    )
    .await;
    p.call("POST", "/v1/runs", r, Some(json!({"sop": 3}))).await;
    p.call(
        "POST",
        "/v1/runs",
        r,
        Some(json!({"sop": sop, "run_id": "w1"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/runs",
        r,
        Some(json!({"sop": sop, "run_id": "w1"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/runs",
        r,
        Some(json!({"sop": sop_file("valid-report"), "run_id": "w1"})),
    )
    .await;
    p.call("POST", "/v1/runs/w1/steps/usage/begin", r, None)
        .await;
    p.call("POST", "/v1/runs/w1/steps/crm/complete", r, Some(json!({})))
        .await;
    p.call("POST", "/v1/runs/w1/steps/nope/begin", r, None)
        .await;
    p.call("POST", "/v1/runs/w1/steps/crm/begin", f, None).await;
    p.call("GET", "/v1/runs/w1/envelope", r, None).await;
    p.call("GET", "/v1/runs/w1/envelope", f, None).await;
    p.call("GET", "/v1/runs/w1/receipt", OP, None).await;
    p.call(
        "POST",
        "/v1/runs/w1/declassify",
        r,
        Some(json!({"to": "public", "justification": "x"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/runs/w1/declassify",
        m,
        Some(json!({"to": "top_secret", "justification": "x"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/runs/w1/declassify",
        m,
        Some(json!({"to": "public", "justification": ""})),
    )
    .await;
    p.call(
        "POST",
        "/v1/runs/w1/declassify",
        m,
        Some(json!({"to": "public", "justification": "x", "remove_labels": ["nope"]})),
    )
    .await;
    for step in ["crm", "usage", "doc"] {
        p.call("POST", &format!("/v1/runs/w1/steps/{step}/begin"), r, None)
            .await;
        p.call(
            "POST",
            &format!("/v1/runs/w1/steps/{step}/complete"),
            r,
            Some(json!({"result": {"ok": true}})),
        )
        .await;
        p.call(
            "POST",
            &format!("/v1/runs/w1/steps/{step}/complete"),
            r,
            Some(json!({"result": {"ok": false}})),
        )
        .await;
    }
    p.call("GET", "/v1/runs/w1/envelope/signed", r, None).await;
    let held = p
        .call("POST", "/v1/runs/w1/steps/save/begin", r, None)
        .await;
    let esc = held.json()["error"]["details"]["escalation_id"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "w_child", "from_run": "w1"})),
    )
    .await;
    p.call("GET", "/v1/escalations?status=pending", OP, None)
        .await;
    p.call("GET", "/v1/escalations?status=nope", OP, None).await;
    p.call("GET", &format!("/v1/escalations/{esc}"), OP, None)
        .await;
    p.call("GET", "/v1/escalations/nope", OP, None).await;
    p.call("POST", &format!("/v1/escalations/{esc}/approve"), r, None)
        .await;
    p.call("POST", &format!("/v1/escalations/{esc}/approve"), f, None)
        .await;
    p.call(
        "POST",
        &format!("/v1/escalations/{esc}/reject"),
        OP,
        Some(json!({"reason": ""})),
    )
    .await;
    p.call("POST", &format!("/v1/escalations/{esc}/approve"), m, None)
        .await;
    p.call("POST", &format!("/v1/escalations/{esc}/approve"), OP, None)
        .await;
    p.call(
        "POST",
        &format!("/v1/escalations/{esc}/reject"),
        OP,
        Some(json!({"reason": "late"})),
    )
    .await;
    p.call("POST", "/v1/runs/w1/steps/save/begin", r, None)
        .await;
    p.call(
        "POST",
        "/v1/runs/w1/steps/save/complete",
        r,
        Some(json!({"error": "disk full"})),
    )
    .await;
    p.call("POST", "/v1/runs/w1/steps/save2/begin", r, None)
        .await;
    // A result with a label the bundle does not know fails the step.
    p.call(
        "POST",
        "/v1/runs",
        r,
        Some(json!({"sop": sop_file("valid-report"), "run_id": "w2"})),
    )
    .await;
    p.call("POST", "/v1/runs/w2/steps/summarize/begin", r, None)
        .await;
    p.call(
        "POST",
        "/v1/runs/w2/steps/summarize/complete",
        r,
        Some(json!({"result": 1, "result_labels": ["no_such_label"]})),
    )
    .await;
    p.call("POST", "/v1/runs/w2/steps/save/begin", r, None)
        .await;

    // Sessions: open, repeat, conflict, calls, results, cancel.
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"session_id": "s1", "trusted_inputs": ["hi"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"session_id": "s1", "trusted_inputs": ["hi"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"session_id": "s1", "trusted_inputs": ["other"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"agent_id": "report_manager"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"agent_id": "nobody"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions",
        OP,
        Some(json!({"agent_id": "formatter"})),
    )
    .await;
    p.call("POST", "/v1/sessions", OP, Some(json!({}))).await;
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"plan": {"sop_id": "p"}})),
    )
    .await;
    p.call("POST", "/v1/sessions", r, Some(json!({"plan": {"sop_id": "p", "version": 1, "steps": [{"step_id": "a", "action": "crm.lookup", "arguments": {"customer_id": {"$bind": {"nope": 1}}}}]}}))).await;
    p.call(
        "POST",
        "/v1/sessions",
        r,
        Some(json!({"from_envelope": {"envelope": 1}})),
    )
    .await;
    p.call("GET", "/v1/sessions/s1", f, None).await;
    p.call("GET", "/v1/sessions/s1", m, None).await;
    p.call("POST", "/v1/sessions/s1/calls", r, Some(json!({"call_id": "c1", "action": "document.summarize", "arguments": {"document_id": "d"}}))).await;
    p.call("POST", "/v1/sessions/s1/calls", r, Some(json!({"call_id": "c1", "action": "document.summarize", "arguments": {"document_id": "e"}}))).await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls",
        r,
        Some(json!({"call_id": "c2", "action": "no.such", "arguments": {}})),
    )
    .await;
    p.call("POST", "/v1/sessions/s1/calls", r, Some(json!({"call_id": "c3", "action": "memory.read", "arguments": {"namespace": "project", "key": "client_region"}}))).await;
    p.call("POST", "/v1/sessions/s1/calls", r, Some(json!({"call_id": "c4", "action": "memory.write", "arguments": {"namespace": "n", "key": "s", "value": 1}}))).await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls",
        r,
        Some(json!({"call_id": "c5", "action": "crm.lookup", "arguments": 5})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls",
        f,
        Some(json!({"action": "artifact.save", "arguments": {"path": "internal/x"}})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls/c1/result",
        r,
        Some(json!({"result": "ok", "labels": ["nope"]})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls/c1/result",
        r,
        Some(json!({"result": "ok"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls/c1/result",
        r,
        Some(json!({"result": "other"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls/c2/result",
        r,
        Some(json!({"result": "ok"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls/nope/result",
        r,
        Some(json!({"result": "ok"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/cancel",
        f,
        Some(json!({"reason": "x"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/cancel",
        r,
        Some(json!({"reason": ""})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/cancel",
        r,
        Some(json!({"reason": "done"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/cancel",
        r,
        Some(json!({"reason": "again"})),
    )
    .await;
    p.call(
        "POST",
        "/v1/sessions/s1/calls",
        r,
        Some(json!({"action": "document.summarize", "arguments": {"document_id": "d"}})),
    )
    .await;
    p.call(
        "POST",
        "/v1/agents/self/children",
        r,
        Some(json!({"agent_id": "s_child", "from_session": "s1"})),
    )
    .await;

    // Audit and the public routes.
    p.call("GET", "/v1/audit?after=0&limit=5000", OP, None)
        .await;
    p.call("GET", "/v1/audit?limit=-1", OP, None).await;
    p.call("GET", "/v1/audit?extra=1", OP, None).await;
    p.call("GET", "/v1/audit/verify", OP, None).await;
    p.call("GET", "/v1/audit/verify", r, None).await;
    for path in ["/healthz", "/metrics", "/openapi.json", "/v1/envelope-key"] {
        p.send(Req::new("GET", path)).await;
    }
    // Bodies: a non-JSON content type, none at all, an array.
    p.send(
        Req::new("POST", "/v1/sessions")
            .token(r)
            .raw("{}")
            .header("content-type", "text/plain"),
    )
    .await;
    p.send(Req::new("POST", "/v1/sessions").token(r)).await;
    p.send(Req::new("POST", "/v1/sessions").token(r).json(&json!([])))
        .await;
    p.send(
        Req::new("POST", "/v1/runs/w1/steps/crm/begin")
            .token(r)
            .json(&json!({"x": 1})),
    )
    .await;

    assert!(
        p.found.is_empty(),
        "{} departures:\n{}",
        p.found.len(),
        p.found.join("\n")
    );
    // The probes reached what they meant to: each route answered, and
    // the run escalated.
    assert!(p.statuses.len() > 130, "{}", p.statuses.len());
    for (method, route) in warden_server::ROUTES {
        let template: Vec<&str> = route.split('/').collect();
        assert!(
            p.statuses.iter().any(|(sent, _)| {
                let (m, path) = sent.split_once(' ').unwrap();
                let path = path.split('?').next().unwrap();
                let segs: Vec<&str> = path.split('/').collect();
                m == *method
                    && segs.len() == template.len()
                    && segs
                        .iter()
                        .zip(&template)
                        .all(|(s, t)| t.starts_with('{') || s == t)
            }),
            "{method} {route} not probed"
        );
    }
    assert_ne!(esc, "none", "the run did not escalate");
    let _ = &s;
}
