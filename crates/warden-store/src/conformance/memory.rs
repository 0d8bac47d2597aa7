//! Memory records: compare-and-set, classes, reads, deletes, usage.

use super::*;

/// Every record class and visibility round-trips, with its JSON value.
pub async fn put_create_and_get_every_class<S: Store>(store: S) {
    let value = json!({
        "text": "héllo \"wörld\"\n\u{1F600} nul:\u{0} esc:\u{E000}",
        "big": u64::MAX,
        "neg": i64::MIN,
        "float": 0.1,
        "huge": 1e300,
        "list": [1, 2.5, null, true, {"k": []}],
    });
    let classes = [
        (
            "pref",
            Visibility::Descendants,
            RecordClass::Preference,
            value.clone(),
        ),
        (
            "pol",
            Visibility::Children,
            RecordClass::Policy {
                combine: Combinator::All,
            },
            json!(false),
        ),
        (
            "min",
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::Min,
            },
            json!(30),
        ),
        (
            "set",
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::Intersection,
            },
            json!(["a", "b"]),
        ),
        (
            "sec",
            Visibility::Private,
            RecordClass::Secret {
                grants: vec![id("b"), id("c")],
            },
            json!("s3cr3t"),
        ),
        (
            "task",
            Visibility::Private,
            RecordClass::Task {
                expires_at: Some(Timestamp(5_000)),
            },
            json!(1),
        ),
        (
            "task2",
            Visibility::Private,
            RecordClass::Task { expires_at: None },
            json!(null),
        ),
    ];
    for (i, (k, vis, class, v)) in classes.iter().enumerate() {
        let p = Put {
            visibility: Some(*vis),
            class: Some(class.clone()),
            ..put("owner", "ns", k, v.clone(), None)
        };
        let outcome = store
            .put_record(
                p,
                Timestamp(100 + i as i64),
                crate::StorageQuota::default(),
                put_audit("owner", k, i as u64),
            )
            .await
            .unwrap();
        let PutOutcome::Written { record, created } = outcome else {
            panic!("{k}: {outcome:?}");
        };
        assert!(created);
        let expected = MemoryRecord {
            namespace: ns("ns"),
            key: key(k),
            value: v.clone(),
            owner: id("owner"),
            visibility: *vis,
            class: class.clone(),
            revision: 1,
            created_at: Timestamp(100 + i as i64),
            updated_at: Timestamp(100 + i as i64),
        };
        assert_eq!(record, expected);
        assert_eq!(get_one(&store, "owner", "ns", k).await, Some(expected));
    }
    // Defaults on create: private preference.
    store
        .put_record(
            put("owner", "ns", "plain", json!(1), None),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("owner", "plain", 99),
        )
        .await
        .unwrap();
    let plain = get_one(&store, "owner", "ns", "plain").await.unwrap();
    assert_eq!(
        (plain.visibility, plain.class),
        (Visibility::Private, RecordClass::Preference)
    );
    let entries = audit_all(&store).await;
    assert_eq!(entries.len(), classes.len() + 1);
    assert!(entries.iter().all(|e| e.draft.verdict == Verdict::Allow));
    assert_chain(&store).await;
}

/// `Some(0)` creates only: a second create-only put conflicts, is audited
/// as a conflict, and leaves the record unchanged.
pub async fn put_create_only<S: Store>(store: S) {
    let first = store
        .put_record(
            put("a", "ns", "k", json!("first"), Some(0)),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 1),
        )
        .await
        .unwrap();
    assert!(
        matches!(first, PutOutcome::Written { created: true, ref record } if record.revision == 1)
    );
    let second = store
        .put_record(
            put("a", "ns", "k", json!("second"), Some(0)),
            Timestamp(2),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 2),
        )
        .await
        .unwrap();
    assert_eq!(second, PutOutcome::Conflict { current: Some(1) });
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision, stored.updated_at),
        (json!("first"), 1, Timestamp(1))
    );
    let entries = audit_all(&store).await;
    let verdicts: Vec<(Verdict, &str)> = entries
        .iter()
        .map(|e| (e.draft.verdict, e.draft.reason.as_str()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (Verdict::Allow, "owner_write"),
            (Verdict::Deny, "revision_conflict")
        ]
    );
    assert_eq!(entries[1].draft.details, json!({"tag": 2, "current": 1}));
    assert_chain(&store).await;
}

