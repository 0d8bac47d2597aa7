//! Scenario tests: the design document's customer example, same-step
//! enforcement, the Python reference's canonical streams, delegation and
//! declassification.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::decision::{Obligation, Verdict};
use crate::ids::{ActionName, AgentId, Label};

pub(crate) fn l(s: &str) -> Label {
    Label::parse(s).unwrap()
}

pub(crate) fn ls(xs: &[&str]) -> Vec<Label> {
    xs.iter().map(|s| l(s)).collect()
}

pub(crate) fn names(n: NameSet<'_>) -> Vec<&str> {
    n.iter().map(Label::as_str).collect()
}

/// The brief's `context:` section verbatim (plus a `renewal` label for the
/// customer stream), parsed from YAML as the bundle loader will.
pub(crate) const CUSTOMER_YAML: &str = r#"
labels: {pii: confidential, financial: confidential, behavioral: internal, name: internal, public_sku: public, renewal: internal}
aggregation_rules:
  - {name: customer_risk, all_labels: [pii, financial, behavioral], sensitivity: restricted, derived: [customer-risk-profile], restrict: [no_external_export]}
backstop: {min_labels: 4, at_or_above: internal, verdict: escalate}
inherit_threshold: restricted
restricted_floor: restricted
restrictions:
  no_external_export: {denies_tags: [export]}
  no_external_delegation: {denies_delegation: external}
  no_memory_write: {denies_actions: [memory.write]}
declassifiers: [compliance_officer]
"#;

pub(crate) fn customer_policy() -> ContextPolicy {
    let spec: ContextPolicySpec = serde_saphyr::from_str(CUSTOMER_YAML).unwrap();
    ContextPolicy::compile(&spec).unwrap()
}

/// The Python benchmark's RULESET (agt_envelope_bench.py), threshold 4,
/// floor restricted. `no_print` is declared so the benchmark's child
/// restrictions are all known.
pub(crate) fn bench_policy() -> ContextPolicy {
    let spec: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {
            "public": "public", "internal": "internal", "telemetry": "internal",
            "marketing": "public", "contract": "internal", "behavioral": "internal",
            "location": "internal", "pii": "confidential", "financial": "confidential",
            "health": "confidential", "biometric": "restricted", "credentials": "restricted"
        },
        "aggregation_rules": [
            {"name": "pii_financial_behavioral", "all_labels": ["pii", "financial", "behavioral"],
             "sensitivity": "restricted", "restrict": ["no_external_export"]},
            {"name": "pii_health", "all_labels": ["pii", "health"],
             "sensitivity": "restricted", "restrict": ["no_external_export", "no_memory_write"]},
            {"name": "pii_location", "all_labels": ["pii", "location"],
             "sensitivity": "confidential", "restrict": ["no_external_delegation"]},
            {"name": "financial_contract", "all_labels": ["financial", "contract"],
             "sensitivity": "confidential", "restrict": ["no_memory_write"]},
            {"name": "credentials", "all_labels": ["credentials"], "sensitivity": "top_secret",
             "restrict": ["no_external_export", "no_external_delegation", "no_memory_write"]}
        ],
        "backstop": {"min_labels": 4, "at_or_above": "public"},
        "restricted_floor": "restricted",
        "inherit_threshold": "top_secret",
        "restrictions": {"no_print": {"denies_tags": ["print"]}},
        "declassifiers": ["compliance_officer"]
    }))
    .unwrap();
    ContextPolicy::compile(&spec).unwrap()
}

pub(crate) fn root(p: &ContextPolicy, id: &str) -> Envelope {
    Envelope::root(
        p,
        EnvelopeId::parse(id).unwrap(),
        WorkflowId::parse(&format!("wf-{id}")).unwrap(),
        AgentId::parse("customer_success").unwrap(),
    )
}

pub(crate) fn run(p: &ContextPolicy, env: &Envelope, steps: &[&[&str]]) -> Envelope {
    steps.iter().fold(env.clone(), |e, labels| {
        e.fold(p, &ls(labels), &[]).unwrap().0
    })
}

pub(crate) fn act(env: &Envelope, p: &ContextPolicy, name: &str, tags: &[&str]) -> ContextDecision {
    let tags = ls(tags);
    decide(
        env,
        p,
        &ContextRequest::Action(ActionRef { name, tags: &tags }),
    )
}

fn delegation(env: &Envelope, p: &ContextPolicy, target: TrustZone) -> ContextDecision {
    decide(
        env,
        p,
        &ContextRequest::Delegation {
            target,
            delegatee_authority: &[],
        },
    )
}

const UPLOAD: (&str, &[&str]) = ("external.upload", &["external", "export", "state_changing"]);

// ---------------------------------------------------------------------------
// The customer example of the design document
// ---------------------------------------------------------------------------

