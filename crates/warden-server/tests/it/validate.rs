//! `POST /v1/sops/validate` on plans: admitted as a session admits them,
//! every step's provenance explained, every step's decision recorded with
//! its findings; an SOP keeps its answer; a bad plan is refused, located,
//! and changes nothing. The OpenAPI document says so.

use serde_json::{Value, json};
use warden_server::ServerConfig;

use super::support::{Req, TestServer, sop_file};

const POLICY: &str = r#"
policy_version: validate-http
environment_capabilities: [read_file, get_balance, send_money, send_email]
actions:
  read_file:
    arguments: {type: object, required: [file_path], properties: {file_path: {type: string}}}
  get_balance:
    output: {trust: trusted}
  send_money:
    arguments:
      type: object
      required: [recipient, amount]
      properties: {recipient: {type: string}, amount: {type: number}, subject: {type: string}}
    tags: [state_changing]
    provenance:
      - {argument: recipient, from: [user, trusted], otherwise: escalate, match: caseless}
  send_email:
    tags: [state_changing]
    provenance:
      - {argument: "to[*]", from: [user], otherwise: deny, match: caseless}
agents:
  - id: payer
    capabilities: [read_file, get_balance, send_money, send_email]
  - id: reader
    parent: payer
    capabilities: [read_file]
"#;

fn plan() -> Value {
    json!({"sop_id": "pay-bill", "version": 1, "steps": [
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": "bill.txt"}},
        {"step_id": "balance", "action": "get_balance", "arguments": {}},
        {"step_id": "pay", "action": "send_money", "arguments": {
            "recipient": {"$bind": {"step": "read"}}, "amount": {"$bind": {}}, "subject": "bill"}},
        {"step_id": "refund", "action": "send_money", "arguments": {
            "recipient": {"$bind": {"step": "balance"}}, "amount": 5}},
        {"step_id": "mail", "action": "send_email", "arguments": {
            "to": ["me@example.com", {"$bind": {"step": "read"}}]}}
    ]})
}

