//! Admission and the step gate against the engine's behaviour before they
//! moved into core: a reference model that computes preflight, then patches
//! it with the run's starting envelope (the engine's `restrict_admission`),
//! and decides a step's begin and completion from two separate `decide`
//! calls (the engine's `gate_step` and `fold_step`). The new functions must
//! give exactly the same decisions, on the example bundle and on generated
//! inputs.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::bundle::{Policy, compile, seed_spec};
use crate::decision::Obligation;
use crate::envelope::{
    ContextDecision, ContextGate, EnvelopeId, Sensitivity, WorkflowId, reasons as cr,
};
use crate::ids::{ActionName, Label};
use crate::sop::{SopLimits, parse_sop, sop_from_value};

const LAB: &str = include_str!("../../../../examples/report-hierarchy/policy.yaml");
const SOPS: [&str; 6] = [
    include_str!("../../../../examples/report-hierarchy/sops/cross-owner-rewrite.json"),
    include_str!("../../../../examples/report-hierarchy/sops/injection-claims-approval.json"),
    include_str!("../../../../examples/report-hierarchy/sops/path-traversal.json"),
    include_str!("../../../../examples/report-hierarchy/sops/unknown-action.json"),
    include_str!("../../../../examples/report-hierarchy/sops/unsafe-upload.json"),
    include_str!("../../../../examples/report-hierarchy/sops/valid-report.json"),
];
const AGENTS: [&str; 4] = ["report_manager", "researcher", "formatter", "stranger"];
/// The labels the example bundle declares.
const LABELS: [&str; 5] = [
    "internal_document",
    "customer_name",
    "renewal_status",
    "usage_analytics",
    "financial_indicators",
];
const NOW: Timestamp = Timestamp(1_700_000_000_000);

/// The example bundle, and a variant whose context also constrains and
/// escalates (a lower inheritance threshold and a backstop), so every
/// context verdict occurs. Compiled once for every test.
fn policies() -> &'static [Policy; 2] {
    static POLICIES: LazyLock<[Policy; 2]> = LazyLock::new(|| {
        let strict = format!(
            "{LAB}\n  inherit_threshold: confidential\n  backstop: {{min_labels: 3, at_or_above: internal}}\n"
        );
        [compile(LAB).unwrap(), compile(&strict).unwrap()]
    });
    &POLICIES
}

/// The preflight context of `policy` over `h`.
fn context<'a>(policy: &'a Policy, h: &'a Hierarchy) -> PreflightContext<'a> {
    PreflightContext {
        hierarchy: h,
        catalogue: &policy.catalogue,
        policy_version: &policy.version,
    }
}

fn hierarchy(policy: &Policy) -> Hierarchy {
    let mut h = policy.empty_hierarchy();
    let specs: Vec<_> = policy.agents.iter().map(seed_spec).collect();
    h.register_all(&specs, &|a: &ActionName| policy.action_index(a))
        .unwrap();
    h
}

fn l(s: &str) -> Label {
    Label::parse(s).unwrap()
}

fn root(policy: &ContextPolicy) -> Envelope {
    Envelope::root(
        policy,
        EnvelopeId::parse("env-root").unwrap(),
        WorkflowId::parse("run-1").unwrap(),
        AgentId::parse("researcher").unwrap(),
    )
}

/// A root that folded `folds` in turn, then, if `delegated`, the envelope a
/// child inherits from it.
fn envelope(policy: &ContextPolicy, folds: &[Vec<Label>], delegated: bool) -> Envelope {
    let mut e = root(policy);
    for labels in folds {
        e = e.fold(policy, labels, &[]).unwrap().0;
    }
    if delegated {
        e = e
            .delegate(
                policy,
                AgentId::parse("researcher").unwrap(),
                EnvelopeId::parse("env-child").unwrap(),
                &[],
                false,
            )
            .unwrap()
            .0;
    }
    e
}

/// Every label of the customer risk profile: restricted, no export.
fn risk_profile(policy: &ContextPolicy) -> Envelope {
    let folds = vec![LABELS.iter().skip(1).map(|s| l(s)).collect()];
    envelope(policy, &folds, false)
}

fn action_ref<'a>(policy: &'a Policy, name: &'a str) -> ActionRef<'a> {
    ActionRef {
        name,
        tags: policy.catalogue.by_name(name).map_or(&[], |a| a.tags()),
    }
}

