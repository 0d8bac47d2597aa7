//! Memory records: round trips, compare-and-set, rejection, deletes, usage.

use serde_json::{Value, json};
use warden_core::decision::Verdict;
use warden_core::memory::{Combinator, INVALID_RECORD, MemoryRecord, Put, RecordClass, Visibility};
use warden_core::time::Timestamp;
use warden_store::{Delete, DeleteOutcome, PutOutcome, Store, Usage};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_class_and_json_value_round_trips() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
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
            "sec0",
            Visibility::Private,
            RecordClass::Secret { grants: vec![] },
            json!("x"),
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
        let at = Timestamp(100 + i as i64);
        let outcome = store
            .put_record(
                p,
                at,
                warden_store::StorageQuota::default(),
                put_audit("owner", k, i as u64),
            )
            .await
            .unwrap();
        let expected = MemoryRecord {
            namespace: ns("ns"),
            key: key(k),
            value: v.clone(),
            owner: id("owner"),
            visibility: *vis,
            class: class.clone(),
            revision: 1,
            created_at: at,
            updated_at: at,
        };
        assert_eq!(
            outcome,
            PutOutcome::Written {
                record: expected.clone(),
                created: true
            }
        );
        assert_eq!(get_one(&store, "owner", "ns", k).await, Some(expected));
    }
    // Defaults on create: a private preference.
    store
        .put_record(
            put("owner", "ns", "plain", json!(1), None),
            Timestamp(1),
            warden_store::StorageQuota::default(),
            put_audit("owner", "plain", 99),
        )
        .await
        .unwrap();
    let plain = get_one(&store, "owner", "ns", "plain").await.unwrap();
    assert_eq!(
        (plain.visibility, plain.class),
        (Visibility::Private, RecordClass::Preference)
    );
    assert_eq!(head_count(&store).await, classes.len() as u64 + 1);
    assert_chain(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_only_put_conflicts_once_the_record_exists() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let first = store
        .put_record(
            put("a", "ns", "k", json!("first"), Some(0)),
            Timestamp(1),
            warden_store::StorageQuota::default(),
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
            warden_store::StorageQuota::default(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_revision_conflicts_and_reports_the_current_one() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let w = |v: Value, e: Option<u64>, t: i64, tag: u64| {
        store.put_record(
            put("a", "ns", "k", v, e),
            Timestamp(t),
            warden_store::StorageQuota::default(),
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
            warden_store::StorageQuota::default(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconditional_put_keeps_class_visibility_and_creation_time() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
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
            warden_store::StorageQuota::default(),
            put_audit("a", "ns.k", 1),
        )
        .await
        .unwrap();
    for i in 2..=4u64 {
        let outcome = store
            .put_record(
                put("a", "ns", "k", json!(i), None),
                Timestamp(10 * i as i64),
                warden_store::StorageQuota::default(),
                put_audit("a", "ns.k", i),
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, PutOutcome::Written { created: false, ref record } if record.revision == i)
        );
    }
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!((stored.value.clone(), stored.revision), (json!(4), 4));
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
    // A compare-and-set that changes class and visibility.
    let p = Put {
        visibility: Some(Visibility::Private),
        class: Some(RecordClass::Preference),
        ..put("a", "ns", "k", json!("x"), Some(4))
    };
    store
        .put_record(
            p,
            Timestamp(50),
            warden_store::StorageQuota::default(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_rejection_is_an_audited_outcome_that_changes_nothing() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
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
            warden_store::StorageQuota::default(),
            put_audit("a", "policy.upload", 1),
        )
        .await
        .unwrap();
    // Keeping the class, the new value must still fit the combinator.
    let outcome = store
        .put_record(
            put("a", "policy", "upload", json!(5), Some(1)),
            Timestamp(2),
            warden_store::StorageQuota::default(),
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
            warden_store::StorageQuota::default(),
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
    // A create-only put on an existing record conflicts before its class is
    // checked (as in the reference store).
    let p = Put {
        class: Some(RecordClass::Policy {
            combine: Combinator::All,
        }),
        ..put("a", "policy", "upload", json!(7), Some(0))
    };
    let outcome = store
        .put_record(
            p,
            Timestamp(4),
            warden_store::StorageQuota::default(),
            put_audit("a", "policy.upload", 4),
        )
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Conflict { current: Some(1) });
    let reasons: Vec<(Verdict, String)> = audit_all(&store)
        .await
        .into_iter()
        .map(|e| (e.draft.verdict, e.draft.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            (Verdict::Allow, "owner_write".to_string()),
            (
                Verdict::Deny,
                "invalid_record:policy_value_does_not_fit_combinator".to_string()
            ),
            (
                Verdict::Deny,
                "invalid_record:class_is_private_only".to_string()
            ),
            (Verdict::Deny, "revision_conflict".to_string()),
        ]
    );
    assert_chain(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_fn_returning_nothing_appends_nothing() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let outcome = store
        .put_record(
            put("a", "ns", "k", json!(1), None),
            Timestamp(1),
            warden_store::StorageQuota::default(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_records_follows_the_owner_order_and_exact_key() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
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
                warden_store::StorageQuota::default(),
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_semantics_and_recreation() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
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
                warden_store::StorageQuota::default(),
                put_audit("a", "ns.k", v),
            )
            .await
            .unwrap();
    }
    store
        .put_record(
            put("b", "ns", "k", json!("b"), None),
            Timestamp(1),
            warden_store::StorageQuota::default(),
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
    let again = store
        .put_record(
            put("a", "ns", "k", json!("again"), Some(0)),
            Timestamp(5),
            warden_store::StorageQuota::default(),
            put_audit("a", "ns.k", 10),
        )
        .await
        .unwrap();
    assert!(
        matches!(again, PutOutcome::Written { created: true, ref record } if record.revision == 1)
    );
    assert_eq!(
        store
            .delete_record(del("k", None), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Deleted { revision: 1 }
    );
    let ops: Vec<(Verdict, String)> = audit_all(&store)
        .await
        .into_iter()
        .filter(|e| e.draft.operation == "memory.delete")
        .map(|e| (e.draft.verdict, e.draft.reason))
        .collect();
    let expected = [
        (Verdict::Deny, "record_not_found"),
        (Verdict::Deny, "revision_conflict"),
        (Verdict::Allow, "owner_delete"),
        (Verdict::Deny, "record_not_found"),
        (Verdict::Allow, "owner_delete"),
    ];
    assert_eq!(ops, expected.map(|(v, r)| (v, r.to_string())));
    assert_chain(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_usage_counts_records_and_value_bytes() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let values = [json!({"x": 1}), json!("héllo"), json!([1, 2, 3])];
    for (i, v) in values.iter().enumerate() {
        store
            .put_record(
                put("a", "ns", &format!("k{i}"), v.clone(), None),
                Timestamp(1),
                warden_store::StorageQuota::default(),
                put_audit("a", "k", 0),
            )
            .await
            .unwrap();
    }
    store
        .put_record(
            put("b", "ns", "k0", json!(true), None),
            Timestamp(1),
            warden_store::StorageQuota::default(),
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