#[test]
fn customer_risk_profile_is_restricted_and_blocks_export() {
    let p = customer_policy();
    let e0 = root(&p, "env-customer");
    // name, renewal status, usage analytics, financial indicators
    let steps: [&[&str]; 4] = [
        &["name", "pii"],
        &["renewal"],
        &["behavioral"],
        &["financial"],
    ];
    let mut env = e0.clone();
    let mut verdicts = Vec::new();
    for labels in steps {
        let (next, t) = env.fold(&p, &ls(labels), &[]).unwrap();
        assert_eq!(t.version(), env.version() + 1);
        env = next;
        verdicts.push(act(&env, &p, UPLOAD.0, UPLOAD.1).verdict);
    }
    // Steps 1-2 are fine. After step 3 four labels at or above `internal`
    // (name, pii, renewal, behavioral) match no rule: the backstop escalates.
    // Step 4 completes the combination: the rule governs it and the export
    // is denied.
    assert_eq!(
        verdicts,
        [
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Escalate,
            Verdict::Deny
        ]
    );
    assert_eq!(env.aggregate_sensitivity(), Sensitivity::Restricted);
    assert_eq!(names(env.derived()), ["customer-risk-profile"]);
    assert_eq!(names(env.restrictions()), ["no_external_export"]);
    assert_eq!(env.version(), 4);

    let d = act(&env, &p, UPLOAD.0, UPLOAD.1);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");
    assert_eq!(d.reason.kind(), reasons::RESTRICTED_BY);
    assert!(d.obligations.is_empty());

    // A read is allowed but constrained: results inherit the classification,
    // children inherit the restriction.
    let d = act(&env, &p, "document.summarize", &[]);
    assert_eq!(d.verdict, Verdict::Constrain);
    assert_eq!(d.reason, reasons::CONTEXT_CONSTRAINED);
    assert_eq!(
        d.obligations.to_vec(),
        vec![
            Obligation::ResultLabels {
                labels: ls(&[
                    "behavioral",
                    "customer-risk-profile",
                    "financial",
                    "name",
                    "pii",
                    "renewal"
                ])
            },
            Obligation::InheritRestrictions {
                restrictions: ls(&["no_external_export"])
            },
        ]
    );

    // External delegation to an agent that can upload: denied, the upload
    // authority would leave the enforcement boundary.
    let upload_tags = ls(UPLOAD.1);
    let authority = [ActionRef {
        name: UPLOAD.0,
        tags: &upload_tags,
    }];
    let d = decide(
        &env,
        &p,
        &ContextRequest::Delegation {
            target: TrustZone::External,
            delegatee_authority: &authority,
        },
    );
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "delegation_denied:external.upload");
    // To an external agent without such authority: the floor escalates.
    let d = delegation(&env, &p, TrustZone::External);
    assert_eq!(
        (d.verdict, d.reason.clone()),
        (Verdict::Escalate, reasons::SENSITIVITY_FLOOR)
    );
    // Internally, delegation is constrained (the child inherits).
    let d = delegation(&env, &p, TrustZone::Internal);
    assert_eq!(d.verdict, Verdict::Constrain);
}

#[test]
fn customer_rule_restricting_delegation_denies_external_delegation() {
    let yaml = CUSTOMER_YAML.replace(
        "restrict: [no_external_export]",
        "restrict: [no_external_export, no_external_delegation]",
    );
    let spec: ContextPolicySpec = serde_saphyr::from_str(&yaml).unwrap();
    let p = ContextPolicy::compile(&spec).unwrap();
    let env = run(
        &p,
        &root(&p, "env-c"),
        &[&["name", "pii"], &["behavioral", "financial"]],
    );
    let d = delegation(&env, &p, TrustZone::External);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_delegation");
    assert!(d.projected_restrictions.contains("no_external_delegation"));
    assert_eq!(
        delegation(&env, &p, TrustZone::Internal).verdict,
        Verdict::Constrain
    );
}

#[test]
fn growth_alone_never_elevates_but_the_backstop_escalates() {
    let p = customer_policy();
    // name + public_sku: nothing new (the document's false-positive example).
    let env = run(&p, &root(&p, "env-sku"), &[&["name"], &["public_sku"]]);
    assert_eq!(env.aggregate_sensitivity(), Sensitivity::Internal);
    assert_eq!(act(&env, &p, UPLOAD.0, UPLOAD.1).verdict, Verdict::Allow);
    // Four internal-or-above labels, no rule: backstop (public_sku does not count).
    let env = run(&p, &env, &[&["renewal", "behavioral"]]);
    assert_eq!(env.labels().len(), 4);
    assert_eq!(
        act(&env, &p, "document.summarize", &[]).verdict,
        Verdict::Allow
    );
    let env = run(&p, &env, &[&["pii"]]);
    let d = act(&env, &p, "document.summarize", &[]);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Escalate, reasons::AGGREGATION_BACKSTOP)
    );
    // The rule covering the combination suppresses it.
    let env = run(&p, &env, &[&["financial"]]);
    assert_eq!(
        act(&env, &p, "document.summarize", &[]).verdict,
        Verdict::Constrain
    );
}

// ---------------------------------------------------------------------------
// Same-step enforcement (the reference's gap)
// ---------------------------------------------------------------------------

fn labels_only_record(p: &ContextPolicy, labels: &[&str], s: Sensitivity) -> Envelope {
    let mut r = root(p, "env-stale").to_record();
    r.labels = ls(labels).into_iter().collect();
    r.aggregate_sensitivity = s;
    r.version = 3;
    Envelope::restore(&r, p).unwrap()
}