// --- the reference: the engine as it decided before -------------------------

/// `Engine::admit_run`: preflight, then, for an admitted SOP with a
/// context, `restrict_admission` patching the result in place.
fn engine_admission(
    ctx: &PreflightContext<'_>,
    policy: &Policy,
    actor: &AgentId,
    sop: &Sop,
    run: Option<RunContext<'_>>,
) -> Preflight {
    let mut result = preflight(ctx, actor, sop, NOW);
    if let Some(run) = run
        && result.admitted
    {
        for check in result.steps.iter_mut() {
            if !check.permits() {
                continue;
            }
            let cd = decide(
                run.envelope,
                run.policy,
                &ContextRequest::Action(action_ref(policy, &check.action)),
            );
            if cd.verdict == Verdict::Deny && cd.reason.kind() == cr::RESTRICTED_BY {
                // The step had no violation: this one is its reason.
                check.violations.push(cd.reason);
                result.admitted = false;
            }
        }
    }
    result
}

/// What `gate_step` recorded at begin: verdict, reason, obligations (for an
/// escalation, with or without a consumed approval).
fn engine_begin(cd: &ContextDecision, approved: bool) -> (Verdict, Reason, Vec<Obligation>) {
    match cd.verdict {
        Verdict::Allow => (
            Verdict::Allow,
            reasons::STEP_ALLOWED,
            cd.obligations.to_vec(),
        ),
        Verdict::Constrain => (
            Verdict::Constrain,
            cd.reason.clone(),
            cd.obligations.to_vec(),
        ),
        Verdict::Deny => (Verdict::Deny, cd.reason.clone(), Vec::new()),
        Verdict::Escalate if approved => {
            let obligations = cd.obligations.to_vec();
            let verdict = if obligations.is_empty() {
                Verdict::Allow
            } else {
                Verdict::Constrain
            };
            (verdict, Reason::code("escalation_approved"), obligations)
        }
        Verdict::Escalate => (
            Verdict::Escalate,
            cd.reason.clone(),
            cd.obligations.to_vec(),
        ),
    }
}

/// What `fold_step` derived at completion: the outcome's labels and whether
/// the gate was bypassed.
fn engine_fold(cd: &ContextDecision, reported: &[Label], declared: &[Label]) -> (Vec<Label>, bool) {
    let mut labels: BTreeSet<Label> = reported.iter().cloned().collect();
    labels.extend(declared.iter().cloned());
    if let Some(obliged) = cd.obligations.result_labels() {
        labels.extend(obliged.iter().cloned());
    }
    let bypassed = cd.verdict == Verdict::Deny && cd.reason.kind() == cr::RESTRICTED_BY;
    (labels.into_iter().collect(), bypassed)
}

fn gate_matches_engine(
    gate: &ContextGate,
    cd: &ContextDecision,
    reported: &[Label],
    declared: &[Label],
) {
    let (verdict, reason) = gate.begin();
    let (want_verdict, want_reason, want_obligations) = engine_begin(cd, false);
    assert_eq!((verdict, &reason), (want_verdict, &want_reason));
    assert_eq!(gate.obligations, want_obligations);
    if cd.verdict == Verdict::Escalate {
        let (verdict, reason, obligations) = engine_begin(cd, true);
        assert_eq!(gate.approved(), (verdict, reason));
        assert_eq!(gate.obligations, obligations);
    }
    let (labels, bypassed) = engine_fold(cd, reported, declared);
    assert_eq!(gate.outcome_labels(reported, declared), labels);
    assert_eq!(gate.bypassed(), bypassed);
    assert_eq!(gate.projected_sensitivity, cd.projected_sensitivity);
}

// --- the example bundle ------------------------------------------------------

