use serde_json::{Value, json};

use super::*;
use crate::bundle::{Policy, compile, seed_spec};
use crate::decision::Reason;
use crate::hierarchy::Hierarchy;
use crate::ids::AgentId;
use crate::provenance::{MatchMode, Origin, Otherwise};

const BUNDLE: &str = r#"
policy_version: plan-test
environment_capabilities: [memory.read, memory.write, read_file, send_money, post]
actions:
  read_file:
    arguments:
      type: object
      required: [file_path]
      additionalProperties: false
      properties:
        file_path: {type: string}
    rules:
      - path_within: {argument: file_path, globs: ["docs/**"]}
  send_money:
    arguments:
      type: object
      required: [recipient, amount]
      additionalProperties: false
      properties:
        recipient: {type: string, pattern: "^[A-Z]{2}[0-9]{6,30}$"}
        recipient_name: {type: number}
        amount: {type: number, minimum: 0}
        subject: {type: string, maxLength: 40}
        cc: {type: array, items: {type: string, format: email}}
        "a/b": {type: integer}
        meta: {type: object, minProperties: 2}
    rules:
      - pattern: {argument: recipient, regex: "[A-Z]{2}[0-9]+"}
      - max_bytes: {argument: subject, max: 40, optional: true}
    tags: [state_changing]
  post:
    arguments:
      type: object
      properties:
        url: {type: string}
    rules:
      - host_in: {argument: url, hosts: ["example.com"]}
agents:
  - id: agent
    capabilities: [memory.read, memory.write, read_file, send_money, post]
  - id: reader
    parent: agent
    capabilities: [read_file]
"#;

fn policy() -> Policy {
    compile(BUNDLE).unwrap()
}

fn hierarchy(policy: &Policy) -> Hierarchy {
    let mut h = policy.empty_hierarchy();
    let specs: Vec<_> = policy.agents.iter().map(seed_spec).collect();
    h.register_all(&specs, &|a: &ActionName| policy.action_index(a))
        .unwrap();
    h
}

fn parse(v: Value) -> Result<Plan, PlanError> {
    parse_plan(&v, &SopLimits::default())
}

fn plan(steps: Value) -> Plan {
    parse(json!({"sop_id": "p", "version": 1, "steps": steps})).unwrap()
}

/// Assert that `steps` fail with `code` at `field`.
fn fails(steps: Value, code: &str, field: &str) -> PlanError {
    let err = parse(json!({"sop_id": "p", "version": 1, "steps": steps})).unwrap_err();
    assert_eq!((err.code(), err.field()), (code, field), "{err}");
    assert!(err.to_string().contains(field), "{err}");
    err
}

fn rent() -> Plan {
    plan(json!([
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": "docs/notice.txt"}},
        {"step_id": "pay", "action": "send_money", "arguments": {
            "recipient": {"$bind": {"step": "read", "from": ["trusted", "user", "trusted"], "match": "caseless"}},
            "amount": {"$bind": {}},
            "subject": "rent",
            "cc": ["a@example.com", {"$bind": {"otherwise": "deny"}}]}}
    ]))
}

fn action(s: &str) -> ActionName {
    ActionName::parse(s).unwrap()
}

fn step_id(s: &str) -> StepId {
    StepId::parse(s).unwrap()
}

// --- parsing -----------------------------------------------------------------