fn reasons(v: &Value) -> Vec<Vec<String>> {
    v["provenance"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["rules"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["positions"].as_array().unwrap().iter())
                .chain(s["unguarded"].as_array().unwrap())
                .map(|p| p["reason"].as_str().unwrap().to_owned())
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn a_plan_is_validated_with_the_provenance_of_every_guarded_argument() {
    let s = TestServer::with(POLICY, ServerConfig::default()).await;
    let payer = s.token_for("payer").await;
    let before = s.audit().await.len();
    let v = s
        .post("/v1/sops/validate", &payer, json!({"sop": plan()}))
        .await
        .expect(200)
        .json();
    assert_eq!(v["admitted"], json!(true));
    assert_eq!(v["plan"], json!(true));
    assert_eq!(v["decisions"].as_array().unwrap().len(), 5);
    assert_eq!(
        reasons(&v),
        [
            vec![],
            vec![],
            vec![
                "binding_needs_review:recipient".to_owned(),
                "binding_unguarded:amount".to_owned()
            ],
            vec!["binding_checked:recipient".to_owned()],
            vec![
                "literal_vouched:to[0]".to_owned(),
                "binding_denied:to[1]".to_owned()
            ],
        ]
    );
    let pay = &v["provenance"][2];
    assert_eq!(pay["step_id"], json!("pay"));
    assert_eq!(
        pay["findings"],
        json!(["binding_needs_review:recipient", "binding_unguarded:amount"])
    );
    let rule = &pay["rules"][0];
    assert_eq!(
        (
            &rule["argument"],
            &rule["from"],
            &rule["otherwise"],
            &rule["match"]
        ),
        (
            &json!("recipient"),
            &json!(["user", "trusted"]),
            &json!("escalate"),
            &json!("caseless")
        )
    );
    let position = &rule["positions"][0];
    assert_eq!(position["fill"], json!("binding"));
    assert_eq!(position["binding"]["step"], json!("read"));
    assert_eq!(position["binding"]["step_action"], json!("read_file"));
    assert_eq!(position["binding"]["step_origins"], json!(["untrusted"]));
    assert_eq!(
        position["binding"]["unmet"],
        json!([{"by": "rule", "from": ["user", "trusted"], "otherwise": "escalate"}])
    );
    assert_eq!(v["provenance"][1]["result_origins"], json!(["trusted"]));

    // Every step's decision is recorded, with its findings.
    let log = s.audit().await;
    let new = &log[before..];
    assert_eq!(new.len(), 5);
    assert!(new.iter().all(|e| e.draft.operation == "sop.validate"));
    assert_eq!(new[2].draft.resource, "pay-bill:pay");
    assert_eq!(
        new[2].draft.details["provenance"],
        json!(["binding_needs_review:recipient", "binding_unguarded:amount"])
    );
    assert_eq!(new[0].draft.details, Value::Null);
    s.verify_chain().await;

    // Refused as a session would refuse it.
    let reader = s.token_for("reader").await;
    let v = s
        .post("/v1/sops/validate", &reader, json!({"sop": plan()}))
        .await
        .expect(200)
        .json();
    assert_eq!(v["admitted"], json!(false));
    assert_eq!(
        v["decisions"][2]["decision"]["reason"],
        json!("action_not_in_effective_capabilities")
    );
    s.stop().await;
}

#[tokio::test]
async fn an_sop_keeps_its_answer_and_a_bad_plan_changes_nothing() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    for name in ["valid-report", "unsafe-upload", "path-traversal"] {
        let v = s
            .post(
                "/v1/sops/validate",
                &researcher,
                json!({"sop": sop_file(name)}),
            )
            .await
            .expect(200)
            .json();
        // The decisions as the engine's SOP preflight gives them.
        let sop = warden_core::sop::sop_from_value(
            &sop_file(name),
            &s.state.engine().policy().sop_limits,
        )
        .unwrap();
        let expected = s
            .state
            .engine()
            .preflight(
                &warden_core::ids::AgentId::parse("researcher").unwrap(),
                &sop,
            )
            .unwrap();
        assert_eq!(v["admitted"], json!(expected.admitted), "{name}");
        assert_eq!(v["plan"], json!(false));
        let decisions = v["decisions"].as_array().unwrap();
        assert_eq!(decisions.len(), expected.steps.len());
        for (d, e) in decisions.iter().zip(&expected.steps) {
            assert_eq!(d["step_id"], json!(e.step_id));
            assert_eq!(d["decision"]["reason"], json!(e.reason().as_str()));
            let violations: Vec<&str> = e.violations.iter().map(|r| r.as_str()).collect();
            assert_eq!(d["violations"], json!(violations));
        }
        assert_eq!(
            v["provenance"].as_array().unwrap().len(),
            expected.steps.len()
        );
    }
    // Repeated step ids without bindings: an SOP, its ids a finding.
    let twice = json!({"sop_id": "twice", "version": 1, "steps": [
        {"step_id": "a", "action": "document.summarize", "arguments": {}},
        {"step_id": "a", "action": "document.summarize", "arguments": {}}]});
    let v = s
        .post("/v1/sops/validate", &researcher, json!({"sop": twice}))
        .await
        .expect(200)
        .json();
    assert_eq!(v["admitted"], json!(false));
    assert_eq!(
        v["decisions"][1]["decision"]["reason"],
        json!("duplicate_step_id")
    );

    // A malformed plan: 422 naming the field; nothing recorded.
    let before = s.audit().await;
    let bad = json!({"sop_id": "bad", "version": 1, "steps": [
        {"step_id": "a", "action": "document.summarize", "arguments": {"x": {"$bind": {"step": "a"}}}}]});
    let r = s
        .post("/v1/sops/validate", &researcher, json!({"sop": bad}))
        .await
        .expect_error(422, "invalid_plan");
    let body = &r.json()["error"];
    assert_eq!(
        body["details"]["field"],
        json!("steps[0].arguments.x.$bind.step")
    );
    assert_eq!(body["details"]["reason"], json!("binding_unknown_step"));
    let bad = json!({"sop_id": "bad", "version": 1, "steps": [
        {"step_id": "a", "action": "document.summarize", "arguments": {"x": {"$bind": {"from": ["none"]}}}}]});
    s.post("/v1/sops/validate", &researcher, json!({"sop": bad}))
        .await
        .expect_error(422, "invalid_plan");
    // The SOP format's own errors keep their code.
    s.post(
        "/v1/sops/validate",
        &researcher,
        json!({"sop": {"sop_id": "x", "version": 0, "steps": []}}),
    )
    .await
    .expect_error(422, "invalid_sop");
    assert_eq!(s.audit().await, before);

    // The document describes the answer and the new error.
    let doc = s
        .send(Req::new("GET", "/openapi.json"))
        .await
        .expect(200)
        .json();
    let schemas = &doc["components"]["schemas"];
    for field in ["admitted", "decisions", "plan", "provenance"] {
        assert!(
            schemas["ValidateResponse"]["properties"][field].is_object(),
            "{field}: {}",
            schemas["ValidateResponse"]
        );
    }
    assert!(schemas["StepProvenanceBody"]["properties"]["findings"].is_object());
    assert!(schemas["PositionBody"]["properties"]["binding"].is_object());
    let op = &doc["paths"]["/v1/sops/validate"]["post"];
    assert!(op.to_string().contains("invalid_plan"), "{op}");
    s.stop().await;
}