#[test]
fn admission_on_the_example_bundle_matches_the_engine() {
    for policy in policies() {
        let h = hierarchy(policy);
        let ctx = context(policy, &h);
        let cp = policy.context.as_ref().unwrap();
        let envelopes = [
            root(cp),
            risk_profile(cp),
            envelope(cp, &[vec![l("customer_name")]], true),
            envelope(cp, &[LABELS.iter().skip(1).map(|s| l(s)).collect()], true),
        ];
        let mut sops: Vec<Sop> = SOPS
            .iter()
            .map(|t| parse_sop(t, &SopLimits::default()).unwrap())
            .collect();
        sops.push(
            sop_from_value(
                &json!({"sop_id": "export", "version": 1, "steps": [
                    {"step_id": "look", "action": "crm.lookup", "arguments": {"customer_id": "c1"}},
                    {"step_id": "export", "action": "report.export"},
                    {"step_id": "upload", "action": "external.upload",
                     "arguments": {"destination": "https://uploads.example.com/x"}}
                ]}),
                &SopLimits::default(),
            )
            .unwrap(),
        );
        for agent in AGENTS {
            let actor = AgentId::parse(agent).unwrap();
            for sop in &sops {
                assert_eq!(
                    admit(&ctx, &actor, sop, None, NOW),
                    engine_admission(&ctx, policy, &actor, sop, None)
                );
                for e in &envelopes {
                    let run = RunContext {
                        envelope: e,
                        policy: cp,
                    };
                    assert_eq!(
                        admit(&ctx, &actor, sop, Some(run), NOW),
                        engine_admission(&ctx, policy, &actor, sop, Some(run)),
                        "{agent} {} under {:?}",
                        sop.sop_id,
                        e.labels()
                    );
                }
            }
        }
    }
}

#[test]
fn a_restricted_starting_envelope_rejects_the_export_step_only() {
    let [policy, _] = policies();
    let h = hierarchy(policy);
    let ctx = context(policy, &h);
    let cp = policy.context.as_ref().unwrap();
    let sop = sop_from_value(
        &json!({"sop_id": "export", "version": 1, "steps": [
            {"step_id": "summarize", "action": "document.summarize", "arguments": {"document_id": "d"}},
            {"step_id": "export", "action": "report.export"}
        ]}),
        &SopLimits::default(),
    )
    .unwrap();
    let actor = AgentId::parse("researcher").unwrap();
    let open = root(cp);
    let fresh = admit(
        &ctx,
        &actor,
        &sop,
        Some(RunContext {
            envelope: &open,
            policy: cp,
        }),
        NOW,
    );
    assert!(fresh.admitted);
    assert_eq!(fresh, preflight(&ctx, &actor, &sop, NOW));

    let restricted = risk_profile(cp);
    let run = RunContext {
        envelope: &restricted,
        policy: cp,
    };
    let result = admit(&ctx, &actor, &sop, Some(run), NOW);
    assert!(!result.admitted);
    let verdicts: Vec<_> = result
        .steps
        .iter()
        .map(|s| (s.verdict(), s.reason().as_str()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (Verdict::Allow, "step_allowed"),
            (Verdict::Deny, "restricted_by:no_external_export")
        ]
    );
    assert_eq!(
        result.steps[1].violations.as_slice(),
        [Reason::code("restricted_by:no_external_export")]
    );

    // Rejected on static data: reported without the envelope.
    let stranger = AgentId::parse("stranger").unwrap();
    let result = admit(&ctx, &stranger, &sop, Some(run), NOW);
    assert!(
        result
            .steps
            .iter()
            .all(|s| s.violations.as_slice() == [reasons::UNKNOWN_AGENT])
    );
}

#[test]
fn the_step_gate_on_the_example_bundle_matches_the_engine() {
    for policy in policies() {
        let cp = policy.context.as_ref().unwrap();
        let mut envelopes = vec![root(cp), risk_profile(cp)];
        for n in 1..=LABELS.len() {
            let folds = vec![LABELS.iter().take(n).map(|s| l(s)).collect()];
            envelopes.push(envelope(cp, &folds, n % 2 == 0));
        }
        let mut verdicts = BTreeSet::new();
        for e in &envelopes {
            for action in policy.catalogue.iter() {
                let name = action.name().as_str();
                let cd = decide(e, cp, &ContextRequest::Action(action_ref(policy, name)));
                let gate = ContextGate::decide(e, cp, action_ref(policy, name));
                verdicts.insert(cd.verdict);
                assert_eq!(gate, ContextGate::from_decision(cd.clone()));
                gate_matches_engine(&gate, &cd, &[l("customer_name")], action.output_labels());
            }
        }
        if policy.version == "lab-1" && cp.inherit_threshold() == Sensitivity::Confidential {
            assert_eq!(verdicts.len(), 4, "every verdict occurs: {verdicts:?}");
        }
    }
}