#[test]
fn a_plan_parses_with_its_bindings() {
    let p = rent();
    assert_eq!(p.sop_id().as_str(), "p");
    assert_eq!(p.version(), 1);
    assert_eq!(p.steps().len(), 2);
    assert_eq!(p.steps()[1].step_id().as_str(), "pay");
    assert_eq!(p.steps()[1].action().as_str(), "send_money");
    assert!(!p.steps()[0].has_bindings());
    assert!(p.has_bindings());
    assert_eq!(p.step("pay").unwrap().0, 1);
    assert!(p.step("nope").is_none());

    let bindings: Vec<(String, Binding)> = p.steps()[1]
        .bindings()
        .into_iter()
        .map(|(path, b)| (path.argument(), b.clone()))
        .collect();
    assert_eq!(
        bindings,
        [
            (
                "amount".to_owned(),
                Binding {
                    step: None,
                    from: None,
                    otherwise: None,
                    matching: None
                }
            ),
            (
                "cc[1]".to_owned(),
                Binding {
                    step: None,
                    from: None,
                    otherwise: Some(Otherwise::Deny),
                    matching: None
                }
            ),
            (
                "recipient".to_owned(),
                Binding {
                    step: Some(step_id("read")),
                    // Sorted, without repeats.
                    from: Some(vec![Origin::User, Origin::Trusted]),
                    otherwise: None,
                    matching: Some(MatchMode::Caseless)
                }
            ),
        ]
    );
    assert_eq!(
        p.literals(),
        [
            (
                "steps[0].arguments.file_path".to_owned(),
                json!("docs/notice.txt")
            ),
            (
                "steps[1].arguments.cc[0]".to_owned(),
                json!("a@example.com")
            ),
            ("steps[1].arguments.subject".to_owned(), json!("rent")),
        ]
    );
}

#[test]
fn to_json_round_trips_and_the_hash_is_of_the_content() {
    let p = rent();
    let json = p.to_json();
    assert_eq!(parse(json.clone()).unwrap(), p);
    // The binding's `from` comes back normalised.
    assert_eq!(
        json["steps"][1]["arguments"]["recipient"],
        json!({"$bind": {"step": "read", "from": ["user", "trusted"], "match": "caseless"}})
    );
    assert_eq!(p.hash(), parse(json.clone()).unwrap().hash());
    // Layout does not matter; content does.
    let text = serde_json::to_string_pretty(&json).unwrap();
    let reparsed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(parse(reparsed).unwrap().hash(), p.hash());
    let mut changed = json.clone();
    changed["steps"][1]["arguments"]["subject"] = json!("rent!");
    assert_ne!(parse(changed).unwrap().hash(), p.hash());
    let mut unbound = json;
    unbound["steps"][1]["arguments"]["amount"] = json!(5);
    assert_ne!(parse(unbound).unwrap().hash(), p.hash());
}

#[test]
fn literal_sop_is_the_plan_without_bindings() {
    assert!(rent().literal_sop().is_none());
    let steps = json!([
        {"step_id": "a", "action": "read_file", "arguments": {"file_path": "docs/x", "o": {"k": [1, {}]}}},
        {"step_id": "b", "action": "post"}
    ]);
    let doc = json!({"sop_id": "p", "version": 3, "steps": steps});
    let sop = parse(doc.clone()).unwrap().literal_sop().unwrap();
    assert_eq!(sop, sop_from_value(&doc, &SopLimits::default()).unwrap());
}

#[test]
fn sop_errors_come_back_wrapped() {
    let err = parse(json!({"version": 1, "steps": []})).unwrap_err();
    assert!(matches!(err, PlanError::Sop(_)));
    assert_eq!((err.code(), err.field()), ("missing_field", "sop_id"));
    let err = parse(json!({"sop_id": "p", "version": 1, "steps": []})).unwrap_err();
    assert_eq!((err.code(), err.field()), ("empty_sop", "steps"));
    fails(
        json!([{"step_id": "a", "action": "read file"}]),
        "invalid_identifier",
        "steps[0].action",
    );
    fails(
        json!([{"step_id": "a", "action": "x", "extra": 1}]),
        "unknown_field",
        "steps[0].extra",
    );
    let limits = SopLimits {
        max_steps: 1,
        ..SopLimits::default()
    };
    let two = json!({"sop_id": "p", "version": 1, "steps": [
        {"step_id": "a", "action": "x"}, {"step_id": "b", "action": "x"}]});
    let err = parse_plan(&two, &limits).unwrap_err();
    assert_eq!(err.code(), "too_many_steps");
}