/// A stale expected revision conflicts and reports the current one; an
/// expected revision on a missing record conflicts with `None`.
pub async fn put_stale_revision_conflicts<S: Store>(store: S) {
    let w = |v, e, t, tag| {
        store.put_record(
            put("a", "ns", "k", v, e),
            Timestamp(t),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", tag),
        )
    };
    assert!(matches!(
        w(json!(1), Some(0), 1, 1).await.unwrap(),
        PutOutcome::Written { .. }
    ));
    match w(json!(2), Some(1), 2, 2).await.unwrap() {
        PutOutcome::Written { record, created } => {
            assert!(!created);
            assert_eq!(
                (record.revision, record.created_at, record.updated_at),
                (2, Timestamp(1), Timestamp(2))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        w(json!(3), Some(1), 3, 3).await.unwrap(),
        PutOutcome::Conflict { current: Some(2) }
    );
    assert_eq!(
        w(json!(4), Some(3), 4, 4).await.unwrap(),
        PutOutcome::Conflict { current: Some(2) }
    );
    let missing = store
        .put_record(
            put("a", "ns", "other", json!(0), Some(7)),
            Timestamp(5),
            crate::StorageQuota::default(),
            put_audit("a", "ns.other", 5),
        )
        .await
        .unwrap();
    assert_eq!(missing, PutOutcome::Conflict { current: None });
    assert_eq!(get_one(&store, "a", "ns", "other").await, None);
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!((stored.value, stored.revision), (json!(2), 2));
    let verdicts: Vec<Verdict> = audit_all(&store)
        .await
        .iter()
        .map(|e| e.draft.verdict)
        .collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Deny,
            Verdict::Deny,
            Verdict::Deny
        ]
    );
    assert_chain(&store).await;
}

/// `None` writes unconditionally, keeps class, visibility and creation time
/// unless given, and counts revisions up.
pub async fn put_unconditional<S: Store>(store: S) {
    let p = Put {
        visibility: Some(Visibility::Descendants),
        class: Some(RecordClass::Policy {
            combine: Combinator::Max,
        }),
        ..put("a", "ns", "k", json!(1), None)
    };
    store
        .put_record(
            p,
            Timestamp(10),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 1),
        )
        .await
        .unwrap();
    for i in 2..=4 {
        let outcome = store
            .put_record(
                put("a", "ns", "k", json!(i), None),
                Timestamp(10 * i),
                crate::StorageQuota::default(),
                put_audit("a", "ns.k", i as u64),
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, PutOutcome::Written { created: false, ref record } if record.revision == i as u64)
        );
    }
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!(stored.value, json!(4));
    assert_eq!(stored.revision, 4);
    assert_eq!(stored.visibility, Visibility::Descendants);
    assert_eq!(
        stored.class,
        RecordClass::Policy {
            combine: Combinator::Max
        }
    );
    assert_eq!(
        (stored.created_at, stored.updated_at),
        (Timestamp(10), Timestamp(40))
    );
    let p = Put {
        visibility: Some(Visibility::Private),
        class: Some(RecordClass::Preference),
        ..put("a", "ns", "k", json!("x"), Some(4))
    };
    store
        .put_record(
            p,
            Timestamp(50),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 5),
        )
        .await
        .unwrap();
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.visibility, stored.class, stored.revision),
        (Visibility::Private, RecordClass::Preference, 5)
    );
    assert_eq!(head_count(&store).await, 5);
    assert_chain(&store).await;
}

/// A put whose result is invalid for its class is `Rejected` with the
/// core's reason, audited through the `AuditFn`, and changes nothing.
pub async fn put_class_rejection<S: Store>(store: S) {
    let p = Put {
        visibility: Some(Visibility::Descendants),
        class: Some(RecordClass::Policy {
            combine: Combinator::All,
        }),
        ..put("a", "policy", "upload", json!(false), Some(0))
    };
    store
        .put_record(
            p,
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("a", "policy.upload", 1),
        )
        .await
        .unwrap();
    // Keeping the class, the new value must still fit the combinator.
    let outcome = store
        .put_record(
            put("a", "policy", "upload", json!(5), Some(1)),
            Timestamp(2),
            crate::StorageQuota::default(),
            put_audit("a", "policy.upload", 2),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        PutOutcome::Rejected {
            reason: format!("{INVALID_RECORD}:policy_value_does_not_fit_combinator")
        }
    );
    let stored = get_one(&store, "a", "policy", "upload").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision, stored.updated_at),
        (json!(false), 1, Timestamp(1))
    );
    // A secret may not be created visible to others.
    let p = Put {
        visibility: Some(Visibility::Children),
        class: Some(RecordClass::Secret { grants: vec![] }),
        ..put("a", "credentials", "token", json!("x"), None)
    };
    let outcome = store
        .put_record(
            p,
            Timestamp(3),
            crate::StorageQuota::default(),
            put_audit("a", "credentials.token", 3),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        PutOutcome::Rejected {
            reason: format!("{INVALID_RECORD}:class_is_private_only")
        }
    );
    assert_eq!(get_one(&store, "a", "credentials", "token").await, None);
    let entries = audit_all(&store).await;
    let reasons: Vec<(Verdict, &str)> = entries
        .iter()
        .map(|e| (e.draft.verdict, e.draft.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            (Verdict::Allow, "owner_write"),
            (
                Verdict::Deny,
                "invalid_record:policy_value_does_not_fit_combinator"
            ),
            (Verdict::Deny, "invalid_record:class_is_private_only"),
        ]
    );
    assert_chain(&store).await;
}

