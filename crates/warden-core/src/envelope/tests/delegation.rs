//! Delegation and authority.

use super::*;

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
