use super::*;
use crate::decision::reasons;
use serde_json::json;

fn id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

fn rec(owner: &str, value: Value, vis: Visibility, class: RecordClass) -> MemoryRecord {
    MemoryRecord {
        namespace: Namespace::parse("ns").unwrap(),
        key: Key::parse("k").unwrap(),
        value,
        owner: id(owner),
        visibility: vis,
        class,
        revision: 1,
        created_at: Timestamp(0),
        updated_at: Timestamp(0),
    }
}

fn run<'r>(reader: &str, lineage: &[&str], records: &'r [MemoryRecord]) -> Resolution<'r> {
    let ids: Vec<AgentId> = lineage.iter().map(|s| id(s)).collect();
    resolve(
        &id(reader),
        ids.iter(),
        |owner| records.iter().find(|r| &r.owner == owner),
        Timestamp(100),
    )
}

#[test]
fn nearest_visible_wins_and_keeps_owner() {
    let records = vec![
        rec(
            "root",
            json!("EU"),
            Visibility::Descendants,
            RecordClass::Preference,
        ),
        rec(
            "mid",
            json!("US"),
            Visibility::Children,
            RecordClass::Preference,
        ),
    ];
    match run("leaf", &["leaf", "mid", "root"], &records) {
        Resolution::Found { record, reason } => {
            assert_eq!(record.owner.as_str(), "mid");
            assert_eq!(reason.as_str(), "visible_from:mid");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn children_visibility_is_direct_children_only() {
    let records = vec![rec(
        "root",
        json!(1),
        Visibility::Children,
        RecordClass::Preference,
    )];
    assert!(matches!(
        run("mid", &["mid", "root"], &records),
        Resolution::Found { .. }
    ));
    match run("leaf", &["leaf", "mid", "root"], &records) {
        Resolution::Denied { reason } => assert_eq!(reason.as_str(), "not_visible_from:root"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn policy_cannot_be_shadowed_or_loosened() {
    let records = vec![
        rec(
            "root",
            json!(false),
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::All,
            },
        ),
        rec(
            "leaf",
            json!(true),
            Visibility::Private,
            RecordClass::Preference,
        ),
    ];
    match run("leaf", &["leaf", "root"], &records) {
        Resolution::Combined {
            value,
            contributors,
            ..
        } => {
            assert_eq!(value, json!(false));
            assert_eq!(contributors.len(), 1);
            assert_eq!(contributors[0].owner_agent_id.as_str(), "root");
        }
        other => panic!("{other:?}"),
    }
    // A child's own policy record with a looser combinator is combined
    // under the root's combinator.
    let records = vec![
        rec(
            "root",
            json!(false),
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::All,
            },
        ),
        rec(
            "leaf",
            json!(true),
            Visibility::Private,
            RecordClass::Policy {
                combine: Combinator::Any,
            },
        ),
    ];
    match run("leaf", &["leaf", "root"], &records) {
        Resolution::Combined {
            value,
            combinator,
            contributors,
            reason,
        } => {
            assert_eq!(value, json!(false));
            assert_eq!(combinator, Combinator::All);
            assert_eq!(contributors.len(), 2);
            assert_eq!(reason.as_str(), "combined_from:leaf+root");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn combinators() {
    let p = |owner: &str, v: Value, c| {
        rec(
            owner,
            v,
            Visibility::Descendants,
            RecordClass::Policy { combine: c },
        )
    };
    let value = |records: &[MemoryRecord]| match run("b", &["b", "a"], records) {
        Resolution::Combined { value, .. } => value,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        value(&[
            p("a", json!(30), Combinator::Min),
            p("b", json!(7), Combinator::Min)
        ]),
        json!(7)
    );
    assert_eq!(
        value(&[
            p("a", json!(30), Combinator::Min),
            p("b", json!(90), Combinator::Min)
        ]),
        json!(30)
    );
    assert_eq!(
        value(&[
            p("a", json!(3.5), Combinator::Max),
            p("b", json!(2), Combinator::Max)
        ]),
        json!(3.5)
    );
    assert_eq!(
        value(&[
            p("a", json!(["x", "y", "z"]), Combinator::Intersection),
            p("b", json!(["z", "x", "w"]), Combinator::Intersection)
        ]),
        json!(["x", "z"])
    );
    assert_eq!(
        value(&[
            p("a", json!(false), Combinator::Any),
            p("b", json!(true), Combinator::Any)
        ]),
        json!(true)
    );
    match run(
        "b",
        &["b", "a"],
        &[
            p("a", json!(1), Combinator::Min),
            p("b", json!("x"), Combinator::Min),
        ],
    ) {
        Resolution::Denied { reason } => assert_eq!(reason.as_str(), "policy_type_mismatch:b"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn secrets_are_owner_or_grant_only() {
    let records = vec![rec(
        "root",
        json!("token"),
        Visibility::Private,
        RecordClass::Secret {
            grants: vec![id("granted")],
        },
    )];
    match run("mid", &["mid", "root"], &records) {
        Resolution::Denied { reason } => assert_eq!(reason.as_str(), "not_visible_from:root"),
        other => panic!("{other:?}"),
    }
    match run("granted", &["granted", "root"], &records) {
        Resolution::Found { reason, .. } => assert_eq!(reason.as_str(), "secret_granted"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        run("root", &["root"], &records),
        Resolution::Found { .. }
    ));
}

#[test]
fn expired_task_state_does_not_resolve() {
    let records = vec![rec(
        "a",
        json!(1),
        Visibility::Private,
        RecordClass::Task {
            expires_at: Some(Timestamp(50)),
        },
    )];
    match run("a", &["a"], &records) {
        Resolution::Denied { reason } => assert_eq!(reason.as_str(), "record_expired"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn index_switches_to_a_map_and_keeps_counts() {
    let mut idx = MemoryIndex::new();
    for i in 0..40 {
        idx.insert(rec(
            &format!("o{i}"),
            json!(i),
            Visibility::Private,
            RecordClass::Preference,
        ));
    }
    idx.insert(rec(
        "o3",
        json!("again"),
        Visibility::Private,
        RecordClass::Preference,
    ));
    assert_eq!(idx.len(), 40);
    assert_eq!(idx.get("o3", "ns", "k").unwrap().value, json!("again"));
    assert_eq!(idx.get("o39", "ns", "k").unwrap().value, json!(39));
    assert!(idx.remove("o39", "ns", "k").is_some());
    assert!(idx.get("o39", "ns", "k").is_none());
    assert_eq!(idx.len(), 39);
    assert_eq!(idx.iter().count(), 39);
    assert!(idx.view("ns", "other").get("o1").is_none());
}

proptest::proptest! {
    /// Stopping once every record of the key has been met never
    /// changes the answer.
    #[test]
    fn bounded_resolve_agrees_with_the_full_walk(
        depth in 1usize..12,
        recs in proptest::collection::vec((0usize..16, 0u8..3, 0u8..4, proptest::bool::ANY), 0..10),
        reader_at in 0usize..12,
    ) {
        let lineage: Vec<AgentId> = (0..depth).map(|i| id(&format!("a{i}"))).collect();
        let mut records: Vec<MemoryRecord> = Vec::new();
        for (owner, vis, class, flag) in recs {
            // Owners 0..depth sit on the lineage, the rest off it.
            let owner = format!("a{owner}");
            if records.iter().any(|r| r.owner.as_str() == owner) {
                continue;
            }
            let vis = [Visibility::Private, Visibility::Children, Visibility::Descendants][vis as usize];
            let (class, value) = match class {
                0 => (RecordClass::Preference, json!(1)),
                1 => (RecordClass::Policy { combine: if flag { Combinator::All } else { Combinator::Any } }, json!(flag)),
                2 => (RecordClass::Secret { grants: vec![id("a0")] }, json!("s")),
                _ => (RecordClass::Task { expires_at: Some(Timestamp(if flag { 50 } else { 500 })) }, json!(2)),
            };
            let vis = if matches!(class, RecordClass::Secret { .. } | RecordClass::Task { .. }) { Visibility::Private } else { vis };
            records.push(rec(&owner, value, vis, class));
        }
        let start = reader_at.min(depth - 1);
        let walk = &lineage[start..];
        let reader = &walk[0];
        let lookup = |o: &AgentId| records.iter().find(|r| &r.owner == o);
        let full = resolve(reader, walk.iter(), lookup, Timestamp(100));
        let bounded = resolve_bounded(reader, walk.iter(), lookup, Timestamp(100), records.len());
        proptest::prop_assert_eq!(full, bounded);
    }
}

#[test]
fn puts_check_owner_and_revision() {
    let put = Put {
        owner: id("a"),
        namespace: Namespace::parse("ns").unwrap(),
        key: Key::parse("k").unwrap(),
        value: json!(1),
        expected_revision: None,
        visibility: None,
        class: None,
    };
    assert_eq!(
        check_write(&id("b"), &put),
        Err(reasons::ACTOR_IS_NOT_OWNER)
    );
    assert_eq!(check_write(&id("a"), &put), Ok(()));
    let created = apply_put(None, &put, Timestamp(1)).unwrap();
    assert_eq!(created.revision, 1);
    let stale = Put {
        expected_revision: Some(5),
        ..put.clone()
    };
    assert_eq!(
        apply_put(Some(&created), &stale, Timestamp(2)),
        Err(PutRejection::Conflict { current: Some(1) })
    );
    let create_only = Put {
        expected_revision: Some(0),
        ..put.clone()
    };
    let refused = apply_put(Some(&created), &create_only, Timestamp(2)).unwrap_err();
    assert_eq!(refused, PutRejection::Conflict { current: Some(1) });
    assert_eq!(refused.reason(), reasons::REVISION_CONFLICT);
    let next = apply_put(Some(&created), &put, Timestamp(2)).unwrap();
    assert_eq!(next.revision, 2);
    assert_eq!(next.created_at, Timestamp(1));
}
