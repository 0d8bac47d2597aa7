//! The provenance explanation: what it says per position, that it predicts
//! what the gate decides, and that a plan of literals is admitted exactly
//! as its SOP is preflighted.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::explain::codes;
use super::*;
use crate::bundle::{Policy, compile, seed_spec};
use crate::catalogue::ActionCatalogue;
use crate::decision::{Reason, Verdict};
use crate::hierarchy::Hierarchy;
use crate::ids::AgentId;
use crate::provenance::{
    FingerprintKey, MatchMode, Origin, Otherwise, OutputTrust, SourceId, SourceIndex,
};

const BUNDLE: &str = r#"
policy_version: explain-test
environment_capabilities: [read_file, get_balance, list_contacts, send_money, send_email, post, note]
actions:
  read_file:
    arguments: {type: object, properties: {file_path: {type: string}}}
  get_balance:
    output: {trust: trusted}
  list_contacts:
    output: {trust: untrusted, fields: {"[*].email": trusted}}
  send_money:
    tags: [state_changing]
    provenance:
      - {argument: recipient, from: [user, trusted], otherwise: escalate, match: caseless}
  send_email:
    tags: [state_changing]
    provenance:
      - {argument: "recipients[*]", from: [user, trusted], otherwise: deny, match: caseless}
      - {argument: cc, from: [user], otherwise: escalate}
  post:
    tags: [state_changing]
    provenance:
      - {argument: body, from: [user, trusted, untrusted], otherwise: deny, within: urls}
  note:
    tags: [state_changing]
agents:
  - id: agent
    capabilities: [read_file, get_balance, list_contacts, send_money, send_email, post, note]
"#;

fn policy() -> Policy {
    compile(BUNDLE).unwrap()
}

fn plan(steps: Value) -> Plan {
    parse_plan(
        &json!({"sop_id": "p", "version": 1, "steps": steps}),
        &SopLimits::default(),
    )
    .unwrap()
}