#[test]
fn step_ids_must_be_present_and_unique() {
    fails(
        json!([{"step_id": "a", "action": "x"}, {"step_id": "", "action": "x"}]),
        "empty_step_id",
        "steps[1].step_id",
    );
    fails(
        json!([{"step_id": "a", "action": "x"}, {"step_id": "a", "action": "x"}]),
        "duplicate_step_id",
        "steps[1].step_id",
    );
}

#[test]
fn bindings_are_strict_and_errors_name_their_path() {
    let one = |args: Value| json!([{"step_id": "a", "action": "x"}, {"step_id": "b", "action": "x", "arguments": args}, {"step_id": "c", "action": "x"}]);
    fails(
        one(json!({"to": {"$bind": {}, "other": 1}})),
        "binding_not_alone",
        "steps[1].arguments.to.other",
    );
    fails(
        one(json!({"$bind": {}})),
        "binding_whole_arguments",
        "steps[1].arguments.$bind",
    );
    fails(
        one(json!({"$bind": {}, "x": 1})),
        "binding_not_alone",
        "steps[1].arguments.x",
    );
    fails(
        one(json!({"to": {"$bind": {"form": ["user"]}}})),
        "binding_unknown_field",
        "steps[1].arguments.to.$bind.form",
    );
    fails(
        one(json!({"to": {"$bind": "a"}})),
        "binding_wrong_type",
        "steps[1].arguments.to.$bind",
    );
    fails(
        one(json!({"to": {"$bind": {"step": 0}}})),
        "binding_wrong_type",
        "steps[1].arguments.to.$bind.step",
    );
    fails(
        one(json!({"to": {"$bind": {"from": "user"}}})),
        "binding_wrong_type",
        "steps[1].arguments.to.$bind.from",
    );
    fails(
        one(json!({"to": {"$bind": {"from": ["user", 1]}}})),
        "binding_wrong_type",
        "steps[1].arguments.to.$bind.from[1]",
    );
    fails(
        one(json!({"to": {"$bind": {"otherwise": true}}})),
        "binding_wrong_type",
        "steps[1].arguments.to.$bind.otherwise",
    );
    let err = fails(
        one(json!({"to": {"$bind": {"step": "nowhere"}}})),
        "binding_unknown_step",
        "steps[1].arguments.to.$bind.step",
    );
    assert!(err.to_string().contains("no step `nowhere`"), "{err}");
    for not_earlier in ["b", "c"] {
        let err = fails(
            one(json!({"to": {"$bind": {"step": not_earlier}}})),
            "binding_unknown_step",
            "steps[1].arguments.to.$bind.step",
        );
        assert!(err.to_string().contains("not earlier"), "{err}");
    }
    fails(
        one(json!({"to": {"$bind": {"step": "not an id"}}})),
        "binding_unknown_step",
        "steps[1].arguments.to.$bind.step",
    );
    fails(
        one(json!({"to": {"$bind": {"from": []}}})),
        "binding_empty_from",
        "steps[1].arguments.to.$bind.from",
    );
    fails(
        one(json!({"to": {"$bind": {"from": ["user", "none"]}}})),
        "binding_origin_none",
        "steps[1].arguments.to.$bind.from[1]",
    );
    fails(
        one(json!({"to": {"$bind": {"from": ["users"]}}})),
        "binding_unknown_origin",
        "steps[1].arguments.to.$bind.from[0]",
    );
    fails(
        one(json!({"to": {"$bind": {"otherwise": "maybe"}}})),
        "binding_invalid_value",
        "steps[1].arguments.to.$bind.otherwise",
    );
    fails(
        one(json!({"to": {"$bind": {"match": "fuzzy"}}})),
        "binding_invalid_value",
        "steps[1].arguments.to.$bind.match",
    );
    // Deep, in arrays, under keys that are not plain words.
    fails(
        one(json!({"cc": ["x", {"$bind": {"step": "c"}}]})),
        "binding_unknown_step",
        "steps[1].arguments.cc[1].$bind.step",
    );
    fails(
        one(json!({"a b": {"n": [{"$bind": {"from": []}}]}})),
        "binding_empty_from",
        "steps[1].arguments[\"a b\"].n[0].$bind.from",
    );
    // The first step can bind nothing to a step.
    let err = parse(json!({"sop_id": "p", "version": 1, "steps": [
        {"step_id": "a", "action": "x", "arguments": {"v": {"$bind": {"step": "a"}}}}]}))
    .unwrap_err();
    assert_eq!(err.code(), "binding_unknown_step");
    // A `$`-key that is not `$bind` is data.
    let p = plan(json!([{"step_id": "a", "action": "x", "arguments": {"s": {"$ref": "#"}}}]));
    assert!(!p.has_bindings());
}

