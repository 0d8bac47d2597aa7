use super::*;
use crate::capability::CapSet;
use crate::decision::reasons;
use crate::hierarchy::{AgentSpec, Hierarchy, HierarchyLimits};
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

fn at(owner: &str, namespace: &str, key: &str, v: i64) -> MemoryRecord {
    let mut r = rec(
        owner,
        json!(v),
        Visibility::Private,
        RecordClass::Preference,
    );
    r.namespace = Namespace::parse(namespace).unwrap();
    r.key = Key::parse(key).unwrap();
    r
}

#[test]
fn a_namespace_and_key_are_one_lookup_and_never_run_together() {
    let mut idx = MemoryIndex::new();
    idx.insert(at("o", "ab", "c", 1));
    idx.insert(at("o", "a", "bc", 2));
    idx.insert(at("o", "abc", "d", 3));
    assert_eq!(idx.get("o", "ab", "c").unwrap().value, json!(1));
    assert_eq!(idx.get("o", "a", "bc").unwrap().value, json!(2));
    assert!(idx.get("o", "abc", "").is_none());
    assert!(idx.get("o", "ab", "bc").is_none());
    assert_eq!(idx.len(), 3);
    assert!(idx.remove("o", "ab", "c").is_some());
    assert!(idx.get("o", "ab", "c").is_none());
    assert_eq!(idx.get("o", "a", "bc").unwrap().value, json!(2));
    assert_eq!(idx.len(), 2);
}

proptest::proptest! {
    /// The index answers like a map from (owner, namespace, key) over any
    /// sequence of inserts and removes, past the table's growth and the
    /// switch of a key's owners from a vector to a map.
    #[test]
    fn the_index_answers_like_a_map_of_triples(
        ops in proptest::collection::vec((proptest::bool::ANY, 0u8..24, 0u8..6, 0u8..40, 0i64..5), 0..300),
    ) {
        let mut idx = MemoryIndex::new();
        let mut model = std::collections::BTreeMap::new();
        for (put, owner, ns, key, v) in ops {
            let (o, n, k) = (format!("o{owner}"), format!("n{ns}"), format!("k{key}"));
            if put {
                idx.insert(at(&o, &n, &k, v));
                model.insert((o, n, k), v);
            } else {
                let removed = idx.remove(&o, &n, &k).map(|r| r.value);
                proptest::prop_assert_eq!(removed, model.remove(&(o, n, k)).map(|v| json!(v)));
            }
            proptest::prop_assert_eq!(idx.len(), model.len());
        }
        for ((o, n, k), v) in &model {
            proptest::prop_assert_eq!(idx.get(o, n, k).map(|r| r.value.clone()), Some(json!(v)));
        }
        proptest::prop_assert_eq!(idx.iter().count(), model.len());
        for r in idx.iter() {
            let triple = (r.owner.to_string(), r.namespace.to_string(), r.key.to_string());
            proptest::prop_assert!(model.contains_key(&triple));
        }
    }

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

fn hierarchy(agents: &[(&str, Option<&str>)]) -> Hierarchy {
    let mut h = Hierarchy::new(
        CapSet::new(),
        CapSet::new(),
        HierarchyLimits { max_depth: 128 },
    );
    for (agent, parent) in agents {
        let spec = AgentSpec {
            id: id(agent),
            parent: parent.map(id),
            capabilities: Default::default(),
        };
        h.register(&spec, &|_| None).unwrap();
    }
    h
}

/// `resolve_in` for `reader`, checked against `resolve_bounded` along its
/// lineage.
fn run_in<'r>(h: &Hierarchy, reader: &str, index: &'r MemoryIndex) -> Resolution<'r> {
    let idx = h.index_of(reader).unwrap();
    let view = index.view("ns", "k");
    let got = resolve_in(h, idx, view, Timestamp(100));
    let walked = resolve_bounded(
        &id(reader),
        h.lineage(idx).map(|(_, n)| n.id()),
        |o| view.get(o.as_str()),
        Timestamp(100),
        view.len(),
    );
    assert_eq!(got, walked, "reader {reader}");
    assert_eq!(
        resolve_for(h, &id(reader), view, Timestamp(100)),
        got,
        "reader {reader}"
    );
    got
}

fn index(records: impl IntoIterator<Item = MemoryRecord>) -> MemoryIndex {
    let mut idx = MemoryIndex::new();
    for r in records {
        idx.insert(r);
    }
    idx
}

/// `root → a0 → … → a39`, plus `side` under `root`.
fn deep() -> Hierarchy {
    let names: Vec<String> = (0..40).map(|i| format!("a{i}")).collect();
    let mut agents: Vec<(&str, Option<&str>)> = vec![("root", None), ("side", Some("root"))];
    for (i, n) in names.iter().enumerate() {
        let parent = if i == 0 {
            "root"
        } else {
            names[i - 1].as_str()
        };
        agents.push((n.as_str(), Some(parent)));
    }
    hierarchy(&agents)
}

