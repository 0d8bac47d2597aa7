//! The audit chain: appends, the head, paging, hashes, verification.

use super::*;

fn numbered(i: u64) -> AuditDraft {
    AuditDraft {
        time: Timestamp(i as i64),
        details: json!({"i": i}),
        ..draft(
            "researcher",
            "memory.read",
            &format!("project.k{i}"),
            Verdict::Allow,
            "visible_from:report_manager",
        )
    }
}

/// The empty head, appends in order, the head after each append; an empty
/// append changes nothing.
pub async fn audit_append_and_head<S: Store>(store: S) {
    let empty = ChainHead {
        count: 0,
        seq: 0,
        hash: Digest::GENESIS,
    };
    assert_eq!(store.audit_head().await.unwrap(), empty);
    assert_eq!(store.append_audit(vec![]).await.unwrap(), empty);
    assert!(audit_all(&store).await.is_empty());
    let h3 = store
        .append_audit((1..=3).map(numbered).collect())
        .await
        .unwrap();
    assert_eq!((h3.count, h3.seq), (3, 3));
    assert_eq!(store.audit_head().await.unwrap(), h3);
    assert_eq!(store.append_audit(vec![]).await.unwrap(), h3);
    let h5 = store
        .append_audit((4..=5).map(numbered).collect())
        .await
        .unwrap();
    assert_eq!((h5.count, h5.seq), (5, 5));
    let entries = audit_all(&store).await;
    assert_eq!(
        entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(entries[2].hash, h3.hash);
    assert_eq!(entries[4].hash, h5.hash);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.draft, numbered(i as u64 + 1));
    }
    assert_eq!(assert_chain(&store).await, h5);
}

/// `audit_page` returns entries after a sequence number, ascending, at most
/// `limit` of them.
pub async fn audit_paging<S: Store>(store: S) {
    for batch in 0..5u64 {
        store
            .append_audit((1..=5).map(|i| numbered(batch * 5 + i)).collect())
            .await
            .unwrap();
    }
    let seqs = |p: Vec<AuditEntry>| p.into_iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(store.audit_page(0, 10).await.unwrap()),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(store.audit_page(10, 10).await.unwrap()),
        (11..=20).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(store.audit_page(20, 10).await.unwrap()),
        (21..=25).collect::<Vec<_>>()
    );
    assert_eq!(seqs(store.audit_page(7, 3).await.unwrap()), [8, 9, 10]);
    assert!(store.audit_page(25, 10).await.unwrap().is_empty());
    assert!(store.audit_page(1_000, 10).await.unwrap().is_empty());
    assert!(store.audit_page(0, 0).await.unwrap().is_empty());
    assert_eq!(seqs(store.audit_page(24, usize::MAX).await.unwrap()), [25]);
    assert_eq!(audit_all(&store).await.len(), 25);
}

/// Every field round-trips exactly and the stored hashes are the ones the
/// core computes (`AuditDraft::seal` from the genesis hash).
pub async fn audit_round_trip_and_hashes<S: Store>(store: S) {
    let details = [
        Value::Null,
        json!({"b": {"z": 1, "a": [true, false, null]}, "a": "x"}),
        json!([1, -1, 0.25, 1e300, u64::MAX, i64::MIN]),
        json!("quote \" backslash \\ newline \n tab \t unicode é ✓ \u{1F600}"),
        json!({"obligations": [{"kind": "label", "value": "pii"}]}),
    ];
    let verdicts = [
        Verdict::Allow,
        Verdict::Constrain,
        Verdict::Deny,
        Verdict::Escalate,
        Verdict::Allow,
    ];
    let drafts: Vec<AuditDraft> = details
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(i, (d, v))| AuditDraft {
            time: Timestamp(if i == 0 {
                -5
            } else {
                1_700_000_000_000 + i as i64
            }),
            subject: if i == 1 {
                "@operator".into()
            } else {
                format!("agent-{i}")
            },
            operation: "step.begin".into(),
            resource: format!("run-1/s{i}"),
            verdict: v,
            reason: if i == 2 {
                String::new()
            } else {
                format!("reason_{i}:param")
            },
            policy_version: "lab-1".into(),
            details: d.clone(),
        })
        .collect();
    store.append_audit(drafts[..2].to_vec()).await.unwrap();
    store.append_audit(drafts[2..].to_vec()).await.unwrap();
    let mut prev = Digest::GENESIS;
    let expected: Vec<AuditEntry> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let e = d.clone().seal(i as u64 + 1, prev);
            prev = e.hash;
            e
        })
        .collect();
    assert_eq!(audit_all(&store).await, expected);
    assert_chain(&store).await;
}