#[test]
fn a_rule_implied_restriction_binds_the_very_next_decision() {
    let p = bench_policy();
    // Labels folded, rules not applied (restored from a fold-only writer).
    let env = labels_only_record(
        &p,
        &["pii", "financial", "behavioral"],
        Sensitivity::Confidential,
    );
    assert!(env.restrictions().is_empty());
    let d = act(&env, &p, "export", &["export"]);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");
    assert_eq!(d.projected_sensitivity, Sensitivity::Restricted);
    assert_eq!(
        names(d.projected_restrictions.names()),
        ["no_external_export"]
    );

    let env = labels_only_record(&p, &["pii", "location"], Sensitivity::Confidential);
    let d = delegation(&env, &p, TrustZone::External);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_delegation");

    // The next fold stores what the decision projected.
    let (next, t) = env.fold(&p, &[], &[]).unwrap();
    assert_eq!(names(next.restrictions()), ["no_external_delegation"]);
    assert_eq!(names(t.restrictions_added()), ["no_external_delegation"]);
    assert_eq!(names(t.rules_applied()), ["pii_location"]);
}

#[test]
fn a_policy_upgrade_binds_restored_envelopes() {
    // v1 has no rules; v2 adds one over the same labels. A record written
    // under v1 and restored under v2 is decided with v2's rule.
    let v1: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {"pii": "confidential", "health": "confidential"}
    }))
    .unwrap();
    let mut v2 = v1.clone();
    v2.aggregation_rules.push(AggregationRuleSpec {
        name: Some(l("pii_health")),
        all_labels: ls(&["pii", "health"]),
        sensitivity: Sensitivity::Restricted,
        derived: vec![],
        restrict: ls(&["no_memory_write"]),
    });
    let p1 = ContextPolicy::compile(&v1).unwrap();
    let p2 = ContextPolicy::compile(&v2).unwrap();
    let env1 = run(&p1, &root(&p1, "env-up"), &[&["pii", "health"]]);
    assert!(env1.restrictions().is_empty());
    // Vocabularies differ (rule names are part of it): refuse, don't guess.
    let d = act(&env1, &p2, "memory.write", &[]);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, reasons::ENVELOPE_POLICY_MISMATCH)
    );
    assert!(matches!(
        env1.fold(&p2, &[], &[]),
        Err(EnvelopeError::PolicyMismatch { .. })
    ));
    let env2 = Envelope::restore(&env1.to_record(), &p2).unwrap();
    let d = act(&env2, &p2, "memory.write", &[]);
    assert_eq!(d.reason.as_str(), "restricted_by:no_memory_write");
}

// ---------------------------------------------------------------------------
// The Python reference's canonical streams (agt_envelope_bench.py), with the
// mapping of outcomes. Python: CONSTRAIN(restriction) ~ Warden deny
// restricted_by; CONSTRAIN(floor) ~ escalate sensitivity_floor; ALLOW ~
// allow or constrain (Warden constrains whenever obligations exist).
// ---------------------------------------------------------------------------

fn trace(
    p: &ContextPolicy,
    id: &str,
    steps: &[&[&str]],
    action: (&str, &[&str]),
) -> (Envelope, Vec<Verdict>) {
    let mut env = root(p, id);
    let mut out = Vec::new();
    for labels in steps {
        env = env.fold(p, &ls(labels), &[]).unwrap().0;
        out.push(act(&env, p, action.0, action.1).verdict);
    }
    (env, out)
}

const EXPORT: (&str, &[&str]) = ("export", &["export"]);
const READ: (&str, &[&str]) = ("read", &[]);

#[test]
fn reference_c1_and_c1r_order_independent_deny() {
    let p = bench_policy();
    let (e1, t1) = trace(
        &p,
        "env-c1",
        &[&["pii"], &["internal"], &["behavioral"], &["financial"]],
        EXPORT,
    );
    // Python: [ALLOW, ALLOW, ALLOW, CONSTRAIN restricted by no_external_export]
    assert_eq!(
        t1,
        [
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Deny
        ]
    );
    let (e2, t2) = trace(
        &p,
        "env-c1r",
        &[&["financial"], &["behavioral"], &["internal"], &["pii"]],
        EXPORT,
    );
    assert_eq!(t2, t1);
    for e in [&e1, &e2] {
        assert_eq!(
            names(e.labels()),
            ["behavioral", "financial", "internal", "pii"]
        );
        assert_eq!(e.aggregate_sensitivity(), Sensitivity::Restricted);
        assert_eq!(names(e.restrictions()), ["no_external_export"]);
        // Python reports version 8 (accumulate bumps twice per step).
        assert_eq!(e.version(), 4);
    }
}

#[test]
fn reference_c1l_unknown_labels_are_an_error_not_a_backstop() {
    // Python folds free-form strings and later escalates on the backstop;
    // Warden refuses labels the policy does not declare.
    let p = bench_policy();
    let env = root(&p, "env-c1l");
    let err = env.fold(&p, &ls(&["name"]), &[]).unwrap_err();
    assert_eq!(
        err,
        EnvelopeError::UnknownLabels {
            labels: ls(&["name"])
        }
    );
    assert_eq!(
        err.to_string(),
        "labels unknown to the context policy: `name`"
    );
    assert_eq!(err.reason(), reasons::UNKNOWN_LABEL);
    let err = env
        .fold(
            &p,
            &ls(&["usage_analytics", "behavioral"]),
            &ls(&["renewal_status", "usage_analytics"]),
        )
        .unwrap_err();
    assert_eq!(
        err,
        EnvelopeError::UnknownLabels {
            labels: ls(&["usage_analytics", "renewal_status"])
        }
    );
}