#[test]
fn limits_count_the_binding_syntax() {
    let limits = SopLimits {
        max_depth: 3,
        ..SopLimits::default()
    };
    let ok = json!({"sop_id": "p", "version": 1, "steps": [
        {"step_id": "a", "action": "x", "arguments": {"v": {"$bind": {}}}}]});
    assert!(parse_plan(&ok, &limits).is_ok());
    let deep = json!({"sop_id": "p", "version": 1, "steps": [
        {"step_id": "a", "action": "x", "arguments": {"v": {"$bind": {"from": ["user"]}}}}]});
    assert_eq!(
        parse_plan(&deep, &limits).unwrap_err().code(),
        "nesting_too_deep"
    );
}

// --- matching ------------------------------------------------------------------

#[test]
fn a_call_uses_the_step_it_matches() {
    let p = rent();
    let m = match_call(
        &p,
        &[true],
        &action("send_money"),
        &json!({"recipient": "CH93", "amount": {"value": 5, "currency": "EUR"}, "subject": "rent",
                "cc": ["a@example.com", "b@example.com"]}),
    );
    let PlanMatch::Step {
        index,
        step_id,
        literal_paths,
        bound,
    } = m
    else {
        panic!("{m:?}");
    };
    assert_eq!((index, step_id.as_str()), (1, "pay"));
    assert_eq!(literal_paths, ["cc[0]", "subject"]);
    let bound: Vec<(&str, &Value)> = bound.iter().map(|b| (b.path.as_str(), &b.value)).collect();
    assert_eq!(
        bound,
        [
            ("amount", &json!({"value": 5, "currency": "EUR"})),
            ("cc[1]", &json!("b@example.com")),
            ("recipient", &json!("CH93")),
        ]
    );
}

#[test]
fn a_bound_key_may_be_absent_a_literal_one_may_not() {
    let p = rent();
    let call = json!({"recipient": "CH93", "subject": "rent", "cc": ["a@example.com", "x"]});
    let PlanMatch::Step { bound, .. } = match_call(&p, &[], &action("send_money"), &call) else {
        panic!()
    };
    assert_eq!(bound.len(), 2, "no value for the absent `amount`");
    let call = json!({"recipient": "CH93", "amount": 1, "cc": ["a@example.com", "x"]});
    assert_eq!(
        match_call(&p, &[], &action("send_money"), &call),
        PlanMatch::Unplanned {
            closest: Some((step_id("pay"), "subject".into()))
        }
    );
}

#[test]
fn mismatches_name_the_first_differing_path() {
    let p = rent();
    let send = action("send_money");
    let base =
        json!({"recipient": "CH93", "amount": 1, "subject": "rent", "cc": ["a@example.com", "x"]});
    let unplanned = |call: Value| match match_call(&p, &[], &send, &call) {
        PlanMatch::Unplanned { closest } => closest.map(|(s, path)| (s.to_string(), path)),
        m => panic!("{m:?}"),
    };
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        v
    };
    let pay = |path: &str| Some(("pay".to_owned(), path.to_owned()));
    assert_eq!(unplanned(with(&|v| v["bcc"] = json!("x"))), pay("bcc"));
    assert_eq!(
        unplanned(with(&|v| v["subject"] = json!("Rent"))),
        pay("subject")
    );
    assert_eq!(
        unplanned(with(&|v| v["cc"][0] = json!("b@example.com"))),
        pay("cc[0]")
    );
    assert_eq!(
        unplanned(with(&|v| v["cc"] = json!(["a@example.com"]))),
        pay("cc")
    );
    assert_eq!(
        unplanned(with(&|v| v["cc"] = json!("a@example.com"))),
        pay("cc")
    );
    assert_eq!(unplanned(json!(["not", "an", "object"])), pay("$"));
    // Another action: no closest step.
    assert_eq!(
        match_call(&p, &[], &action("post"), &json!({})),
        PlanMatch::Unplanned { closest: None }
    );
    // Used steps are not candidates.
    assert_eq!(
        match_call(&p, &[false, true], &send, &base),
        PlanMatch::Unplanned { closest: None }
    );
}