/// Concurrent appenders build one chain; each append's entries stay
/// adjacent and each appender's entries keep their order.
pub async fn audit_concurrent_appends<S: Store>(store: S) {
    const TASKS: u64 = 8;
    const APPENDS: u64 = 25;
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for i in 0..APPENDS {
                let d = |part: u64| AuditDraft {
                    details: json!({"task": t, "i": i, "part": part}),
                    ..draft(
                        &format!("agent-{t}"),
                        "memory.read",
                        "ns.k",
                        Verdict::Allow,
                        "ok",
                    )
                };
                store.append_audit(vec![d(0), d(1)]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len() as u64, TASKS * APPENDS * 2);
    let mut next = vec![0u64; TASKS as usize];
    for pair in entries.chunks(2) {
        let (a, b) = (&pair[0].draft.details, &pair[1].draft.details);
        assert_eq!(
            (a["task"].clone(), a["i"].clone()),
            (b["task"].clone(), b["i"].clone()),
            "an append was split"
        );
        assert_eq!((a["part"].as_u64(), b["part"].as_u64()), (Some(0), Some(1)));
        let t = a["task"].as_u64().unwrap() as usize;
        assert_eq!(
            a["i"].as_u64(),
            Some(next[t]),
            "task {t}'s appends out of order"
        );
        next[t] += 1;
    }
    assert_chain(&*store).await;
}

/// [`verify_store`] accepts the intact chain with its own head as anchor
/// and with an older anchor; it rejects an anchor whose hash differs and
/// one beyond the chain's end.
pub async fn audit_verify_and_anchor<S: Store>(store: S) {
    let empty = verify_store(
        &store,
        Some(HeadAnchor {
            seq: 0,
            hash: Digest::GENESIS,
        }),
    )
    .await
    .unwrap();
    assert_eq!(empty.verified.count, 0);
    store
        .append_audit((1..=4).map(numbered).collect())
        .await
        .unwrap();
    let head = store.audit_head().await.unwrap();
    let anchor = HeadAnchor::of(&head);
    let report = verify_store(&store, Some(anchor)).await.unwrap();
    assert_eq!((report.verified, report.anchor), (head, Some(anchor)));
    store
        .append_audit((5..=6).map(numbered).collect())
        .await
        .unwrap();
    let report = verify_store(&store, Some(anchor)).await.unwrap();
    assert_eq!(report.verified.seq, 6);
    let wrong = HeadAnchor {
        seq: 2,
        hash: Digest::of(b"elsewhere"),
    };
    let r = verify_store(&store, Some(wrong)).await;
    assert!(
        matches!(r, Err(VerifyError::AnchorMismatch { seq: 2 })),
        "{r:?}"
    );
    let beyond = HeadAnchor {
        seq: 9,
        hash: head.hash,
    };
    let err = verify_store(&store, Some(beyond)).await.unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::AnchorNotReached {
                last_seq: 6,
                anchor_seq: 9
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.seq(), Some(7));
}

/// Every field round-trips exactly (NUL and the escape character
/// included) and the stored hashes are the ones the core computes.
pub async fn audit_round_trip_exotic_text<S: Store>(store: S) {
    let details = [
        Value::Null,
        json!({"b": {"z": 1, "a": [true, false, null]}, "a": "x"}),
        json!([1, -1, 0.25, 1e300, u64::MAX, i64::MIN]),
        json!("quote \" backslash \\ newline \n nul \u{0} esc \u{E000} ✓ \u{1F600}"),
        json!({"obligations": [{"kind": "label", "value": "pii"}]}),
    ];
    let verdicts = [
        Verdict::Allow,
        Verdict::Constrain,
        Verdict::Deny,
        Verdict::Escalate,
        Verdict::Allow,
    ];
    let drafts: Vec<AuditDraft> = details
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(i, (d, v))| AuditDraft {
            time: Timestamp(if i == 0 {
                -5
            } else {
                1_700_000_000_000 + i as i64
            }),
            subject: if i == 1 {
                "@operator".into()
            } else {
                format!("agent-{i}")
            },
            operation: "step.begin".into(),
            resource: if i == 3 {
                "internal/../\0etc\u{E000}passwd".into()
            } else {
                format!("run-1/s{i}")
            },
            verdict: v,
            reason: if i == 2 {
                String::new()
            } else {
                format!("reason_{i}:param")
            },
            policy_version: "lab-1".into(),
            details: d.clone(),
        })
        .collect();
    store.append_audit(drafts[..2].to_vec()).await.unwrap();
    store.append_audit(drafts[2..].to_vec()).await.unwrap();
    let mut prev = Digest::GENESIS;
    let expected: Vec<AuditEntry> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let e = d.clone().seal(i as u64 + 1, prev);
            prev = e.hash;
            e
        })
        .collect();
    assert_eq!(audit_all(&store).await, expected);
    assert_chain(&store).await;
}
