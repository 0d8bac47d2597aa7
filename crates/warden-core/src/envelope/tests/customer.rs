//! The customer example of the design document.

use super::*;

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