#[test]
fn reference_c2_backstop_on_a_non_gated_action() {
    let p = bench_policy();
    let (_, t) = trace(
        &p,
        "env-c2",
        &[&["public"], &["internal"], &["telemetry"], &["marketing"]],
        READ,
    );
    assert_eq!(
        t,
        [
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Escalate
        ]
    );
}

#[test]
fn reference_c3_floor_escalates_instead_of_an_empty_constrain() {
    // Python: CONSTRAIN with no obligations, which becomes ALLOW on any
    // path with an obligation channel. Warden escalates.
    let p = bench_policy();
    let (env, t) = trace(&p, "env-c3", &[&["biometric"]], EXPORT);
    assert_eq!(t, [Verdict::Escalate]);
    let d = act(&env, &p, EXPORT.0, EXPORT.1);
    assert_eq!(d.reason, reasons::SENSITIVITY_FLOOR);
    assert_eq!(d.projected_sensitivity, Sensitivity::Restricted);
    // An untagged action at the same level is not a flow out.
    assert_eq!(act(&env, &p, "summarize", &[]).verdict, Verdict::Allow);
    // Nor, unlike the reference, is memory.write (see the module docs).
    assert_eq!(act(&env, &p, "memory.write", &[]).verdict, Verdict::Allow);
}

#[test]
fn reference_c4_non_gated_action_at_top_secret() {
    let p = bench_policy();
    let (env, t) = trace(&p, "env-c4", &[&["credentials"]], ("summarize", &[]));
    // Python ALLOW; Warden constrains (the restrictions bind children, and
    // top_secret reaches inherit_threshold).
    assert_eq!(t, [Verdict::Constrain]);
    assert_eq!(env.aggregate_sensitivity(), Sensitivity::TopSecret);
    assert_eq!(
        names(env.restrictions()),
        [
            "no_external_delegation",
            "no_external_export",
            "no_memory_write"
        ]
    );
}

#[test]
fn reference_c5_restriction_below_the_floor() {
    let p = bench_policy();
    let (env, t) = trace(&p, "env-c5", &[&["pii", "location"]], EXPORT);
    // C5b: Python ALLOW (export not restricted, confidential < floor).
    assert_eq!(t, [Verdict::Constrain]);
    assert_eq!(env.aggregate_sensitivity(), Sensitivity::Confidential);
    // C5a: delegate is hard-gated below the floor.
    let d = delegation(&env, &p, TrustZone::External);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_delegation");
}

#[test]
fn reference_c6_a_rule_suppresses_the_backstop() {
    let p = bench_policy();
    let (env, t) = trace(
        &p,
        "env-c6",
        &[&["public", "internal", "telemetry"], &["pii", "location"]],
        READ,
    );
    assert_eq!(env.labels().len(), 5);
    assert_eq!(t, [Verdict::Allow, Verdict::Constrain]);
}

#[test]
fn reference_c7_delegation_from_c1() {
    let p = bench_policy();
    let c1 = run(
        &p,
        &root(&p, "env-c1"),
        &[&["pii"], &["internal"], &["behavioral"], &["financial"]],
    );
    let child_agent = AgentId::parse("researcher").unwrap();
    let (child, t) = c1
        .delegate(
            &p,
            child_agent.clone(),
            EnvelopeId::parse("env-c1:child").unwrap(),
            &ls(&["no_memory_write"]),
            false,
        )
        .unwrap();
    assert_eq!(
        names(child.restrictions()),
        ["no_external_export", "no_memory_write"]
    );
    assert_eq!(names(child.labels()), names(c1.labels()));
    assert_eq!(child.aggregate_sensitivity(), Sensitivity::Restricted);
    assert_eq!(child.parent_envelope_id(), Some(c1.envelope_id()));
    assert_eq!(child.delegation_depth(), 1);
    assert_eq!(child.version(), 0);
    assert_eq!(t.kind(), TransitionKind::Delegated);
    assert_eq!(t.source_envelope_id(), c1.envelope_id());
    assert_eq!(names(t.restrictions_added()), ["no_memory_write"]);

    let r = |d: ContextDecision| (d.verdict, d.reason.as_str().to_owned());
    assert_eq!(
        r(act(&child, &p, EXPORT.0, EXPORT.1)),
        (Verdict::Deny, "restricted_by:no_external_export".into())
    );
    assert_eq!(
        r(act(&child, &p, "memory.write", &[])),
        (Verdict::Deny, "restricted_by:no_memory_write".into())
    );
    // Python: CONSTRAIN gated by sensitivity floor.
    assert_eq!(
        r(delegation(&child, &p, TrustZone::External)),
        (Verdict::Escalate, "sensitivity_floor".into())
    );
    assert_eq!(act(&child, &p, "read", &[]).verdict, Verdict::Constrain);

    // Redacted child: the payload goes, sensitivity and restrictions stay
    // (Python's restrictions-only child drops to PUBLIC and allows delegate).
    let (redacted, t) = c1
        .delegate(
            &p,
            child_agent,
            EnvelopeId::parse("env-c1:child-min").unwrap(),
            &ls(&["no_memory_write"]),
            true,
        )
        .unwrap();
    assert!(redacted.labels().is_empty() && redacted.derived().is_empty());
    assert_eq!(redacted.aggregate_sensitivity(), Sensitivity::Restricted);
    assert_eq!(
        names(redacted.restrictions()),
        ["no_external_export", "no_memory_write"]
    );
    assert!(t.redacted());
    assert_eq!(
        names(t.labels_removed()),
        ["behavioral", "financial", "internal", "pii"]
    );
    assert_eq!(
        delegation(&redacted, &p, TrustZone::External).verdict,
        Verdict::Escalate
    );
}