/// [`RACE_WRITERS`] concurrent writers with the same expected revision:
/// exactly one is written, the others conflict, the stored value is the
/// winner's and every attempt is audited with its own outcome.
pub async fn put_race_one_winner<S: Store>(store: S) {
    let store = Arc::new(store);
    store
        .put_record(
            put("a", "ns", "k", json!("start"), Some(0)),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 1000),
        )
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = store
                .put_record(
                    put("a", "ns", "k", json!({"writer": i}), Some(1)),
                    Timestamp(2),
                    crate::StorageQuota::default(),
                    put_audit("a", "ns.k", i as u64),
                )
                .await
                .unwrap();
            (i, outcome)
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            (i, PutOutcome::Written { record, created }) => {
                assert!(!created);
                assert_eq!(record.revision, 2);
                winners.push(i);
            }
            (_, PutOutcome::Conflict { current }) => {
                assert_eq!(current, Some(2));
                conflicts += 1;
            }
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(conflicts, RACE_WRITERS - 1);
    let winner = winners[0];
    let stored = get_one(&*store, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision),
        (json!({"writer": winner}), 2)
    );
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len(), RACE_WRITERS + 1);
    let allowed: Vec<&AuditEntry> = entries
        .iter()
        .skip(1)
        .filter(|e| e.draft.verdict == Verdict::Allow)
        .collect();
    assert_eq!(allowed.len(), 1);
    assert_eq!(allowed[0].draft.details["tag"], json!(winner));
    let mut tags: Vec<u64> = entries
        .iter()
        .skip(1)
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..RACE_WRITERS as u64).collect::<Vec<_>>());
    assert_chain(&*store).await;
}

/// Records come back for the listed owners only, in their order, and only
/// at the exact namespace and key.
pub async fn get_records_by_owner<S: Store>(store: S) {
    for (owner, namespace, k) in [
        ("a", "ns", "k"),
        ("b", "ns", "k"),
        ("c", "ns", "other"),
        ("c", "other", "k"),
        ("d", "ns", "k"),
    ] {
        store
            .put_record(
                put(owner, namespace, k, json!(owner), None),
                Timestamp(1),
                crate::StorageQuota::default(),
                put_audit(owner, k, 0),
            )
            .await
            .unwrap();
    }
    let owners = |got: Vec<MemoryRecord>| {
        got.into_iter()
            .map(|r| r.owner.to_string())
            .collect::<Vec<_>>()
    };
    let got = store
        .get_records(
            ns("ns"),
            key("k"),
            vec![id("d"), id("c"), id("a"), id("zz")],
        )
        .await
        .unwrap();
    assert_eq!(owners(got), ["d", "a"]);
    let got = store
        .get_records(ns("ns"), key("k"), vec![id("a"), id("b"), id("d")])
        .await
        .unwrap();
    assert_eq!(owners(got), ["a", "b", "d"]);
    assert!(
        store
            .get_records(ns("ns"), key("k"), vec![])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .get_records(ns("nope"), key("k"), vec![id("a")])
            .await
            .unwrap()
            .is_empty()
    );
    let got = store
        .get_records(ns("ns"), key("k"), vec![id("a")])
        .await
        .unwrap();
    assert_eq!(got[0].value, json!("a"));
}

