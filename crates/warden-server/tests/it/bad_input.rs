//! The bad-input catalogue: every case is a real HTTP request that must be
//! refused with a precise status and error code **and change nothing**.
//!
//! "Nothing" is checked by a snapshot taken before and after each case: all
//! agents (ids, parents, capabilities, status, config), the memory records
//! the cases aim at (for every agent), the state of a run, and every audit
//! entry whose verdict is not `deny`. Denials *may* append audit entries:
//! a denial leaves evidence (invariant 6), and evidence is not state. For
//! the same reason the per-step `sop.validate` verdicts of a rejected SOP
//! are left out (a rejected SOP records every step, allowed ones too). Each
//! case also leaves the server answering: a health check follows every one.

use serde_json::{Value, json};
use warden_core::ids::RunId;
use warden_store::{RunState, Store};

use crate::support::*;

/// How a case is sent.
enum Send {
    Http(Req),
    /// Request head and body as raw bytes.
    Raw(String, Vec<u8>),
}

struct Case {
    name: &'static str,
    send: Send,
    status: u16,
    code: &'static str,
}

fn case(name: &'static str, req: Req, status: u16, code: &'static str) -> Case {
    Case {
        name,
        send: Send::Http(req),
        status,
        code,
    }
}

/// The records the cases aim at.
const KEYS: &[(&str, &str)] = &[
    ("project", "client_region"),
    ("policy", "external_upload"),
    ("report", "retention_days"),
    ("credentials", "storage_token"),
    ("notes", "private_draft"),
    ("notes", "x"),
    ("notes", "big"),
    ("notes", "deep"),
    ("notes", "typed"),
    ("a", "b"),
];

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

fn nested_object(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!({ "k": v });
    }
    v
}

fn sop_with(steps: Vec<Value>) -> Value {
    json!({"sop_id": "bad", "version": 1, "steps": steps})
}