#[test]
fn reference_c8_fold_only_envelopes_are_projected() {
    let p = bench_policy();
    // c8a: Python ALLOW (gates on stored restrictions only).
    let e = labels_only_record(&p, &["pii", "location"], Sensitivity::Confidential);
    assert_eq!(
        delegation(&e, &p, TrustZone::External).verdict,
        Verdict::Deny
    );
    // c8b: Python CONSTRAIN by floor; Warden names the restriction.
    let e = labels_only_record(
        &p,
        &["pii", "financial", "behavioral"],
        Sensitivity::Confidential,
    );
    assert_eq!(
        act(&e, &p, EXPORT.0, EXPORT.1).reason.as_str(),
        "restricted_by:no_external_export"
    );
}

// ---------------------------------------------------------------------------
// Delegation and authority
// ---------------------------------------------------------------------------

#[test]
fn delegation_errors() {
    let p = bench_policy();
    let env = root(&p, "env-d");
    let a = AgentId::parse("child").unwrap();
    let err = env
        .delegate(
            &p,
            a.clone(),
            EnvelopeId::parse("env-d:c").unwrap(),
            &ls(&["no_teleport"]),
            false,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "restrictions unknown to the context policy: `no_teleport`"
    );
    assert_eq!(err.reason(), reasons::UNKNOWN_RESTRICTION);
    let err = env
        .delegate(&p, a, EnvelopeId::parse("env-d").unwrap(), &[], false)
        .unwrap_err();
    assert!(matches!(err, EnvelopeError::ChildIdIsParentId { .. }));
}

#[test]
fn effective_authority_is_an_intersection_without_laundering() {
    let p = customer_policy();
    let env = run(
        &p,
        &root(&p, "env-a"),
        &[&["name", "pii"], &["behavioral"], &["financial"]],
    );
    let set = |xs: &[&str]| -> BTreeSet<ActionName> {
        xs.iter().map(|s| ActionName::parse(s).unwrap()).collect()
    };
    let export = ls(&["external", "export"]);
    let none: Vec<Label> = vec![];
    let tags_of = |a: &ActionName| match a.as_str() {
        "external.upload" => Some(export.as_slice()),
        "document.summarize" | "artifact.save" | "memory.write" | "admin.reset" => {
            Some(none.as_slice())
        }
        _ => None,
    };
    let delegator = set(&[
        "document.summarize",
        "artifact.save",
        "external.upload",
        "memory.write",
        "mystery",
    ]);
    // The delegatee is more privileged (admin.reset): it gains nothing by it.
    let delegatee = set(&[
        "document.summarize",
        "external.upload",
        "admin.reset",
        "memory.write",
        "mystery",
    ]);
    let org = set(&[
        "document.summarize",
        "artifact.save",
        "external.upload",
        "admin.reset",
        "mystery",
    ]);
    let eff = effective_delegated_authority(&delegator, &delegatee, &env, &p, tags_of, &org);
    // external.upload: restricted; memory.write: not in org; mystery: unknown tags.
    assert_eq!(eff, set(&["document.summarize"]));
    // A child is at least as restrictive, so the same holds for it.
    let (child, _) = env
        .delegate(
            &p,
            AgentId::parse("c").unwrap(),
            EnvelopeId::parse("env-a:c").unwrap(),
            &ls(&["no_memory_write"]),
            true,
        )
        .unwrap();
    let eff_child =
        effective_delegated_authority(&delegator, &delegatee, &child, &p, tags_of, &org);
    assert!(eff_child.is_subset(&eff));
}

// ---------------------------------------------------------------------------
// Declassification
// ---------------------------------------------------------------------------