#[test]
fn resolve_in_ignores_records_off_the_lineage() {
    let h = deep();
    let idx = index([
        rec(
            "side",
            json!(1),
            Visibility::Descendants,
            RecordClass::Preference,
        ),
        rec(
            "ghost",
            json!(2),
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::Max,
            },
        ),
        rec(
            "a39",
            json!(3),
            Visibility::Descendants,
            RecordClass::Preference,
        ),
    ]);
    assert_eq!(run_in(&h, "a20", &idx), Resolution::NotFound);
    assert_eq!(run_in(&h, "root", &idx), Resolution::NotFound);
    match run_in(&h, "side", &idx) {
        Resolution::Found { record, .. } => assert_eq!(record.owner.as_str(), "side"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn resolve_in_denies_the_readers_expired_record_unless_a_live_one_is_above() {
    let h = deep();
    let expired = rec(
        "a30",
        json!(1),
        Visibility::Private,
        RecordClass::Task {
            expires_at: Some(Timestamp(50)),
        },
    );
    let idx = index([expired.clone()]);
    match run_in(&h, "a30", &idx) {
        Resolution::Denied { reason } => assert_eq!(reason.as_str(), "record_expired"),
        other => panic!("{other:?}"),
    }
    // Someone else's expired record is simply absent.
    assert_eq!(run_in(&h, "a31", &idx), Resolution::NotFound);
    let idx = index([
        expired,
        rec(
            "root",
            json!(2),
            Visibility::Descendants,
            RecordClass::Preference,
        ),
    ]);
    match run_in(&h, "a30", &idx) {
        Resolution::Found { record, reason } => {
            assert_eq!(record.owner.as_str(), "root");
            assert_eq!(reason.as_str(), "visible_from:root");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn resolve_in_combines_policy_across_levels_nearest_first() {
    let h = deep();
    let p = |owner: &str, v: Value, vis| {
        rec(
            owner,
            v,
            vis,
            RecordClass::Policy {
                combine: Combinator::Intersection,
            },
        )
    };
    // Inserted root first, so the key's own order is not lineage order.
    let idx = index([
        p("root", json!(["w", "x", "y", "z"]), Visibility::Descendants),
        p("a35", json!(["x", "z"]), Visibility::Children),
        p("side", json!([]), Visibility::Descendants),
        rec(
            "a36",
            json!(["w"]),
            Visibility::Private,
            RecordClass::Preference,
        ),
        p("a3", json!(["z", "x", "w"]), Visibility::Descendants),
    ]);
    match run_in(&h, "a36", &idx) {
        Resolution::Combined {
            value,
            combinator,
            contributors,
            reason,
        } => {
            assert_eq!(value, json!(["x", "z"]));
            assert_eq!(combinator, Combinator::Intersection);
            let owners: Vec<&str> = contributors
                .iter()
                .map(|c| c.owner_agent_id.as_str())
                .collect();
            assert_eq!(owners, ["a35", "a3", "root"]);
            assert_eq!(reason.as_str(), "combined_from:a35+a3+root");
        }
        other => panic!("{other:?}"),
    }
    // Two levels below `a35`, its `children` record no longer contributes.
    match run_in(&h, "a37", &idx) {
        Resolution::Combined { reason, .. } => {
            assert_eq!(reason.as_str(), "combined_from:a3+root");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn resolve_in_grants_secrets() {
    let h = deep();
    let idx = index([rec(
        "a2",
        json!("token"),
        Visibility::Descendants,
        RecordClass::Secret {
            grants: vec![id("a39"), id("side")],
        },
    )]);
    match run_in(&h, "a39", &idx) {
        Resolution::Found { record, reason } => {
            assert_eq!(record.owner.as_str(), "a2");
            assert_eq!(reason.as_str(), "secret_granted");
        }
        other => panic!("{other:?}"),
    }
    match run_in(&h, "a38", &idx) {
        Resolution::Denied { reason } => assert_eq!(reason.as_str(), "not_visible_from:a2"),
        other => panic!("{other:?}"),
    }
    // A grant does not reach an agent off the owner's lineage.
    assert_eq!(run_in(&h, "side", &idx), Resolution::NotFound);
    match run_in(&h, "a2", &idx) {
        Resolution::Found { reason, .. } => assert_eq!(reason.as_str(), "visible_from:a2"),
        other => panic!("{other:?}"),
    }
}

/// One random record: (owner, visibility, class, flag, grant, value).
type RandomRecord = (usize, u8, u8, bool, usize, u8);

fn random_record((owner, vis, class, flag, grant, v): RandomRecord) -> MemoryRecord {
    let vis = [
        Visibility::Private,
        Visibility::Children,
        Visibility::Descendants,
    ][usize::from(vis % 3)];
    let policy = |combine: Combinator| {
        // Mostly the combinator's type; now and then a mismatch.
        let value = match (combine, v % 8) {
            (_, 0) => json!("mismatch"),
            (Combinator::All | Combinator::Any, _) => json!(v % 2 == 0),
            (Combinator::Min | Combinator::Max, _) if v % 3 == 0 => json!(f64::from(v) / 4.0),
            (Combinator::Min | Combinator::Max, _) => json!(v),
            (Combinator::Intersection, _) => {
                json!((0..4u8).filter(|b| v & (1 << b) != 0).collect::<Vec<_>>())
            }
        };
        (RecordClass::Policy { combine }, value)
    };
    let (class, value) = match class % 10 {
        0 | 1 => (RecordClass::Preference, json!(v)),
        2 => policy(Combinator::All),
        3 => policy(Combinator::Any),
        4 => policy(if flag {
            Combinator::Min
        } else {
            Combinator::Max
        }),
        5 => policy(Combinator::Intersection),
        6 | 7 => (
            RecordClass::Secret {
                grants: if flag {
                    vec![id(&format!("a{grant}"))]
                } else {
                    vec![id(&format!("a{grant}")), id(&format!("a{}", grant / 2))]
                },
            },
            json!("s"),
        ),
        _ => (
            RecordClass::Task {
                expires_at: match v % 3 {
                    0 => None,
                    1 => Some(Timestamp(50)),
                    _ => Some(Timestamp(500)),
                },
            },
            json!(v),
        ),
    };
    let mut r = rec(&format!("a{owner}"), value, vis, class);
    r.revision = u64::from(v);
    r
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]

    /// Visiting the key's records gives exactly the lineage walk's answer,
    /// for every reader of a random forest (deep chains and wide fans) and
    /// random records on and off each reader's lineage.
    #[test]
    fn resolve_in_agrees_with_the_lineage_walk(
        // Agent `i + 1`: a root (0), under agent `i` (1..=28: long chains,
        // depths up to about 90) or under a random earlier agent (fans).
        shape in proptest::collection::vec((0u8..32, proptest::num::usize::ANY), 0..100),
        // Owners past the last agent are not in the hierarchy; over 16
        // distinct owners the key's records move to a map.
        recs in proptest::collection::vec(
            (0usize..100, 0u8..3, 0u8..10, proptest::bool::ANY, 0usize..100, proptest::num::u8::ANY),
            0..28,
        ),
    ) {
        let names: Vec<String> = (0..=shape.len()).map(|i| format!("a{i}")).collect();
        let mut agents: Vec<(&str, Option<&str>)> = vec![(names[0].as_str(), None)];
        for (i, (kind, raw)) in shape.iter().enumerate() {
            let parent = match kind {
                0 => None,
                1..=28 => Some(names[i].as_str()),
                _ => Some(names[raw % (i + 1)].as_str()),
            };
            agents.push((names[i + 1].as_str(), parent));
        }
        let h = hierarchy(&agents);
        let idx = index(recs.into_iter().map(random_record));
        let view = idx.view("ns", "k");
        let now = Timestamp(100);
        for (reader, node) in h.iter() {
            let lineage = h.lineage(reader).map(|(_, n)| n.id());
            let lookup = |o: &AgentId| view.get(o.as_str());
            let walked = resolve_bounded(node.id(), lineage.clone(), lookup, now, view.len());
            let full = resolve(node.id(), lineage, lookup, now);
            proptest::prop_assert_eq!(&walked, &full);
            let got = resolve_in(&h, reader, view, now);
            proptest::prop_assert_eq!(&got, &walked, "reader {} at depth {}", node.id(), node.depth());
            let by_id = resolve_for(&h, node.id(), view, now);
            proptest::prop_assert_eq!(by_id, walked, "resolve_for, reader {}", node.id());
        }
    }
}

#[test]
fn resolve_for_a_reader_nobody_registered_finds_nothing() {
    let h = hierarchy(&[("root", None), ("child", Some("root"))]);
    let idx = index([rec(
        "root",
        json!(1),
        Visibility::Descendants,
        RecordClass::Preference,
    )]);
    let view = idx.view("ns", "k");
    assert!(matches!(
        resolve_for(&h, &id("child"), view, Timestamp(100)),
        Resolution::Found { .. }
    ));
    for nobody in ["childx", "chil", "Child", "root-2"] {
        assert_eq!(
            resolve_for(&h, &id(nobody), view, Timestamp(100)),
            Resolution::NotFound
        );
    }
}

#[test]
fn key_view_iterates_its_records() {
    let few = index((0..3).map(|i| {
        rec(
            &format!("o{i}"),
            json!(i),
            Visibility::Private,
            RecordClass::Preference,
        )
    }));
    let many = index((0..40).map(|i| {
        rec(
            &format!("o{i}"),
            json!(i),
            Visibility::Private,
            RecordClass::Preference,
        )
    }));
    for (idx, n) in [(&few, 3), (&many, 40)] {
        let view = idx.view("ns", "k");
        assert_eq!(view.iter().len(), n);
        let mut owners: Vec<&str> = view.into_iter().map(|r| r.owner.as_str()).collect();
        owners.sort_unstable();
        owners.dedup();
        assert_eq!(owners.len(), n);
    }
    assert_eq!(few.view("ns", "other").iter().count(), 0);
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