#[test]
fn a_gate_keeps_its_answer_as_plain_values() {
    let [_, policy] = policies();
    let cp = policy.context.as_ref().unwrap();
    let e = risk_profile(cp);
    let gate = ContextGate::decide(&e, cp, action_ref(policy, "crm.lookup"));
    assert_eq!(gate.begin().0, Verdict::Constrain);
    assert!(!gate.result_labels().is_empty());
    let back: ContextGate = serde_json::from_value(serde_json::to_value(&gate).unwrap()).unwrap();
    assert_eq!(back, gate);

    let export = ContextGate::decide(&e, cp, action_ref(policy, "report.export"));
    assert_eq!(
        export.begin(),
        (
            Verdict::Deny,
            Reason::code("restricted_by:no_external_export")
        )
    );
    assert!(export.bypassed());
    assert!(export.obligations.is_empty());
    assert_eq!(export.result_labels(), &[] as &[Label]);
}

// --- generated inputs --------------------------------------------------------

fn arb_step() -> impl Strategy<Value = Value> {
    let actions = prop::sample::select(vec![
        "memory.read",
        "memory.write",
        "document.summarize",
        "artifact.save",
        "external.upload",
        "report.export",
        "crm.lookup",
        "analytics.usage",
        "finance.indicators",
        "shell.eval",
    ]);
    let ids = prop::sample::select(vec!["", "a", "b", "c", "d"]);
    let args = prop::sample::select(vec![
        json!({}),
        json!({"document_id": "fixture-1"}),
        json!({"document_id": "bad id!"}),
        json!({"path": "internal/report.txt"}),
        json!({"path": "../etc/passwd"}),
        json!({"destination": "https://uploads.example.com/x"}),
        json!({"destination": "untrusted-service"}),
        json!({"customer_id": "c1"}),
        json!({"namespace": "notes", "key": "k", "value": 1}),
        json!({"namespace": "notes", "key": "k", "value": 1, "owner_agent_id": "report_manager"}),
    ]);
    (ids, actions, args).prop_map(
        |(id, action, arguments)| json!({"step_id": id, "action": action, "arguments": arguments}),
    )
}

fn arb_folds() -> impl Strategy<Value = Vec<Vec<Label>>> {
    prop::collection::vec(
        prop::collection::vec(prop::sample::select(LABELS.to_vec()), 0..4)
            .prop_map(|ls| ls.into_iter().map(l).collect()),
        0..4,
    )
}

proptest! {
    #[test]
    fn admission_matches_the_engine_on_generated_inputs(
        strict in any::<bool>(),
        agent in prop::sample::select(AGENTS.to_vec()),
        steps in prop::collection::vec(arb_step(), 1..6),
        folds in arb_folds(),
        delegated in any::<bool>(),
        with_context in any::<bool>(),
    ) {
        let [lab, strict_lab] = policies();
        let policy = if strict { strict_lab } else { lab };
        let h = hierarchy(policy);
        let ctx = context(policy, &h);
        let cp = policy.context.as_ref().unwrap();
        let e = envelope(cp, &folds, delegated);
        let run = with_context.then_some(RunContext { envelope: &e, policy: cp });
        let sop = sop_from_value(
            &json!({"sop_id": "generated", "version": 1, "steps": steps}),
            &SopLimits::default(),
        )
        .unwrap();
        let actor = AgentId::parse(agent).unwrap();
        let ours = admit(&ctx, &actor, &sop, run, NOW);
        prop_assert_eq!(&ours, &engine_admission(&ctx, policy, &actor, &sop, run));
        prop_assert_eq!(ours.admitted, ours.steps.iter().all(|s| s.permits()));
    }

    #[test]
    fn the_step_gate_matches_the_engine_on_generated_inputs(
        strict in any::<bool>(),
        folds in arb_folds(),
        delegated in any::<bool>(),
        action in prop::sample::select(vec![
            "memory.write", "document.summarize", "external.upload", "report.export",
            "crm.lookup", "finance.indicators", "shell.eval",
        ]),
        reported in prop::collection::vec(prop::sample::select(LABELS.to_vec()), 0..3),
    ) {
        let [lab, strict_lab] = policies();
        let policy = if strict { strict_lab } else { lab };
        let cp = policy.context.as_ref().unwrap();
        let e = envelope(cp, &folds, delegated);
        let a = action_ref(policy, action);
        let cd = decide(&e, cp, &ContextRequest::Action(a));
        let gate = ContextGate::decide(&e, cp, a);
        let reported: Vec<Label> = reported.into_iter().map(l).collect();
        let declared = policy.catalogue.by_name(action).map_or(&[][..], |x| x.output_labels());
        gate_matches_engine(&gate, &cd, &reported, declared);
    }
}