async fn run_state(s: &TestServer) -> Option<RunState> {
    s.store()
        .get_run(RunId::parse("run-a").unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_input_is_refused_precisely_and_changes_nothing() {
    let s = TestServer::start().await;
    let (manager, researcher, formatter) = s.lab_tokens().await;

    // Fixtures: a private note, a revoked token, a revoked agent, a run.
    s.put(
        "/v1/memory/notes/private_draft",
        &researcher,
        json!({"value": "researcher only", "visibility": "private"}),
    )
    .await
    .expect(201);
    let revoked = s
        .post_empty("/v1/agents/researcher/tokens", OP)
        .await
        .expect(201)
        .json();
    let revoked_token = revoked["token"].as_str().unwrap().to_owned();
    s.delete(
        &format!("/v1/tokens/{}", revoked["token_id"].as_str().unwrap()),
        OP,
    )
    .await
    .expect(200);
    let temp = s
        .post(
            "/v1/agents/self/children",
            &researcher,
            json!({"agent_id": "temp_child", "capabilities": ["memory.read"]}),
        )
        .await
        .expect(201)
        .json();
    let revoked_agent_token = temp["token"].as_str().unwrap().to_owned();
    s.delete("/v1/agents/temp_child", &researcher)
        .await
        .expect(200);
    s.post(
        "/v1/runs",
        &researcher,
        json!({"sop": sop_file("valid-report"), "run_id": "run-a"}),
    )
    .await
    .expect(201);

    let put = |path: &str, token: &str| Req::new("PUT", path.to_owned()).token(token);
    let r = researcher.as_str();
    let f = formatter.as_str();
    let m = manager.as_str();
    let mem = "/v1/memory/notes/x";
    let big_value = "v".repeat(300 * 1024);
    let long_token = "a".repeat(600);
    let many_steps: Vec<Value> = (0..51)
        .map(|i| json!({"step_id": format!("s{i}"), "action": "document.summarize", "arguments": {"document_id": "d"}}))
        .collect();
    let raw_head = |method: &str, path: &str, token: &str, extra: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\n{extra}\r\n"
        )
    };

    let cases = vec![
        // --- bodies that are not JSON, or not one JSON value ----------------
        case("truncated json", put(mem, r).raw("{\"value\": "), 400, "malformed_json"),
        case("trailing garbage", put(mem, r).raw("{\"value\": 1} x"), 400, "malformed_json"),
        case("empty body", put(mem, r).raw(""), 400, "malformed_json"),
        case("whitespace body", put(mem, r).raw("  \n "), 400, "malformed_json"),
        case("invalid utf-8", put(mem, r).raw(b"{\"value\": \"\xff\xfe\"}".to_vec()), 400, "malformed_json"),
        case("lone surrogate escape", put(mem, r).raw("{\"value\": \"\\ud800\"}"), 400, "malformed_json"),
        case("duplicate key", put(mem, r).raw("{\"value\": 1, \"value\": 2}"), 400, "duplicate_key"),
        case(
            "duplicate key deep inside",
            put(mem, r).raw("{\"value\": {\"a\": 1, \"a\": 2}}"),
            400,
            "duplicate_key",
        ),
        case(
            "nesting 100000 deep",
            put(mem, r).raw(format!("{{\"value\": {}}}", nested(100_000))),
            400,
            "json_too_deep",
        ),
        case(
            "nesting just over the limit",
            put(mem, r).raw(format!("{{\"value\": {}}}", nested(64))),
            400,
            "json_too_deep",
        ),
        case("number out of range", put(mem, r).raw("{\"value\": 1e400}"), 400, "malformed_json"),
        case("NaN literal", put(mem, r).raw("{\"value\": NaN}"), 400, "malformed_json"),
        // --- JSON of the wrong shape -----------------------------------------
        case("array body", put(mem, r).json(&json!([1])), 422, "wrong_type"),
        case("string body", put(mem, r).json(&json!("value")), 422, "wrong_type"),
        case("missing value", put(mem, r).json(&json!({})), 422, "missing_field"),
        case(
            "revision as string",
            put(mem, r).json(&json!({"value": 1, "expected_revision": "3"})),
            422,
            "wrong_type",
        ),
        case(
            "negative revision",
            put(mem, r).json(&json!({"value": 1, "expected_revision": -1})),
            422,
            "invalid_value",
        ),
        case(
            "revision beyond u64",
            put(mem, r).raw("{\"value\": 1, \"expected_revision\": 18446744073709551616}"),
            422,
            "wrong_type",
        ),
        case(
            "fractional revision",
            put(mem, r).json(&json!({"value": 1, "expected_revision": 1.5})),
            422,
            "wrong_type",
        ),
        case(
            "unknown visibility",
            put(mem, r).json(&json!({"value": 1, "visibility": "public"})),
            422,
            "invalid_value",
        ),
        case(
            "unknown class",
            put(mem, r).json(&json!({"value": 1, "class": "admin"})),
            422,
            "invalid_value",
        ),
        case(
            "combine without policy class",
            put(mem, r).json(&json!({"value": true, "combine": "all"})),
            422,
            "invalid_value",
        ),
        case(
            "policy class without combine",
            put("/v1/memory/notes/typed", r).json(&json!({"value": true, "class": "policy"})),
            422,
            "missing_field",
        ),
        case(
            "policy value not fitting its combinator",
            put("/v1/memory/notes/typed", r)
                .json(&json!({"value": "yes", "class": "policy", "combine": "all"})),
            422,
            "invalid_record",
        ),
        case(
            "secret made visible",
            put("/v1/memory/notes/typed", r)
                .json(&json!({"value": "s", "class": "secret", "visibility": "descendants"})),
            422,
            "invalid_record",
        ),
        case("unsupported media type", put(mem, r).raw("value=1").header("content-type", "text/plain"), 415, "unsupported_media_type"),
        case(
            "a JSON body without a content-type",
            put(mem, r).json(&json!({"value": 1})).without_content_type(),
            415,
            "unsupported_media_type",
        ),
        // --- sizes ------------------------------------------------------------
        case(
            "value over the per-value limit",
            put("/v1/memory/notes/big", r).json(&json!({ "value": big_value })),
            413,
            "value_too_large",
        ),
        Case {
            name: "content-length over the body limit",
            send: Send::Raw(
                raw_head("PUT", "/v1/memory/notes/big", r, "content-length: 2097152\r\n"),
                Vec::new(),
            ),
            status: 413,
            code: "body_too_large",
        },
        Case {
            name: "chunked body over the body limit",
            send: Send::Raw(
                raw_head("PUT", "/v1/memory/notes/big", r, "transfer-encoding: chunked\r\n"),
                {
                    let chunk = vec![b' '; 256 * 1024];
                    let mut body = Vec::new();
                    for _ in 0..6 {
                        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                        body.extend_from_slice(&chunk);
                        body.extend_from_slice(b"\r\n");
                    }
                    body.extend_from_slice(b"0\r\n\r\n");
                    body
                },
            ),
            status: 413,
            code: "body_too_large",
        },
        // --- tokens -----------------------------------------------------------
        case("no token", Req::new("GET", "/v1/memory/project/client_region"), 401, "missing_token"),
        case(
            "basic auth instead of bearer",
            Req::new("GET", "/v1/memory/project/client_region").header("authorization", "Basic cmVzZWFyY2hlcjpwdw=="),
            401,
            "invalid_token",
        ),
        case(
            "empty bearer",
            Req::new("GET", "/v1/memory/project/client_region").header("authorization", "Bearer "),
            401,
            "invalid_token",
        ),
        case(
            "unknown token",
            Req::new("GET", "/v1/memory/project/client_region").token(&format!("wdn_{}", "0".repeat(64))),
            401,
            "invalid_token",
        ),
        case(
            "over-long token",
            Req::new("GET", "/v1/memory/project/client_region").token(&long_token),
            401,
            "invalid_token",
        ),
        case(
            "token of another length with the right prefix",
            Req::new("GET", "/v1/memory/project/client_region").token(&r[..20]),
            401,
            "invalid_token",
        ),
        case(
            "revoked token",
            Req::new("GET", "/v1/memory/project/client_region").token(&revoked_token),
            401,
            "token_revoked",
        ),
        case(
            "revoked agent's token",
            Req::new("GET", "/v1/memory/project/client_region").token(&revoked_agent_token),
            403,
            "agent_revoked",
        ),
        case(
            "revoked agent tries to delegate",
            Req::new("POST", "/v1/agents/self/children")
                .token(&revoked_agent_token)
                .json(&json!({"agent_id": "zombie", "capabilities": ["memory.read"]})),
            403,
            "agent_revoked",
        ),
        case(
            "operator token on an agent route",
            Req::new("GET", "/v1/memory/project/client_region").token(OP),
            403,
            "agent_token_required",
        ),
        case(
            "agent token registering an agent",
            Req::new("POST", "/v1/agents").token(r).json(&json!({"agent_id": "mine", "capabilities": []})),
            403,
            "operator_only",
        ),
        case("agent token reading the audit log", Req::new("GET", "/v1/audit").token(r), 403, "operator_only"),
        case(
            "agent token issuing itself a token",
            Req::new("POST", "/v1/agents/researcher/tokens").token(r),
            403,
            "operator_only",
        ),
        // --- another agent's data, spoofed identities ------------------------
        case(
            "another agent's private record",
            Req::new("GET", "/v1/memory/notes/private_draft").token(f),
            404,
            "not_found",
        ),
        case(
            "a missing record (same answer)",
            Req::new("GET", "/v1/memory/notes/nothing_here").token(f),
            404,
            "not_found",
        ),
        case(
            "ancestor's secret",
            Req::new("GET", "/v1/memory/credentials/storage_token").token(r),
            404,
            "not_found",
        ),
        case(
            "spoofed owner on write",
            put("/v1/memory/report/retention_days", r)
                .json(&json!({"value": 0, "owner_agent_id": "report_manager"})),
            403,
            "actor_is_not_owner",
        ),
        case(
            "spoofed actor field",
            put("/v1/memory/report/retention_days", r)
                .json(&json!({"value": 0, "actor": "report_manager"})),
            422,
            "unknown_field",
        ),
        case(
            "delete of an ancestor's record (own scope is empty)",
            Req::new("DELETE", "/v1/memory/report/retention_days").token(r),
            404,
            "not_found",
        ),
        case(
            "write without the capability",
            put(mem, f).json(&json!({"value": 1})),
            403,
            "capability_not_inherited",
        ),
        case(
            "delegation naming another parent",
            Req::new("POST", "/v1/agents/self/children")
                .token(f)
                .json(&json!({"agent_id": "sneaky", "parent_id": "report_manager", "capabilities": ["memory.read"]})),
            403,
            "not_own_child",
        ),
        case(
            "sop writing the manager's memory",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_file("cross-owner-rewrite")})),
            403,
            "sop_rejected",
        ),
        case(
            "sop that claims administrator approval",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_file("injection-claims-approval")})),
            403,
            "sop_rejected",
        ),
        case(
            "headers naming another agent grant nothing",
            Req::new("GET", "/v1/memory/credentials/storage_token")
                .token(f)
                .header("host", "report_manager")
                .header("x-warden-agent", "report_manager")
                .header("x-forwarded-user", "report_manager"),
            404,
            "not_found",
        ),
        case(
            "manager drives the researcher's run",
            Req::new("POST", "/v1/runs/run-a/steps/summarize/begin").token(m),
            404,
            "not_found",
        ),
        case(
            "complete without begin",
            Req::new("POST", "/v1/runs/run-a/steps/summarize/complete").token(r).json(&json!({"result": "forged"})),
            409,
            "step_not_begun",
        ),
        case("unknown run", Req::new("POST", "/v1/runs/nope/steps/x/begin").token(r), 404, "not_found"),
        case(
            "unknown step",
            Req::new("POST", "/v1/runs/run-a/steps/nope/begin").token(r),
            404,
            "not_found",
        ),
        // --- paths and queries -------------------------------------------------
        case(
            "dot-dot segments",
            Req::new("GET", "/v1/memory/project/../credentials/storage_token").token(r),
            404,
            "not_found",
        ),
        case(
            "encoded slash in a key",
            Req::new("GET", "/v1/memory/credentials/..%2Fstorage_token").token(r),
            400,
            "invalid_identifier",
        ),
        case("encoded NUL in a key", Req::new("GET", "/v1/memory/notes/x%00").token(r), 400, "invalid_identifier"),
        case("invalid utf-8 in a path", Req::new("GET", "/v1/memory/%FF/key").token(r), 400, "invalid_path"),
        case(
            "over-long namespace",
            Req::new("GET", format!("/v1/memory/{}/key", "n".repeat(200))).token(r),
            400,
            "invalid_identifier",
        ),
        case(
            "invalid run id",
            Req::new("POST", "/v1/runs/bad%20id/steps/x/begin").token(r),
            400,
            "invalid_identifier",
        ),
        case("double slash", Req::new("GET", "/v1//memory/a/b").token(r), 404, "not_found"),
        case("unknown version prefix", Req::new("GET", "/v2/memory/a/b").token(r), 404, "not_found"),
        case("wrong method", Req::new("PATCH", "/v1/memory/a/b").token(r), 405, "method_not_allowed"),
        case(
            "delete with a non-numeric revision",
            Req::new("DELETE", "/v1/memory/notes/private_draft?expected_revision=abc").token(r),
            400,
            "invalid_query",
        ),
        case(
            "delete naming another owner in the query",
            Req::new("DELETE", "/v1/memory/report/retention_days?owner_agent_id=report_manager").token(r),
            400,
            "invalid_query",
        ),
        case(
            "delete at a stale revision",
            Req::new("DELETE", "/v1/memory/notes/private_draft?expected_revision=9").token(r),
            409,
            "revision_conflict",
        ),
        case(
            "write at a stale revision",
            put("/v1/memory/notes/private_draft", r).json(&json!({"value": 2, "expected_revision": 7})),
            409,
            "revision_conflict",
        ),
        case(
            "create-only on an existing record",
            put("/v1/memory/notes/private_draft", r).json(&json!({"value": 2, "expected_revision": 0})),
            409,
            "revision_conflict",
        ),
        case("audit page with a bad cursor", Req::new("GET", "/v1/audit?after=abc").token(OP), 400, "invalid_query"),
        case("audit page with an unknown parameter", Req::new("GET", "/v1/audit?agent=x").token(OP), 400, "invalid_query"),
        // --- agents and hierarchy ---------------------------------------------
        case(
            "duplicate registration",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "researcher", "parent_id": "report_manager"})),
            409,
            "duplicate_agent",
        ),
        case(
            "unknown parent",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "orphan", "parent_id": "ghost"})),
            422,
            "unknown_parent",
        ),
        case(
            "self as parent",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "loop", "parent_id": "loop"})),
            422,
            "unknown_parent",
        ),
        case(
            "cycle: the root under its grandchild",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "report_manager", "parent_id": "formatter"})),
            409,
            "duplicate_agent",
        ),
        case(
            "revoked parent",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "late", "parent_id": "temp_child"})),
            422,
            "parent_revoked",
        ),
        case(
            "reserved id",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "self"})),
            422,
            "reserved_agent_id",
        ),
        case(
            "unknown capability",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "a1", "capabilities": ["shell.eval"]})),
            422,
            "unknown_capability",
        ),
        case(
            "agent id with a space",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "bad id"})),
            422,
            "invalid_value",
        ),
        case(
            "agent id of 10000 characters",
            Req::new("POST", "/v1/agents").token(OP).json(&json!({"agent_id": "a".repeat(10_000)})),
            422,
            "invalid_value",
        ),
        case(
            "too many tools",
            Req::new("POST", "/v1/agents")
                .token(OP)
                .json(&json!({"agent_id": "a2", "tools": (0..65).map(|i| format!("t{i}")).collect::<Vec<_>>()})),
            422,
            "limit_exceeded",
        ),
        case(
            "child with a prompt-block write tool",
            Req::new("POST", "/v1/agents/self/children")
                .token(r)
                .json(&json!({"agent_id": "c1", "capabilities": ["memory.read"], "tools": ["memory_block_append"]})),
            403,
            "child_write_surface_tool",
        ),
        case(
            "pre-built child asking to self-edit",
            Req::new("POST", "/v1/agents/self/children")
                .token(r)
                .json(&json!({"agent_id": "c2", "tools": [], "config": {"prompt_block_self_edit": true}})),
            403,
            "child_self_edit_requested",
        ),
        case(
            "self-edit flag that is not a boolean",
            Req::new("POST", "/v1/agents/self/children")
                .token(r)
                .json(&json!({"agent_id": "c3", "config": {"prompt_block_self_edit": "yes"}})),
            422,
            "child_self_edit_flag_invalid",
        ),
        case(
            "child config that is not an object",
            Req::new("POST", "/v1/agents/self/children").token(r).json(&json!({"agent_id": "c4", "config": [1]})),
            422,
            "child_config_invalid",
        ),
        case("non-ancestor reads an agent", Req::new("GET", "/v1/agents/report_manager").token(f), 404, "not_found"),
        case("anyone reads a missing agent", Req::new("GET", "/v1/agents/ghost").token(f), 404, "not_found"),
        case("descendant revokes its parent", Req::new("DELETE", "/v1/agents/researcher").token(f), 404, "not_found"),
        case("agent revokes itself", Req::new("DELETE", "/v1/agents/formatter").token(f), 403, "not_an_ancestor"),
        case("operator revokes a missing agent", Req::new("DELETE", "/v1/agents/ghost").token(OP), 404, "not_found"),
        case("token for a missing agent", Req::new("POST", "/v1/agents/ghost/tokens").token(OP), 404, "not_found"),
        case("revoke a missing token", Req::new("DELETE", "/v1/tokens/tok_0000").token(OP), 404, "not_found"),
        case(
            "token for a revoked agent",
            Req::new("POST", "/v1/agents/temp_child/tokens").token(OP),
            409,
            "agent_revoked",
        ),
        // --- SOPs -------------------------------------------------------------
        case(
            "sop without the envelope",
            Req::new("POST", "/v1/sops/validate").token(r).json(&sop_file("valid-report")),
            422,
            "unknown_field",
        ),
        case(
            "sop version 0",
            Req::new("POST", "/v1/sops/validate").token(r).json(&json!({"sop": {"sop_id": "x", "version": 0, "steps": []}})),
            422,
            "invalid_sop",
        ),
        case(
            "sop version as string",
            Req::new("POST", "/v1/sops/validate").token(r).json(&json!({"sop": {"sop_id": "x", "version": "1", "steps": []}})),
            422,
            "invalid_sop",
        ),
        case(
            "sop step naming an actor",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_with(vec![
                json!({"step_id": "s", "action": "document.summarize", "actor": "report_manager", "arguments": {"document_id": "d"}})
            ])})),
            422,
            "invalid_sop",
        ),
        case(
            "sop with 51 steps",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_with(many_steps)})),
            422,
            "invalid_sop",
        ),
        case(
            "sop arguments over the size limit",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_with(vec![
                json!({"step_id": "s", "action": "document.summarize", "arguments": {"document_id": "x".repeat(70_000)}})
            ])})),
            422,
            "invalid_sop",
        ),
        case(
            "sop arguments nested too deep",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_with(vec![
                json!({"step_id": "s", "action": "document.summarize", "arguments": nested_object(40)})
            ])})),
            422,
            "invalid_sop",
        ),
        case(
            "sop with a duplicate key in arguments",
            Req::new("POST", "/v1/runs").token(r).raw(
                r#"{"sop": {"sop_id": "x", "version": 1, "steps": [{"step_id": "s", "action": "artifact.save", "arguments": {"path": "internal/a", "path": "/etc/passwd"}}]}}"#,
            ),
            400,
            "duplicate_key",
        ),
        case(
            "sop with an invalid run id",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_file("valid-report"), "run_id": "../x"})),
            422,
            "invalid_value",
        ),
        case(
            "reuse of a run id with another sop",
            Req::new("POST", "/v1/runs").token(r).json(&json!({"sop": sop_with(vec![
                json!({"step_id": "s", "action": "document.summarize", "arguments": {"document_id": "d"}})
            ]), "run_id": "run-a"})),
            409,
            "run_id_conflict",
        ),
    ];
    assert!(cases.len() >= 40, "{} cases", cases.len());

    let mut seen = std::collections::HashSet::new();
    for c in cases {
        assert!(seen.insert(c.name), "duplicate case name {}", c.name);
        let before = (s.snapshot(KEYS).await, run_state(&s).await);
        let resp = match c.send {
            Send::Http(req) => s.send(req).await,
            Send::Raw(head, body) => send_raw(s.addr, head, body).await,
        };
        assert_eq!(
            (resp.status, resp.code().as_str()),
            (c.status, c.code),
            "case `{}`: {}",
            c.name,
            resp.text()
        );
        let err = &resp.json()["error"];
        assert!(
            err["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty() && m.len() < 600),
            "case `{}`: {err}",
            c.name
        );
        assert!(err["details"].is_object(), "case `{}`", c.name);
        assert!(
            !resp.text().contains("researcher only")
                && !resp.text().contains("test-only-placeholder"),
            "case `{}` leaked a value",
            c.name
        );
        let after = (s.snapshot(KEYS).await, run_state(&s).await);
        assert!(before == after, "case `{}` changed state", c.name);
        s.send(Req::new("GET", "/healthz")).await.expect(200);
    }
    // The chain is intact after all of it.
    let v = s.get("/v1/audit/verify", OP).await.expect(200).json();
    assert_eq!(v["valid"], json!(true));
    s.stop().await;
}