/// `(path, reason)` of every position under every rule, then of every
/// unguarded one, per step.
fn reasons(e: &PlanExplanation) -> Vec<Vec<(String, String)>> {
    e.steps
        .iter()
        .map(|s| {
            s.rules
                .iter()
                .flat_map(|r| &r.positions)
                .chain(&s.unguarded)
                .map(|p| (p.path.clone(), p.reason.to_string()))
                .collect()
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn a_binding_to_untrusted_results_needs_review_and_a_trusted_one_is_checked() {
    let policy = policy();
    let p = plan(json!([
        {"step_id": "read", "action": "read_file", "arguments": {"file_path": "bill.txt"}},
        {"step_id": "bal", "action": "get_balance", "arguments": {}},
        {"step_id": "pay", "action": "send_money", "arguments": {
            "recipient": {"$bind": {"step": "read"}}, "amount": {"$bind": {}}, "subject": "rent"}},
        {"step_id": "pay2", "action": "send_money", "arguments": {
            "recipient": {"$bind": {"step": "bal"}}, "amount": 5}},
        {"step_id": "pay3", "action": "send_money", "arguments": {
            "recipient": "GB29NWBK60161331926819", "amount": 5}},
        {"step_id": "pay4", "action": "send_money", "arguments": {
            "recipient": {"$bind": {}}, "amount": 5}}
    ]));
    let e = explain_plan(&policy.catalogue, &p);
    assert_eq!(
        reasons(&e),
        [
            vec![],
            vec![],
            pairs(&[
                ("recipient", "binding_needs_review:recipient"),
                ("amount", "binding_unguarded:amount"),
            ]),
            pairs(&[("recipient", "binding_checked:recipient")]),
            pairs(&[("recipient", "literal_vouched:recipient")]),
            pairs(&[("recipient", "binding_checked:recipient")]),
        ]
    );
    let pay = &e.steps[2];
    assert_eq!(
        pay.findings,
        [
            Reason::code("binding_needs_review:recipient"),
            Reason::code("binding_unguarded:amount")
        ]
    );
    let rule = &pay.rules[0];
    assert_eq!(
        (rule.argument.as_str(), &rule.from[..], rule.otherwise),
        (
            "recipient",
            &[Origin::User, Origin::Trusted][..],
            Otherwise::Escalate
        )
    );
    assert_eq!(rule.matching, MatchMode::Caseless);
    let b = rule.positions[0].binding.as_ref().unwrap();
    assert_eq!(b.step.as_ref().unwrap().as_str(), "read");
    assert_eq!(b.step_action.as_ref().unwrap().as_str(), "read_file");
    assert_eq!(b.step_origins.as_deref(), Some(&[Origin::Untrusted][..]));
    assert_eq!(
        b.unmet,
        [Unmet {
            by: ConstraintBy::Rule,
            from: vec![Origin::User, Origin::Trusted],
            otherwise: Otherwise::Escalate
        }]
    );
    assert!(
        rule.positions[0]
            .explain
            .contains("escalates to a human unless the value also occurs in a source of origin user or trusted"),
        "{}",
        rule.positions[0].explain
    );
    assert!(
        pay.unguarded[0]
            .explain
            .contains("nothing checks where its value comes from")
    );
    // The steps' result origins, as the catalogue declares them.
    assert_eq!(e.steps[0].result_origins, [Origin::Untrusted]);
    assert_eq!(e.steps[1].result_origins, [Origin::Trusted]);
    assert!(e.steps[3].findings.is_empty() && e.steps[4].findings.is_empty());
    assert_eq!(
        e.findings(),
        [
            Reason::code("binding_needs_review:recipient"),
            Reason::code("binding_unguarded:amount")
        ]
    );
}

#[test]
fn every_element_and_every_rule_is_explained() {
    let policy = policy();
    let p = plan(json!([
        {"step_id": "read", "action": "read_file", "arguments": {}},
        {"step_id": "contacts", "action": "list_contacts", "arguments": {}},
        {"step_id": "mail", "action": "send_email", "arguments": {
            "recipients": ["boss@example.com", {"$bind": {"step": "read"}}, {"$bind": {"step": "contacts"}}],
            "body": {"$bind": {"step": "read"}}}},
        {"step_id": "all", "action": "send_email", "arguments": {
            "recipients": {"$bind": {"step": "read", "otherwise": "escalate"}}, "cc": "me@example.com"}},
        {"step_id": "odd", "action": "send_email", "arguments": {"recipients": "boss@example.com"}}
    ]));
    let e = explain_plan(&policy.catalogue, &p);
    assert_eq!(
        reasons(&e)[2],
        pairs(&[
            ("recipients[0]", "literal_vouched:recipients[0]"),
            ("recipients[1]", "binding_denied:recipients[1]"),
            // Some contacts fields are trusted: the step can vouch.
            ("recipients[2]", "binding_checked:recipients[2]"),
            ("cc", "argument_absent:cc"),
            ("body", "binding_unguarded:body"),
        ])
    );
    assert_eq!(
        e.steps[1].result_origins,
        [Origin::Trusted, Origin::Untrusted]
    );
    assert_eq!(e.steps[2].rules.len(), 2);
    assert_eq!(e.steps[2].rules[1].positions[0].fill, Fill::Absent);
    // Bound whole, above the rule's `[*]`: reported at the binding; the
    // binding's own `otherwise` does not soften the rule's `deny`.
    assert_eq!(
        reasons(&e)[3],
        pairs(&[
            ("recipients", "binding_denied:recipients"),
            ("cc", "literal_vouched:cc"),
        ])
    );
    // A string where the rule expects an array: every call is denied.
    assert_eq!(
        reasons(&e)[4],
        pairs(&[
            ("recipients", "rule_path_mismatch:recipients"),
            ("cc", "argument_absent:cc"),
        ])
    );
    assert_eq!(
        e.steps[4].findings,
        [Reason::code("rule_path_mismatch:recipients")]
    );
}

#[test]
fn the_bindings_own_from_counts_and_untrusted_may_be_accepted() {
    let policy = policy();
    let p = plan(json!([
        {"step_id": "read", "action": "read_file", "arguments": {}},
        {"step_id": "n1", "action": "note", "arguments": {"text": {"$bind": {"step": "read", "from": ["trusted"]}}}},
        {"step_id": "n2", "action": "note", "arguments": {"text": {"$bind": {"step": "read", "from": ["user"], "otherwise": "deny"}}}},
        {"step_id": "n3", "action": "note", "arguments": {"text": {"$bind": {"step": "read", "from": ["untrusted"]}}}},
        {"step_id": "n4", "action": "note", "arguments": {"text": {"$bind": {"from": ["user"]}}}},
        {"step_id": "link", "action": "post", "arguments": {"body": {"$bind": {"step": "read"}}}},
        {"step_id": "pay", "action": "send_money", "arguments": {"recipient": {"$bind": {"step": "read", "from": ["untrusted"]}}}},
        {"step_id": "ghost", "action": "no_such_tool", "arguments": {}},
        {"step_id": "pay2", "action": "send_money", "arguments": {"recipient": {"$bind": {"step": "ghost"}}}}
    ]));
    let e = explain_plan(&policy.catalogue, &p);
    let r = reasons(&e);
    assert_eq!(r[1], pairs(&[("text", "binding_needs_review:text")]));
    assert_eq!(r[2], pairs(&[("text", "binding_denied:text")]));
    assert_eq!(r[3], pairs(&[("text", "binding_unguarded:text")]));
    assert!(
        e.steps[3].unguarded[0]
            .explain
            .contains("only the binding itself checks it")
    );
    assert_eq!(r[4], pairs(&[("text", "binding_unguarded:text")]));
    // The rule accepts untrusted content (it checks the links inside).
    assert_eq!(r[5], pairs(&[("body", "binding_checked:body")]));
    assert!(e.steps[5].rules[0].within.is_some());
    // The binding accepts untrusted content, the rule does not.
    assert_eq!(
        r[6],
        pairs(&[("recipient", "binding_needs_review:recipient")])
    );
    // An unknown action: no rules, untrusted results.
    assert!(!e.steps[7].known_action);
    assert_eq!(e.steps[7].result_origins, [Origin::Untrusted]);
    assert_eq!(
        r[8],
        pairs(&[("recipient", "binding_needs_review:recipient")])
    );
}

#[test]
fn an_sop_is_explained_as_literals() {
    let policy = policy();
    let sop = crate::sop::sop_from_value(
        &json!({"sop_id": "s", "version": 1, "steps": [
            {"step_id": "a", "action": "send_email", "arguments": {
                "recipients": ["x@example.com", {"$bind": {}}]}},
            {"step_id": "a", "action": "send_money", "arguments": {"recipient": "GB29"}}
        ]}),
        &SopLimits::default(),
    )
    .unwrap();
    let e = explain_sop(&policy.catalogue, &sop);
    // `$bind` in an SOP is data: a literal object, checked leaf by leaf.
    assert_eq!(
        reasons(&e),
        [
            pairs(&[
                ("recipients[0]", "literal_vouched:recipients[0]"),
                ("recipients[1].$bind", "literal_vouched:recipients[1].$bind"),
                ("cc", "argument_absent:cc"),
            ]),
            pairs(&[("recipient", "literal_vouched:recipient")]),
        ]
    );
}

#[test]
fn documents_are_plans_or_sops_by_their_ids_and_bindings() {
    let limits = SopLimits::default();
    let doc = |steps: Value| json!({"sop_id": "d", "version": 1, "steps": steps});
    let ok = doc(json!([{"step_id": "a", "action": "x", "arguments": {"v": {"$bind": {}}}}]));
    assert!(matches!(parse_document(&ok, &limits), Ok(PlanDocument::Plan(p)) if p.has_bindings()));
    let literal = doc(json!([{"step_id": "a", "action": "x", "arguments": {"v": 1}}]));
    let d = parse_document(&literal, &limits).unwrap();
    assert!(matches!(d, PlanDocument::Plan(_)) && !d.has_bindings());
    assert_eq!(d.sop_id().as_str(), "d");
    // Repeated or empty ids: an SOP, whose preflight reports them.
    for steps in [
        json!([{"step_id": "a", "action": "x"}, {"step_id": "a", "action": "y"}]),
        json!([{"step_id": "", "action": "x"}]),
    ] {
        let d = parse_document(&doc(steps), &limits).unwrap();
        assert!(matches!(d, PlanDocument::Sop(_)), "{d:?}");
    }
    // ... unless it binds: then the plan's error.
    let bad = doc(json!([
        {"step_id": "a", "action": "x"},
        {"step_id": "a", "action": "y", "arguments": {"v": [{"$bind": {}}]}}
    ]));
    assert_eq!(
        parse_document(&bad, &limits).unwrap_err().code(),
        "duplicate_step_id"
    );
    let bad =
        doc(json!([{"step_id": "a", "action": "x", "arguments": {"v": {"$bind": {"step": "a"}}}}]));
    assert_eq!(
        parse_document(&bad, &limits).unwrap_err().code(),
        "binding_unknown_step"
    );
    // SOP errors come first, as they are.
    let bad = json!({"sop_id": "d", "version": 0, "steps": []});
    assert!(matches!(
        parse_document(&bad, &limits),
        Err(PlanError::Sop(_))
    ));
}

// --- the explanation predicts the gate -------------------------------------

fn key() -> FingerprintKey {
    FingerprintKey::new(b"explain-test-key-0123456789").unwrap()
}

fn sid(s: &str) -> SourceId {
    SourceId::parse(s).unwrap()
}

/// The named step's result trust, as the session records it.
fn trust_of(catalogue: &ActionCatalogue, action: &str) -> OutputTrust {
    catalogue
        .by_name(action)
        .map_or_else(OutputTrust::untrusted, |a| a.provenance().output().clone())
}

/// The session gate's provenance checks of one call using `step`, over
/// `index` where the named step's call was recorded as `read-call`: the
/// binding's own checks (the value occurs in that result; an origin in the
/// binding's `from`), then the action's rules. The worst verdict.
fn gate(
    catalogue: &ActionCatalogue,
    plan: &Plan,
    step: usize,
    call: &Value,
    index: &SourceIndex,
) -> Verdict {
    let s = &plan.steps()[step];
    let PlanMatch::Step {
        literal_paths,
        bound,
        ..
    } = match_call(plan, &[], &s.action, call)
    else {
        panic!("the call does not use its step")
    };
    let mut verdict = Verdict::Allow;
    let worse = |a: Verdict, b: Verdict| {
        let rank = |v: Verdict| match v {
            Verdict::Allow | Verdict::Constrain => 0,
            Verdict::Escalate => 1,
            Verdict::Deny => 2,
        };
        if rank(b) > rank(a) { b } else { a }
    };
    for b in &bound {
        let mode = b.binding.matching.unwrap_or_default();
        let mut ok = true;
        if b.binding.step.is_some() {
            ok = index.occurs_in(&sid("read-call"), &b.value, mode);
        }
        if ok && let Some(from) = &b.binding.from {
            let p = index.provenance(b.path.clone(), &b.value, mode);
            ok = p.origins.iter().any(|o| from.contains(o));
        }
        if !ok {
            verdict = worse(
                verdict,
                match b.binding.otherwise.unwrap_or(Otherwise::Escalate) {
                    Otherwise::Escalate => Verdict::Escalate,
                    Otherwise::Deny => Verdict::Deny,
                },
            );
        }
    }
    if let Some(a) = catalogue.by_name(s.action.as_str()) {
        let pd = a.provenance().decide_except(call, index, &literal_paths);
        verdict = worse(verdict, pd.verdict);
    }
    verdict
}

fn origins_strategy() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::sample::subsequence(vec!["user", "trusted", "untrusted", "memory"], 1..=3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// For a value that occurs in the named step's result and, if
    /// `in_prompt`, in the user's request: a binding the explanation calls
    /// `binding_checked` (or unguarded) is allowed, one it says needs
    /// review escalates and one it says is denied is denied, unless the
    /// request holds the value and the user is an origin every failing
    /// constraint accepts.
    #[test]
    fn the_explanation_predicts_the_gate(
        source in prop_oneof![Just("trusted_tool"), Just("untrusted_tool"), Just("undeclared_tool"), Just("unknown_tool")],
        rule_from in proptest::option::of(origins_strategy()),
        rule_deny in any::<bool>(),
        bind_from in proptest::option::of(origins_strategy()),
        bind_deny in proptest::option::of(any::<bool>()),
        in_prompt in any::<bool>(),
        value in "acct[0-9]{6}",
    ) {
        let rule = match &rule_from {
            Some(from) => format!(
                "    provenance:\n      - {{argument: target, from: [{}], otherwise: {}}}\n",
                from.join(", "),
                if rule_deny { "deny" } else { "escalate" }
            ),
            None => String::new(),
        };
        let bundle = format!(
            "policy_version: prop\nenvironment_capabilities: [trusted_tool, untrusted_tool, undeclared_tool, sink]\nactions:\n  trusted_tool:\n    output: {{trust: trusted}}\n  untrusted_tool:\n    output: {{trust: untrusted}}\n  undeclared_tool: {{}}\n  sink:\n    tags: [state_changing]\n{rule}agents: []\n"
        );
        let policy = compile(&bundle).unwrap();
        let mut binding = serde_json::Map::new();
        binding.insert("step".into(), json!("read"));
        if let Some(from) = &bind_from {
            binding.insert("from".into(), json!(from));
        }
        if let Some(deny) = bind_deny {
            binding.insert("otherwise".into(), json!(if deny { "deny" } else { "escalate" }));
        }
        let p = plan(json!([
            {"step_id": "read", "action": source, "arguments": {}},
            {"step_id": "use", "action": "sink", "arguments": {"target": {"$bind": binding}, "note": "fixed"}}
        ]));
        let e = explain_plan(&policy.catalogue, &p);
        let position = e.steps[1]
            .rules
            .iter()
            .flat_map(|r| &r.positions)
            .chain(&e.steps[1].unguarded)
            .find(|p| p.path == "target")
            .unwrap()
            .clone();
        prop_assert_eq!(position.fill, Fill::Binding);

        let mut index = SourceIndex::new(key());
        if in_prompt {
            index.record_user(sid("prompt"), &json!(format!("please use {value}"))).unwrap();
        }
        index
            .record_result(
                sid("read-call"),
                ActionName::parse(source).unwrap(),
                &trust_of(&policy.catalogue, source),
                &json!({"text": format!("the account is {value}")}),
            )
            .unwrap();
        let verdict = gate(&policy.catalogue, &p, 1, &json!({"target": value, "note": "fixed"}), &index);
        // The constraints the named step's results cannot meet; the value
        // in the request rescues the call only if each of them accepts the
        // user.
        let step_origins: &[&str] = if source == "trusted_tool" { &["trusted"] } else { &["untrusted"] };
        let failing: Vec<&Vec<&str>> = [rule_from.as_ref(), bind_from.as_ref()]
            .into_iter()
            .flatten()
            .filter(|f| !f.iter().any(|o| step_origins.contains(o)))
            .collect();
        let unmet = &position.binding.as_ref().unwrap().unmet;
        let froms: Vec<Vec<&str>> = unmet.iter().map(|u| u.from.iter().map(|o| o.as_str()).collect()).collect();
        let failing: Vec<Vec<&str>> = failing.into_iter().cloned().collect();
        prop_assert_eq!(froms, failing);
        let verdict_of = |o: Otherwise| match o {
            Otherwise::Escalate => Verdict::Escalate,
            Otherwise::Deny => Verdict::Deny,
        };
        // Only in the named step's result, the value meets what the code
        // says; in the request too, each unmet constraint accepting the
        // user is met, and the others decide.
        let expected = if in_prompt {
            unmet
                .iter()
                .filter(|u| !u.from.contains(&Origin::User))
                .map(|u| verdict_of(u.otherwise))
                .max_by_key(|v| *v == Verdict::Deny)
                .unwrap_or(Verdict::Allow)
        } else {
            match position.reason.kind() {
                codes::BINDING_CHECKED | codes::BINDING_UNGUARDED => Verdict::Allow,
                codes::BINDING_NEEDS_REVIEW => Verdict::Escalate,
                codes::BINDING_DENIED => Verdict::Deny,
                other => return Err(TestCaseError::fail(format!("unexpected {other}"))),
            }
        };
        prop_assert_eq!(verdict, expected, "{:?}", position);
        // The literal beside it is the plan's.
        prop_assert!(e.steps[1].rules.iter().flat_map(|r| &r.positions).all(|p| p.path != "note"));
    }
}

// --- a plan of literals is admitted as its SOP is preflighted ---------------

const ADMIT_BUNDLE: &str = r#"
policy_version: explain-admit
environment_capabilities: [memory.read, memory.write, read_file, send_money]
actions:
  read_file:
    arguments:
      type: object
      required: [file_path]
      additionalProperties: false
      properties: {file_path: {type: string}}
    rules:
      - path_within: {argument: file_path, globs: ["docs/**"]}
  send_money:
    arguments:
      type: object
      required: [recipient, amount]
      properties:
        recipient: {type: string, pattern: "^[A-Z]{2}[0-9]{2,}$"}
        amount: {type: number, minimum: 0}
    tags: [state_changing]
agents:
  - id: agent
    capabilities: [memory.read, memory.write, read_file, send_money]
  - id: reader
    parent: agent
    capabilities: [read_file]
"#;

fn hierarchy(policy: &Policy) -> Hierarchy {
    let mut h = policy.empty_hierarchy();
    let specs: Vec<_> = policy.agents.iter().map(seed_spec).collect();
    h.register_all(&specs, &|a: &ActionName| policy.action_index(a))
        .unwrap();
    h
}

fn literal_step() -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        Just(json!("docs/a.txt")),
        Just(json!("../etc/passwd")),
        Just(json!("GB29")),
        Just(json!("not an iban")),
        Just(json!(5)),
        Just(json!(-1)),
        Just(json!(null)),
        Just(json!("n")),
        Just(json!("agent")),
        Just(json!("reader")),
    ];
    let key = prop_oneof![
        Just("file_path"),
        Just("recipient"),
        Just("amount"),
        Just("namespace"),
        Just("key"),
        Just("value"),
        Just("owner_agent_id"),
        Just("extra"),
    ];
    (
        prop_oneof![
            Just("read_file"),
            Just("send_money"),
            Just("memory.read"),
            Just("memory.write"),
            Just("shell.eval"),
        ],
        proptest::collection::btree_map(key, scalar, 0..5),
    )
        .prop_map(|(action, args)| json!({"action": action, "arguments": args}))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_plan_of_literals_is_admitted_as_its_sop_is_preflighted(
        steps in proptest::collection::vec(literal_step(), 1..5),
        actor in prop_oneof![Just("agent"), Just("reader"), Just("stranger")],
    ) {
        let policy = compile(ADMIT_BUNDLE).unwrap();
        let h = hierarchy(&policy);
        let ctx = crate::preflight::PreflightContext {
            hierarchy: &h,
            catalogue: &policy.catalogue,
            policy_version: &policy.version,
        };
        let steps: Vec<Value> = steps
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s["step_id"] = json!(format!("s{i}"));
                s
            })
            .collect();
        let doc = json!({"sop_id": "lit", "version": 1, "steps": steps});
        let limits = SopLimits::default();
        let sop = crate::sop::sop_from_value(&doc, &limits).unwrap();
        let document = parse_document(&doc, &limits).unwrap();
        prop_assert!(matches!(document, PlanDocument::Plan(_)));
        let actor = AgentId::parse(actor).unwrap();
        let now = crate::time::Timestamp(1_700_000_000_000);
        let expected = crate::preflight::preflight(&ctx, &actor, &sop, now);
        prop_assert_eq!(document.admit(&ctx, &actor, None, now), expected);
        // The explanation names only literals and absent arguments.
        for s in document.explain(&policy.catalogue).steps {
            prop_assert!(s.unguarded.is_empty());
            prop_assert!(s.rules.iter().flat_map(|r| &r.positions).all(|p| p.fill != Fill::Binding));
        }
    }
}
