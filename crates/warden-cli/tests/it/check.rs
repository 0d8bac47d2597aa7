//! `warden check` on SOPs (today's decisions, output and exit codes) and on
//! plans (admitted as a session admits them, with the provenance each
//! guarded argument will meet).

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use warden_core::bundle::{compile, seed_spec};
use warden_core::ids::{ActionName, AgentId};
use warden_core::preflight::{PreflightContext, preflight};
use warden_core::time::Timestamp;

use super::warden;

const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/report-hierarchy"
);

fn check(policy: &Path, agent: &str, file: &Path, json: bool) -> Output {
    let mut c = warden();
    c.args(["check", "--policy"])
        .arg(policy)
        .args(["--agent", agent])
        .arg(file);
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `v` without the decisions' `time` (the clock's) and the steps'
/// `provenance` (the addition).
fn today(mut v: Value) -> Value {
    for step in v["steps"].as_array_mut().unwrap() {
        let m = step.as_object_mut().unwrap();
        m.remove("provenance");
        m["decision"].as_object_mut().unwrap().remove("time");
    }
    v
}

/// What today's preflight decides for `file` (an SOP), as JSON, `time`
/// removed.
fn preflight_json(policy_text: &str, agent: &str, file: &Path) -> Value {
    let policy = compile(policy_text).unwrap();
    let mut h = policy.empty_hierarchy();
    let specs: Vec<_> = policy.agents.iter().map(seed_spec).collect();
    h.register_all(&specs, &|a: &ActionName| policy.action_index(a))
        .unwrap();
    let ctx = PreflightContext {
        hierarchy: &h,
        catalogue: &policy.catalogue,
        policy_version: &policy.version,
    };
    let sop =
        warden_core::sop::parse_sop(&std::fs::read_to_string(file).unwrap(), &policy.sop_limits)
            .unwrap();
    let p = preflight(&ctx, &AgentId::parse(agent).unwrap(), &sop, Timestamp(0));
    let mut v = serde_json::to_value(&p).unwrap();
    for step in v["steps"].as_array_mut().unwrap() {
        step["decision"].as_object_mut().unwrap().remove("time");
    }
    v
}