#[test]
fn declassification_is_authorized_justified_and_consistent() {
    let p = customer_policy();
    let env = run(
        &p,
        &root(&p, "env-x"),
        &[&["name", "pii"], &["behavioral"], &["financial"]],
    );
    let officer = AgentId::parse("compliance_officer").unwrap();
    let intruder = AgentId::parse("customer_success").unwrap();
    let why = "ticket SEC-1: aggregated profile deleted after review";

    let err = env
        .declassify(&p, &intruder, Sensitivity::Internal, &[], why)
        .unwrap_err();
    assert_eq!(err.reason(), reasons::DECLASSIFICATION_NOT_AUTHORIZED);
    assert_eq!(
        err.to_string(),
        "agent `customer_success` is not allowed to declassify"
    );
    assert_eq!(
        env.declassify(&p, &officer, Sensitivity::Internal, &[], "  ")
            .unwrap_err(),
        EnvelopeError::MissingJustification
    );
    assert_eq!(
        env.declassify(&p, &officer, Sensitivity::Internal, &[], &"x".repeat(1025))
            .unwrap_err(),
        EnvelopeError::JustificationTooLong { len: 1025 }
    );
    assert!(
        env.declassify(&p, &officer, Sensitivity::Internal, &[], &"x".repeat(1024))
            .is_err_and(|e| matches!(e, EnvelopeError::StillImplied { .. }))
    );
    assert_eq!(
        env.declassify(&p, &officer, Sensitivity::Internal, &[], "a\nb")
            .unwrap_err(),
        EnvelopeError::JustificationControlCharacter
    );
    assert!(matches!(
        env.declassify(&p, &officer, Sensitivity::TopSecret, &[], why),
        Err(EnvelopeError::NotALowering { .. })
    ));
    // Lowering while the combination is still present would be undone by
    // the next fold: refused.
    let err = env
        .declassify(
            &p,
            &officer,
            Sensitivity::Confidential,
            &ls(&["customer-risk-profile"]),
            why,
        )
        .unwrap_err();
    assert_eq!(
        err,
        EnvelopeError::StillImplied {
            envelope_id: env.envelope_id().clone(),
            implied: Sensitivity::Restricted,
            to: Sensitivity::Confidential
        }
    );
    // Breaking the combination works; restrictions stay.
    let (low, t) = env
        .declassify(
            &p,
            &officer,
            Sensitivity::Confidential,
            &ls(&["financial", "customer-risk-profile"]),
            why,
        )
        .unwrap();
    assert_eq!(low.aggregate_sensitivity(), Sensitivity::Confidential);
    assert_eq!(names(low.labels()), ["behavioral", "name", "pii"]);
    assert!(low.derived().is_empty());
    assert_eq!(names(low.restrictions()), ["no_external_export"]);
    assert_eq!(low.version(), env.version() + 1);
    assert_eq!(t.kind(), TransitionKind::Declassified);
    assert_eq!(t.reason(), reasons::DECLASSIFIED);
    assert_eq!(
        names(t.labels_removed()),
        ["customer-risk-profile", "financial"]
    );
    let d = t.declassification().unwrap();
    assert_eq!((&d.by, d.justification.as_str()), (&officer, why));
    // The restriction still binds.
    assert_eq!(act(&low, &p, UPLOAD.0, UPLOAD.1).verdict, Verdict::Deny);
    // And financial coming back re-derives the profile.
    let again = run(&p, &low, &[&["financial"]]);
    assert_eq!(again.aggregate_sensitivity(), Sensitivity::Restricted);
}

// ---------------------------------------------------------------------------
// Transition records and envelope records
// ---------------------------------------------------------------------------

#[test]
fn transition_serialises_labels_and_ids_only() {
    let p = customer_policy();
    let env = run(&p, &root(&p, "env-t"), &[&["name", "pii"], &["behavioral"]]);
    let (_, t) = env
        .fold(&p, &ls(&["financial"]), &ls(&["financial"]))
        .unwrap();
    assert_eq!(t.result_sensitivity(), Some(Sensitivity::Confidential));
    let json = serde_json::to_value(&t).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "kind": "accumulated",
            "reason": "context_accumulated",
            "envelope_id": "env-t",
            "source_envelope_id": "env-t",
            "workflow_id": "wf-env-t",
            "agent_id": "customer_success",
            "delegation_depth": 0,
            "source_version": 2,
            "version": 3,
            "sensitivity_from": "confidential",
            "sensitivity_to": "restricted",
            "classification": "restricted",
            "labels_added": ["financial"],
            "derived_added": ["customer-risk-profile"],
            "labels_removed": [],
            "restrictions_added": ["no_external_export"],
            "rules_applied": ["customer_risk"],
            "result_sensitivity": "confidential"
        })
    );
    // Once restricted, whatever a step produces inherits the classification.
    let env = run(&p, &env, &[&["financial"]]);
    let (_, t) = env.fold(&p, &ls(&["public_sku"]), &[]).unwrap();
    assert_eq!(t.result_sensitivity(), Some(Sensitivity::Restricted));
}

#[test]
fn records_round_trip_and_are_checked() {
    let p = customer_policy();
    let env = run(
        &p,
        &root(&p, "env-r"),
        &[&["name", "pii"], &["behavioral", "financial"]],
    );
    let rec = env.to_record();
    let json = serde_json::to_string(&rec).unwrap();
    let back: EnvelopeRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(Envelope::restore(&back, &p).unwrap(), env);
    assert_eq!(
        serde_json::to_value(&env).unwrap(),
        serde_json::to_value(&rec).unwrap()
    );

    let mut bad = rec.clone();
    bad.labels.insert(l("ghost"));
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::UnknownLabels { .. })
    ));
    let mut bad = rec.clone();
    bad.restrictions.insert(l("no_ghost"));
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::UnknownRestrictions { .. })
    ));
    let mut bad = rec.clone();
    bad.delegation_depth = 2;
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::InconsistentRecord { .. })
    ));
    let mut bad = rec;
    bad.parent_envelope_id = Some(bad.envelope_id.clone());
    bad.delegation_depth = 1;
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::InconsistentRecord { .. })
    ));
    assert!(
        serde_json::from_str::<EnvelopeRecord>(
            &json.replace("\"version\"", "\"extra\":1,\"version\"")
        )
        .is_err()
    );
}