#[test]
fn numbers_compare_by_value_and_nothing_else_is_loose() {
    let p = plan(json!([
        {"step_id": "a", "action": "x", "arguments": {"n": 1, "f": 2.5, "big": 9007199254740993u64, "s": "1", "b": true, "z": null}}
    ]));
    let x = action("x");
    let matches = |call: Value| matches!(match_call(&p, &[], &x, &call), PlanMatch::Step { .. });
    let base =
        json!({"n": 1, "f": 2.5, "big": 9007199254740993u64, "s": "1", "b": true, "z": null});
    assert!(matches(base.clone()));
    let with = |key: &str, v: Value| {
        let mut c = base.clone();
        c[key] = v;
        c
    };
    assert!(matches(with("n", json!(1.0))));
    assert!(matches(with("f", json!(2.50))));
    assert!(!matches(with("n", json!(1.5))));
    assert!(!matches(with("n", json!(-1))));
    assert!(!matches(with("n", json!("1"))));
    assert!(!matches(with("s", json!(1))));
    assert!(!matches(with("b", json!(1))));
    assert!(!matches(with("z", json!(false))));
    assert!(!matches(with("z", json!({}))));
    // 2^53 + 1 is not the float 2^53, though `as f64` would round it there.
    assert!(!matches(with("big", json!(9007199254740992.0))));
    assert!(!matches(with("big", json!(9007199254740992u64))));
    assert!(matching::number_eq(
        &serde_json::Number::from(-0i64),
        &serde_json::Number::from_f64(-0.0).unwrap()
    ));
    assert!(!matching::number_eq(
        &serde_json::Number::from(u64::MAX),
        &serde_json::Number::from_f64(18_446_744_073_709_551_616.0).unwrap()
    ));
}

#[test]
fn the_first_unused_matching_step_is_used() {
    let p = plan(json!([
        {"step_id": "one", "action": "x", "arguments": {"v": {"$bind": {}}}},
        {"step_id": "two", "action": "x", "arguments": {"v": "fixed"}},
        {"step_id": "three", "action": "x", "arguments": {"v": {"$bind": {}}}}
    ]));
    let x = action("x");
    let index = |used: &[bool], call: Value| match match_call(&p, used, &x, &call) {
        PlanMatch::Step { index, .. } => Some(index),
        PlanMatch::Unplanned { .. } => None,
    };
    assert_eq!(index(&[], json!({"v": "fixed"})), Some(0));
    assert_eq!(index(&[true], json!({"v": "fixed"})), Some(1));
    assert_eq!(index(&[true, true], json!({"v": "fixed"})), Some(2));
    assert_eq!(index(&[true, false, false], json!({"v": "other"})), Some(2));
    assert_eq!(index(&[true, true, true], json!({"v": "fixed"})), None);
    // An empty container literal is a leaf that must match exactly.
    let p = plan(json!([{"step_id": "e", "action": "x", "arguments": {"o": {}, "a": []}}]));
    let m = match_call(&p, &[], &x, &json!({"o": {}, "a": []}));
    let PlanMatch::Step { literal_paths, .. } = m else {
        panic!()
    };
    assert_eq!(literal_paths, ["a", "o"]);
    assert!(matches!(
        match_call(&p, &[], &x, &json!({"o": {"k": 1}, "a": []})),
        PlanMatch::Unplanned { closest: Some((_, path)) } if path == "o.k"
    ));
}