#[test]
fn sops_get_todays_decisions_output_and_exit_codes() {
    let root = Path::new(EXAMPLE);
    let policy = root.join("policy.yaml");
    let policy_text = std::fs::read_to_string(&policy).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // An SOP whose step ids are not a plan's: preflight reports them.
    let repeated = dir.path().join("repeated.json");
    std::fs::write(
        &repeated,
        r#"{"sop_id": "twice", "version": 1, "steps": [
            {"step_id": "save", "action": "artifact.save", "arguments": {"path": "a.md", "content": "x"}},
            {"step_id": "save", "action": "artifact.save", "arguments": {"path": "b.md", "content": "y"}}]}"#,
    )
    .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(root.join("sops"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.push(repeated.clone());
    for file in &files {
        for agent in ["report_manager", "researcher", "formatter"] {
            let out = check(&policy, agent, file, true);
            let expected = preflight_json(&policy_text, agent, file);
            let code = if expected["admitted"] == json!(true) {
                0
            } else {
                1
            };
            assert_eq!(out.status.code(), Some(code), "{file:?} {agent}");
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            // Every step carries its explanation; none of these actions
            // has a provenance rule, and an SOP binds nothing.
            for step in v["steps"].as_array().unwrap() {
                assert_eq!(step["provenance"]["rules"], json!([]));
                assert_eq!(step["provenance"]["unguarded"], json!([]));
            }
            assert_eq!(today(v), expected, "{file:?} {agent}");
        }
    }
    let repeated_out = check(&policy, "researcher", &repeated, false);
    assert_eq!(repeated_out.status.code(), Some(1));
    assert!(stdout(&repeated_out).contains("duplicate_step_id"));

    // The human form, line for line as before.
    let out = check(
        &policy,
        "researcher",
        &root.join("sops/unsafe-upload.json"),
        false,
    );
    assert_eq!(
        stdout(&out),
        "sop `unsafe-report` for agent `researcher`: rejected\n  \
         ok   summarize                document.summarize       step_allowed\n  \
         ok   save                     artifact.save            step_allowed\n  \
         DENY upload                   external.upload          action_not_in_effective_capabilities \
         (action_not_in_effective_capabilities, host_not_allowed:destination)\n"
    );
    let out = check(
        &policy,
        "researcher",
        &root.join("sops/valid-report.json"),
        false,
    );
    assert_eq!(
        stdout(&out),
        "sop `prepare-report` for agent `researcher`: admitted\n  \
         ok   summarize                document.summarize       step_allowed\n  \
         ok   save                     artifact.save            step_allowed\n"
    );
    // The JSON keeps its keys' order, the addition last.
    let text = stdout(&check(
        &policy,
        "researcher",
        &root.join("sops/valid-report.json"),
        true,
    ));
    let at = |k: &str| text.find(k).unwrap();
    assert!(at("\"step_id\"") < at("\"action\"") && at("\"violations\"") < at("\"provenance\""));
}

const BANK: &str = r#"
policy_version: bank-1
environment_capabilities: [read_file, get_balance, send_money]
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
agents:
  - id: agent
    capabilities: [read_file, get_balance, send_money]
  - id: reader
    parent: agent
    capabilities: [read_file]
"#;

#[test]
fn plans_are_admitted_and_their_provenance_explained() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("bank.yaml");
    std::fs::write(&policy, BANK).unwrap();
    let write = |name: &str, v: Value| {
        let p = dir.path().join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };
    let plan = write(
        "pay-bill.json",
        json!({"sop_id": "pay-bill", "version": 1, "steps": [
            {"step_id": "read", "action": "read_file", "arguments": {"file_path": "bill.txt"}},
            {"step_id": "balance", "action": "get_balance", "arguments": {}},
            {"step_id": "pay", "action": "send_money", "arguments": {
                "recipient": {"$bind": {"step": "read"}}, "amount": {"$bind": {}}, "subject": "bill"}},
            {"step_id": "refund", "action": "send_money", "arguments": {
                "recipient": {"$bind": {"step": "balance"}}, "amount": 5}},
            {"step_id": "rent", "action": "send_money", "arguments": {
                "recipient": "GB29NWBK60161331926819", "amount": 900}}
        ]}),
    );
    let out = check(&policy, "agent", &plan, false);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("plan `pay-bill` for agent `agent`: admitted\n"),
        "{text}"
    );
    for expected in [
        "binding_needs_review:recipient",
        "the call escalates to a human unless the value also occurs in a source of origin user or trusted",
        "binding_unguarded:amount",
        "binding_checked:recipient",
        "literal_vouched:recipient",
        "rule: argument `recipient` must occur whole in the user's trusted inputs or a trusted result",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }

    let out = check(&policy, "agent", &plan, true);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["admitted"], json!(true));
    let findings: Vec<Value> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["provenance"]["findings"].clone())
        .collect();
    assert_eq!(
        findings,
        [
            json!([]),
            json!([]),
            json!(["binding_needs_review:recipient", "binding_unguarded:amount"]),
            json!([]),
            json!([])
        ]
    );
    let pay = &v["steps"][2]["provenance"];
    assert_eq!(pay["rules"][0]["from"], json!(["user", "trusted"]));
    assert_eq!(
        pay["rules"][0]["positions"][0]["binding"]["step_origins"],
        json!(["untrusted"])
    );
    assert_eq!(
        pay["rules"][0]["positions"][0]["binding"]["unmet"],
        json!([{"by": "rule", "from": ["user", "trusted"], "otherwise": "escalate"}])
    );
    assert_eq!(
        v["steps"][3]["provenance"]["rules"][0]["positions"][0]["reason"],
        json!("binding_checked:recipient")
    );

    // Refused as a session would refuse it: exit 1, the step named.
    let out = check(&policy, "reader", &plan, true);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["steps"][2]["decision"]["reason"],
        json!("action_not_in_effective_capabilities")
    );

    // A malformed plan is bad input, located.
    let bad = write(
        "bad.json",
        json!({"sop_id": "bad", "version": 1, "steps": [
            {"step_id": "pay", "action": "send_money", "arguments": {
                "recipient": {"$bind": {"step": "later"}}, "amount": 1}}
        ]}),
    );
    let out = check(&policy, "agent", &bad, false);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("steps[0].arguments.recipient.$bind.step") && err.contains("no step `later`"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    // A repeated step id in a plan that binds is the plan's error.
    let bad = write(
        "twice.json",
        json!({"sop_id": "twice", "version": 1, "steps": [
            {"step_id": "a", "action": "read_file", "arguments": {"file_path": "x"}},
            {"step_id": "a", "action": "send_money", "arguments": {"recipient": {"$bind": {}}, "amount": 1}}
        ]}),
    );
    let out = check(&policy, "agent", &bad, false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("steps[1].step_id"));
}