#[test]
fn decisions_convert_to_decision_records() {
    let p = customer_policy();
    let env = run(
        &p,
        &root(&p, "env-dd"),
        &[&["name", "pii"], &["behavioral", "financial"]],
    );
    let d = act(&env, &p, "document.summarize", &[]).into_decision(
        AgentId::parse("customer_success").unwrap(),
        "document.summarize",
        "run-1:step-2",
        "lab-1",
        crate::time::Timestamp(1_700_000_000_000),
    );
    assert_eq!(d.verdict, Verdict::Constrain);
    assert_eq!(d.obligations.len(), 2);
    assert!(d.permits());
}

#[test]
fn chained_rules_reach_a_fixpoint() {
    let spec: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {"a": "internal", "b": "internal", "c": "internal"},
        "aggregation_rules": [
            {"name": "second", "all_labels": ["ab", "c"], "sensitivity": "top_secret", "restrict": ["no_memory_write"]},
            {"name": "first", "all_labels": ["a", "b"], "sensitivity": "confidential", "derived": ["ab"]}
        ]
    }))
    .unwrap();
    let p = ContextPolicy::compile(&spec).unwrap();
    let env = run(&p, &root(&p, "env-chain"), &[&["c"], &["a"], &["b"]]);
    assert_eq!(env.aggregate_sensitivity(), Sensitivity::TopSecret);
    assert_eq!(names(env.derived()), ["ab"]);
    assert_eq!(names(env.restrictions()), ["no_memory_write"]);
}

// ---------------------------------------------------------------------------
// The Python benchmark's workload, reproduced: same SplitMix64 stream, same
// digest lines. Warden's outcomes are mapped onto the reference's:
//   deny restricted_by:*          -> constrain, kind "restriction"
//   escalate sensitivity_floor    -> constrain, kind "floor"
//   escalate aggregation_backstop -> escalate
//   allow / constrain (context_*) -> allow
// with the one semantic difference made explicit: the reference also gates
// `memory_write` at the floor (constrain, "floor"); Warden's floor only
// covers export/external flows, so such steps are permitted here.
// Matching the reference digests shows the two agree everywhere else.
// ---------------------------------------------------------------------------

struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn weighted(&mut self, weights: &[u64]) -> usize {
        let r = self.below(weights.iter().sum());
        let mut acc = 0;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if acc > r {
                return i;
            }
        }
        unreachable!()
    }
}

const BENCH_LABELS: [(&str, u64); 12] = [
    ("public", 14),
    ("internal", 14),
    ("telemetry", 10),
    ("marketing", 8),
    ("contract", 8),
    ("behavioral", 8),
    ("location", 7),
    ("pii", 8),
    ("financial", 8),
    ("health", 5),
    ("biometric", 5),
    ("credentials", 5),
];
const BENCH_ACTIONS: [(&str, u64); 6] = [
    ("export", 20),
    ("delegate", 15),
    ("memory_write", 15),
    ("read", 20),
    ("summarize", 15),
    ("search", 15),
];
const BENCH_CHILD_RESTRICTIONS: [&str; 4] = [
    "no_external_export",
    "no_external_delegation",
    "no_memory_write",
    "no_print",
];