/// Every step's decision as preflight built it before steps kept only
/// their own part: verdict and reason from the first violation, the actor,
/// `sop.validate`, `sop_id:step_id`, the policy version and the time.
fn full_decision(actor: &AgentId, sop: &Sop, version: &str, check: &StepCheck) -> Decision {
    let (verdict, reason) = match check.violations.first() {
        None => (Verdict::Allow, reasons::STEP_ALLOWED),
        Some(r) => (Verdict::Deny, r.clone()),
    };
    Decision {
        verdict,
        reason,
        subject: Subject::Agent(actor.clone()),
        operation: SmolStr::new_static(OP_SOP_VALIDATE),
        resource: SmolStr::from(format!("{}:{}", sop.sop_id, check.step_id)),
        policy_version: SmolStr::from(version),
        obligations: Vec::new(),
        time: NOW,
    }
}

#[test]
fn step_decisions_and_the_serialised_form_are_the_full_ones() {
    let [policy, _] = policies();
    let h = hierarchy(policy);
    let ctx = context(policy, &h);
    let mut sops: Vec<Sop> = SOPS
        .iter()
        .map(|t| parse_sop(t, &policy.sop_limits).unwrap())
        .collect();
    // Empty, repeated and long step ids (a resource over 23 bytes).
    sops.push(
        sop_from_value(
            &json!({"sop_id": "a-rather-long-sop-identifier", "version": 1, "steps": [
                {"step_id": "", "action": "document.summarize"},
                {"step_id": "x", "action": "nope"},
                {"step_id": "x", "action": "report.export"}
            ]}),
            &SopLimits::default(),
        )
        .unwrap(),
    );
    for sop in &sops {
        for agent in AGENTS {
            let actor = AgentId::parse(agent).unwrap();
            let p = preflight(&ctx, &actor, sop, NOW);
            let mut steps = Vec::new();
            for (check, step) in p.steps.iter().zip(&sop.steps) {
                let want = full_decision(&actor, sop, &policy.version, check);
                assert_eq!(p.decision(check), want);
                assert_eq!(check.verdict(), want.verdict);
                assert_eq!(check.reason(), &want.reason);
                assert_eq!(check.step_id.as_str(), step.step_id_str());
                steps.push(json!({
                    "step_id": check.step_id,
                    "action": check.action,
                    "decision": want,
                    "violations": check.violations,
                }));
            }
            let text = serde_json::to_string(&p).unwrap();
            assert_eq!(
                serde_json::from_str::<Value>(&text).unwrap(),
                json!({"admitted": p.admitted, "steps": steps})
            );
            // Fields in the order the derived form wrote them.
            let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap();
            assert!(at("admitted") < at("steps"));
            assert!(at("step_id") < at("action") && at("action") < at("decision"));
            assert!(at("decision") < at("verdict") && at("policy_version") < at("violations"));
            let back: Preflight = serde_json::from_str(&text).unwrap();
            assert_eq!(back, p);
            assert_eq!(serde_json::to_string(&back).unwrap(), text);
        }
    }
}

#[test]
fn a_serialised_preflight_whose_decisions_disagree_is_refused() {
    let [policy, _] = policies();
    let h = hierarchy(policy);
    let ctx = context(policy, &h);
    let sop = parse_sop(SOPS[5], &policy.sop_limits).unwrap();
    let p = preflight(&ctx, &AgentId::parse("researcher").unwrap(), &sop, NOW);
    assert!(p.steps.len() > 1);
    let mut v = serde_json::to_value(&p).unwrap();
    v["steps"][1]["decision"]["time"] = json!(NOW.0 + 1);
    assert!(serde_json::from_value::<Preflight>(v).is_err());
}
