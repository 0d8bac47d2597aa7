//! The Python reference's canonical streams (agt_envelope_bench.py), with the
//! mapping of outcomes. Python: CONSTRAIN(restriction) ~ Warden deny
//! restricted_by; CONSTRAIN(floor) ~ escalate sensitivity_floor; ALLOW ~
//! allow or constrain (Warden constrains whenever obligations exist).

use super::*;

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