/// (outcome digest, child digest, outcome counts) of the reference workload.
fn reference_workload(steps: usize, workflows: usize) -> (String, String, BTreeMap<String, u64>) {
    use sha2::{Digest, Sha256};
    let p = bench_policy();
    let mut rng = SplitMix64(42 + steps as u64);
    let label_w: Vec<u64> = BENCH_LABELS.iter().map(|x| x.1).collect();
    let action_w: Vec<u64> = BENCH_ACTIONS.iter().map(|x| x.1).collect();
    let export_tags = ls(&["export"]);
    let agent = AgentId::parse("child").unwrap();
    let mut h = Sha256::new();
    let mut hc = Sha256::new();
    let mut counts = BTreeMap::new();
    for w in 0..workflows {
        let mut env = root(&p, &format!("env-{steps}-{w}"));
        for s in 0..steps {
            let k = 1 + rng.below(3) as usize;
            let mut labels: Vec<&str> = Vec::new();
            while labels.len() < k {
                let lab = BENCH_LABELS[rng.weighted(&label_w)].0;
                if !labels.contains(&lab) {
                    labels.push(lab);
                }
            }
            let action = BENCH_ACTIONS[rng.weighted(&action_w)].0;
            let d = rng.below(3) as usize;
            let mut declared: Vec<&str> = Vec::new();
            while declared.len() < d {
                let r = BENCH_CHILD_RESTRICTIONS[rng.below(4) as usize];
                if !declared.contains(&r) {
                    declared.push(r);
                }
            }

            env = env.fold(&p, &ls(&labels), &[]).unwrap().0;
            let dec = match action {
                "export" => decide(
                    &env,
                    &p,
                    &ContextRequest::Action(ActionRef {
                        name: "export",
                        tags: &export_tags,
                    }),
                ),
                "memory_write" => decide(
                    &env,
                    &p,
                    &ContextRequest::Action(ActionRef {
                        name: "memory.write",
                        tags: &[],
                    }),
                ),
                "delegate" => decide(
                    &env,
                    &p,
                    &ContextRequest::Delegation {
                        target: TrustZone::External,
                        delegatee_authority: &[],
                    },
                ),
                other => decide(
                    &env,
                    &p,
                    &ContextRequest::Action(ActionRef {
                        name: other,
                        tags: &[],
                    }),
                ),
            };
            let (outcome, kind) = match (dec.verdict, dec.reason.kind()) {
                (Verdict::Deny, reasons::RESTRICTED_BY) => ("constrain", "restriction"),
                (Verdict::Escalate, "sensitivity_floor") => ("constrain", "floor"),
                (Verdict::Escalate, "aggregation_backstop") => ("escalate", ""),
                (Verdict::Allow | Verdict::Constrain, _)
                    if action == "memory_write"
                        && dec.projected_sensitivity >= Sensitivity::Restricted =>
                {
                    ("constrain", "floor")
                }
                (Verdict::Allow | Verdict::Constrain, _) => ("allow", ""),
                other => panic!("unexpected {other:?}"),
            };
            let key = if kind.is_empty() {
                outcome.to_owned()
            } else {
                format!("{outcome}:{kind}")
            };
            *counts.entry(key).or_insert(0) += 1;
            let restrictions = names(env.restrictions()).join("|");
            let obligations = if outcome == "constrain" {
                names(dec.projected_restrictions.names()).join("|")
            } else {
                String::new()
            };
            h.update(format!(
                "{w},{s},{action},{outcome},{kind},{},{},{},{},{restrictions},{obligations}\n",
                dec.projected_sensitivity.rank(),
                env.aggregate_sensitivity().rank(),
                env.labels().len(),
                env.version() * 2, // the reference bumps twice per accumulate
            ));
            let (child, _) = env
                .delegate(
                    &p,
                    agent.clone(),
                    EnvelopeId::parse(&format!("env-{steps}-{w}:c{s}")).unwrap(),
                    &ls(&declared),
                    false,
                )
                .unwrap();
            hc.update(format!(
                "{w},{s},{}\n",
                names(child.restrictions()).join("|")
            ));
        }
    }
    (
        hex::encode(h.finalize()),
        hex::encode(hc.finalize()),
        counts,
    )
}

#[test]
fn the_reference_workload_digests_match_under_the_outcome_mapping() {
    // Digests printed by agt_envelope_bench.py (agent-governance-toolkit-core
    // 5.0.0) for seed 42.
    let (d, c, counts) = reference_workload(10, 100);
    assert_eq!(
        d,
        "1c4e53226169aa15734afb9b0e28addc7e82e0c38f649ba6fc0351020396382a"
    );
    assert_eq!(
        c,
        "f7bd7c446562b578e89e303c2695b298bbc1851472405af759a91182c604ad71"
    );
    assert_eq!(counts.values().sum::<u64>(), 1000);
    let (d, c, _) = reference_workload(10, 10_000);
    assert_eq!(
        d,
        "76f031c11dc1c91697b836cf2a8788f79f18beb6f1f3058462552492ce5ebde4"
    );
    assert_eq!(
        c,
        "19527ade5aee715431585c1aa2acab1221c54f15055202726945d65e131eb2fe"
    );
    let (d, c, _) = reference_workload(50, 2_000);
    assert_eq!(
        d,
        "179c6940c50ee049e1a2c71da6caba4a157f05af1d925b0b2d3cf5133ed35ab4"
    );
    assert_eq!(
        c,
        "7709125bcb197afac25b5999e1407f6bbcc54056f8e35e6d1bac3a6bb7463c85"
    );
}

#[test]
fn a_closed_envelope_is_reprojected_under_a_changed_rule_with_the_same_vocabulary() {
    // Same label, restriction and rule names (same vocabulary, so no
    // mismatch), different rule content: an envelope closed under A must
    // not be taken as closed under B.
    let spec = |needs: &[&str]| -> ContextPolicySpec {
        serde_json::from_value(serde_json::json!({
            "labels": {"pii": "confidential", "health": "confidential"},
            "aggregation_rules": [{"name": "r", "all_labels": needs, "sensitivity": "restricted",
                                   "restrict": ["no_memory_write"]}]
        }))
        .unwrap()
    };
    let a = ContextPolicy::compile(&spec(&["pii", "health"])).unwrap();
    let b = ContextPolicy::compile(&spec(&["pii"])).unwrap();
    assert_eq!(a.vocabulary_fingerprint(), b.vocabulary_fingerprint());
    let env = run(&a, &root(&a, "env-cache"), &[&["pii"]]);
    assert_eq!(act(&env, &a, "memory.write", &[]).verdict, Verdict::Allow);
    let d = act(&env, &b, "memory.write", &[]);
    assert_eq!(d.reason.as_str(), "restricted_by:no_memory_write");
    assert_eq!(d.projected_sensitivity, Sensitivity::Restricted);
    let (next, t) = env.fold(&b, &[], &[]).unwrap();
    assert_eq!(names(next.restrictions()), ["no_memory_write"]);
    assert_eq!(names(t.rules_applied()), ["r"]);
}