#[tokio::test]
async fn a_hidden_record_and_a_missing_one_are_indistinguishable() {
    let s = TestServer::start().await;
    let (_, researcher, formatter) = s.lab_tokens().await;
    s.put(
        "/v1/memory/notes/private_draft",
        &researcher,
        json!({"value": "researcher only"}),
    )
    .await
    .expect(201);
    let hidden = s.get("/v1/memory/notes/private_draft", &formatter).await;
    let missing = s.get("/v1/memory/notes/never_written", &formatter).await;
    assert_eq!(
        (hidden.status, &hidden.body),
        (missing.status, &missing.body)
    );
    let mut h = hidden.headers.clone();
    let mut mi = missing.headers.clone();
    h.remove("date");
    mi.remove("date");
    assert_eq!(h, mi);
    // The audit log keeps the true reasons.
    let audit = s.audit().await;
    let reasons: Vec<&str> = audit
        .iter()
        .rev()
        .take(2)
        .map(|e| e.draft.reason.as_str())
        .collect();
    assert_eq!(reasons, ["record_not_found", "not_visible_from:researcher"]);
    // The same for agents.
    let a = s.get("/v1/agents/report_manager", &formatter).await;
    let b = s.get("/v1/agents/nobody", &formatter).await;
    assert_eq!((a.status, &a.body), (b.status, &b.body));
    s.stop().await;
}