// --- admission -------------------------------------------------------------------

fn admit(policy: &Policy, actor: &str, p: &Plan) -> Preflight {
    let h = hierarchy(policy);
    let ctx = PreflightContext {
        hierarchy: &h,
        catalogue: &policy.catalogue,
        policy_version: &policy.version,
    };
    admit_plan(
        &ctx,
        &AgentId::parse(actor).unwrap(),
        p,
        None,
        Timestamp(1_700_000_000_000),
    )
}

fn violations(pf: &Preflight) -> Vec<Vec<String>> {
    pf.steps
        .iter()
        .map(|s| s.violations.iter().map(|r| r.as_str().to_owned()).collect())
        .collect()
}

#[test]
fn bound_positions_do_not_fail_preflight_literals_do() {
    let policy = policy();
    let p = rent();
    let pf = admit(&policy, "agent", &p);
    assert!(pf.admitted, "{:?}", violations(&pf));

    // The same SOP checked without skipping fails exactly at the bound
    // positions: the skip is what admits it.
    let sop = plan_preflight_sop(&p);
    assert_eq!(
        sop.steps[1].arguments["recipient"],
        json!("$bind:recipient")
    );
    let h = hierarchy(&policy);
    let ctx = PreflightContext {
        hierarchy: &h,
        catalogue: &policy.catalogue,
        policy_version: &policy.version,
    };
    let actor = AgentId::parse("agent").unwrap();
    let plain = preflight::admit(&ctx, &actor, &sop, None, Timestamp(0));
    assert!(!plain.admitted);
    assert_eq!(
        violations(&plain)[1],
        [
            "argument_schema_violation:/amount",
            "argument_schema_violation:/cc/1",
            "argument_schema_violation:/recipient",
            "pattern_mismatch:recipient"
        ]
    );

    // A literal that breaks a rule still refuses the plan.
    let bad = plan(json!([
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": "../etc/passwd"}},
        {"step_id": "pay", "action": "send_money", "arguments": {
            "recipient": "not-an-iban", "amount": {"$bind": {}}}}
    ]));
    let pf = admit(&policy, "agent", &bad);
    assert!(!pf.admitted);
    assert_eq!(violations(&pf)[0], ["path_traversal:file_path"]);
    assert_eq!(
        violations(&pf)[1],
        [
            "argument_schema_violation:/recipient",
            "pattern_mismatch:recipient"
        ]
    );
}

#[test]
fn the_skip_is_exactly_the_bound_positions() {
    let policy = policy();
    // `recipient` bound does not cover `recipient_name`; a literal of the
    // wrong type there is refused.
    let p = plan(
        json!([{"step_id": "pay", "action": "send_money", "arguments": {
        "recipient": {"$bind": {}}, "recipient_name": "Bob", "amount": 1}}]),
    );
    assert_eq!(
        violations(&admit(&policy, "agent", &p))[0],
        ["argument_schema_violation:/recipient_name"]
    );
    // A key holding `/` is escaped in the pointer the schema names.
    let p = plan(
        json!([{"step_id": "pay", "action": "send_money", "arguments": {
        "recipient": "CH9300762", "a/b": {"$bind": {}}, "amount": 1}}]),
    );
    assert!(admit(&policy, "agent", &p).admitted);
    let p = plan(
        json!([{"step_id": "pay", "action": "send_money", "arguments": {
        "recipient": "CH9300762", "a/b": "x", "amount": 1}}]),
    );
    assert_eq!(
        violations(&admit(&policy, "agent", &p))[0],
        ["argument_schema_violation:/a~1b"]
    );
    // A violation above the bound position still counts: `meta` can never
    // hold two properties, since a call adds no keys.
    let p = plan(
        json!([{"step_id": "pay", "action": "send_money", "arguments": {
        "recipient": "CH9300762", "amount": 1, "meta": {"k": {"$bind": {}}}}}]),
    );
    assert_eq!(
        violations(&admit(&policy, "agent", &p))[0],
        ["argument_schema_violation:/meta"]
    );
    // A rule on a bound argument is skipped, on a literal one it applies.
    let p =
        plan(json!([{"step_id": "post", "action": "post", "arguments": {"url": {"$bind": {}}}}]));
    assert!(admit(&policy, "agent", &p).admitted);
    let p = plan(
        json!([{"step_id": "post", "action": "post", "arguments": {"url": "https://evil.example"}}]),
    );
    assert_eq!(
        violations(&admit(&policy, "agent", &p))[0],
        ["host_not_allowed:url"]
    );
}

