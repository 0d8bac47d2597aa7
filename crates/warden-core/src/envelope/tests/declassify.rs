//! Declassification.

use super::*;

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