/// Deletes: missing is `NotFound`, a wrong revision conflicts, the right or
/// no revision deletes; every attempt is audited; a re-created record starts
/// at revision 1.
pub async fn delete_semantics<S: Store>(store: S) {
    let del = |k: &str, expected| Delete {
        owner: id("a"),
        namespace: ns("ns"),
        key: key(k),
        expected_revision: expected,
    };
    assert_eq!(
        store
            .delete_record(del("k", None), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::NotFound
    );
    for v in 0..3 {
        store
            .put_record(
                put("a", "ns", "k", json!(v), None),
                Timestamp(1),
                crate::StorageQuota::default(),
                put_audit("a", "ns.k", v),
            )
            .await
            .unwrap();
    }
    store
        .put_record(
            put("b", "ns", "k", json!("b"), None),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("b", "ns.k", 9),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .delete_record(del("k", Some(2)), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Conflict { current: 3 }
    );
    assert_eq!(get_one(&store, "a", "ns", "k").await.unwrap().revision, 3);
    assert_eq!(
        store
            .delete_record(del("k", Some(3)), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Deleted { revision: 3 }
    );
    assert_eq!(get_one(&store, "a", "ns", "k").await, None);
    // Another owner's record at the same key is untouched.
    assert_eq!(
        get_one(&store, "b", "ns", "k").await.unwrap().value,
        json!("b")
    );
    assert_eq!(
        store
            .delete_record(del("k", Some(3)), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::NotFound
    );
    let outcome = store
        .put_record(
            put("a", "ns", "k", json!("again"), Some(0)),
            Timestamp(5),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 10),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, PutOutcome::Written { created: true, ref record } if record.revision == 1)
    );
    assert_eq!(
        store
            .delete_record(del("k", None), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Deleted { revision: 1 }
    );
    let entries = audit_all(&store).await;
    let ops: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e.draft.operation == "memory.delete")
        .map(|e| (e.draft.verdict.as_str(), e.draft.reason.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("deny", "record_not_found"),
            ("deny", "revision_conflict"),
            ("allow", "owner_delete"),
            ("deny", "record_not_found"),
            ("allow", "owner_delete"),
        ]
    );
    assert_chain(&store).await;
}

/// Usage counts an owner's records and the bytes of their JSON values.
pub async fn owner_usage_counts<S: Store>(store: S) {
    let values = [json!({"x": 1}), json!("héllo"), json!([1, 2, 3])];
    for (i, v) in values.iter().enumerate() {
        store
            .put_record(
                put("a", "ns", &format!("k{i}"), v.clone(), None),
                Timestamp(1),
                crate::StorageQuota::default(),
                put_audit("a", "k", 0),
            )
            .await
            .unwrap();
    }
    store
        .put_record(
            put("b", "ns", "k0", json!(true), None),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("b", "k", 0),
        )
        .await
        .unwrap();
    let bytes: u64 = values
        .iter()
        .map(|v| serde_json::to_string(v).unwrap().len() as u64)
        .sum();
    assert_eq!(
        store.owner_usage(id("a")).await.unwrap(),
        Usage { records: 3, bytes }
    );
    assert_eq!(
        store.owner_usage(id("b")).await.unwrap(),
        Usage {
            records: 1,
            bytes: 4
        }
    );
    assert_eq!(
        store.owner_usage(id("nobody")).await.unwrap(),
        Usage::default()
    );
    let d = Delete {
        owner: id("a"),
        namespace: ns("ns"),
        key: key("k1"),
        expected_revision: None,
    };
    store
        .delete_record(d, delete_audit("a", "ns.k1"))
        .await
        .unwrap();
    let bytes = bytes - "\"héllo\"".len() as u64;
    assert_eq!(
        store.owner_usage(id("a")).await.unwrap(),
        Usage { records: 2, bytes }
    );
}

/// An `AuditFn` may return no entries: the write happens, nothing is
/// appended.
pub async fn put_audit_fn_may_append_nothing<S: Store>(store: S) {
    let outcome = store
        .put_record(
            put("a", "ns", "k", json!(1), None),
            Timestamp(1),
            StorageQuota::default(),
            Box::new(|_| Vec::new()),
        )
        .await
        .unwrap();
    assert!(matches!(outcome, PutOutcome::Written { .. }));
    assert_eq!(head_count(&store).await, 0);
    assert_eq!(
        get_one(&store, "a", "ns", "k").await.unwrap().value,
        json!(1)
    );
}

/// Racing create-only puts: exactly one creates.
pub async fn put_race_create_only<S: Store>(store: S) {
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .put_record(
                    put("a", "ns", "new", json!(i), Some(0)),
                    Timestamp(1),
                    StorageQuota::default(),
                    put_audit("a", "ns.new", i),
                )
                .await
                .unwrap()
        }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            PutOutcome::Written { created: true, .. } => created += 1,
            PutOutcome::Conflict { current: Some(1) } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(head_count(&*store).await, 8);
    assert_chain(&*store).await;
}