#[test]
fn capabilities_and_the_catalogue_are_checked_whatever_is_bound() {
    let policy = policy();
    let p = plan(json!([
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": {"$bind": {}}}},
        {"step_id": "pay", "action": "send_money", "arguments": {"recipient": {"$bind": {}}, "amount": {"$bind": {}}}},
        {"step_id": "shell", "action": "shell.eval", "arguments": {"cmd": {"$bind": {}}}}
    ]));
    let pf = admit(&policy, "reader", &p);
    assert!(!pf.admitted);
    assert_eq!(
        violations(&pf),
        [
            vec![],
            vec!["action_not_in_effective_capabilities".to_owned()],
            vec!["unknown_action".to_owned()]
        ]
    );
    let pf = admit(&policy, "stranger", &p);
    assert!(
        pf.steps
            .iter()
            .all(|s| s.violations[0] == Reason::code("unknown_agent"))
    );
}

#[test]
fn bound_memory_arguments_are_checked_at_call_time() {
    let policy = policy();
    let p = plan(json!([
        {"step_id": "w", "action": "memory.write", "arguments": {
            "namespace": {"$bind": {}}, "key": "k", "value": {"$bind": {}}, "owner_agent_id": {"$bind": {}}}},
        {"step_id": "r", "action": "memory.read", "arguments": {"namespace": "n", "key": {"$bind": {}}}}
    ]));
    let pf = admit(&policy, "agent", &p);
    assert!(pf.admitted, "{:?}", violations(&pf));
    // Literal memory arguments are still checked.
    let bad = plan(
        json!([{"step_id": "w", "action": "memory.write", "arguments": {
        "namespace": "bad ns", "key": {"$bind": {}}, "value": 1, "owner_agent_id": "reader"}}]),
    );
    let pf = admit(&policy, "agent", &bad);
    assert!(
        violations(&pf)[0].contains(&"memory_argument_invalid:namespace".to_owned())
            && violations(&pf)[0].contains(&"cross_owner_memory_write".to_owned()),
        "{:?}",
        violations(&pf)
    );

    // At call time, the call's values are checked in full.
    let h = hierarchy(&policy);
    let ctx = PreflightContext {
        hierarchy: &h,
        catalogue: &policy.catalogue,
        policy_version: &policy.version,
    };
    let agent = AgentId::parse("agent").unwrap();
    let write = action("memory.write");
    let call = json!({"namespace": "n", "key": "k", "value": 1, "owner_agent_id": "agent"});
    assert!(preflight::check_call(&ctx, &agent, &write, &call).is_empty());
    let call = json!({"namespace": "n", "key": "k", "value": 1, "owner_agent_id": "reader"});
    assert_eq!(
        preflight::check_call(&ctx, &agent, &write, &call),
        [Reason::code("cross_owner_memory_write")]
    );
    let call = json!({"namespace": "bad ns", "key": "k", "value": 1});
    let found = preflight::check_call(&ctx, &agent, &write, &call);
    assert!(
        found.contains(&Reason::with_param("memory_argument_invalid", "namespace")),
        "{found:?}"
    );
    let reader = AgentId::parse("reader").unwrap();
    assert_eq!(
        preflight::check_call(
            &ctx,
            &reader,
            &action("post"),
            &json!({"url": "https://example.com"})
        ),
        [Reason::code("action_not_in_effective_capabilities")]
    );
    assert_eq!(
        preflight::check_call(&ctx, &agent, &action("nope"), &json!({})),
        [Reason::code("unknown_action")]
    );
}
