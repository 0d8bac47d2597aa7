//! Quotas decided in the write transaction: storage and runs in flight.

use super::*;

fn records_quota(max: u64) -> StorageQuota {
    StorageQuota {
        max_records: Some(max),
        max_bytes: None,
    }
}

fn bytes_quota(max: u64) -> StorageQuota {
    StorageQuota {
        max_records: None,
        max_bytes: Some(max),
    }
}

/// Put with a quota and the engine-like audit function.
async fn put_q<S: Store>(
    store: &S,
    owner: &str,
    k: &str,
    value: Value,
    quota: StorageQuota,
) -> PutOutcome {
    store
        .put_record(
            put(owner, "ns", k, value, None),
            Timestamp(5),
            quota,
            put_audit(owner, k, 0),
        )
        .await
        .unwrap()
}

/// `max_records`: a create counts one more record; at the limit a create
/// is `OverQuota` (nothing stored, the refusal audited), an update is not
/// a create and is allowed, other owners are not affected.
pub async fn quota_max_records<S: Store>(store: S) {
    let q = records_quota(2);
    for k in ["a", "b"] {
        let o = put_q(&store, "o", k, json!(1), q).await;
        assert!(
            matches!(o, PutOutcome::Written { created: true, .. }),
            "{o:?}"
        );
    }
    let o = put_q(&store, "o", "c", json!(1), q).await;
    assert_eq!(
        o,
        PutOutcome::OverQuota {
            quota: QuotaKind::Records,
            limit: 2,
            used: 2
        }
    );
    assert_eq!(get_one(&store, "o", "ns", "c").await, None);
    let last = audit_all(&store).await.pop().unwrap();
    assert_eq!(
        (last.draft.verdict, last.draft.reason.as_str()),
        (Verdict::Deny, "quota_max_records")
    );
    assert_eq!(last.draft.details["limit"], json!(2));
    assert_eq!(last.draft.details["used"], json!(2));
    // An update at the limit is allowed, and so is another owner's create.
    let o = put_q(&store, "o", "a", json!({"bigger": [1, 2, 3]}), q).await;
    assert!(
        matches!(o, PutOutcome::Written { created: false, .. }),
        "{o:?}"
    );
    let o = put_q(&store, "p", "c", json!(1), q).await;
    assert!(
        matches!(o, PutOutcome::Written { created: true, .. }),
        "{o:?}"
    );
    // Without a quota the store does not limit.
    let o = put_q(&store, "o", "d", json!(1), StorageQuota::default()).await;
    assert!(
        matches!(o, PutOutcome::Written { created: true, .. }),
        "{o:?}"
    );
    assert_eq!(
        store.owner_usage(id("o")).await.unwrap().records,
        3,
        "a refused create stored nothing"
    );
    assert_eq!(head_count(&store).await, 6, "every attempt is audited");
    assert_chain(&store).await;
}

/// `max_bytes`: bytes are the owner's JSON-encoded value lengths; a write
/// that grows a value must keep `used - old + new <= max`; one that does
/// not grow is always allowed, even over the limit.
pub async fn quota_max_bytes<S: Store>(store: S) {
    // `"xxxx"` is 6 bytes of JSON.
    let six = json!("xxxx");
    assert_eq!(crate::encoded_len(&six), 6);
    let q = bytes_quota(12);
    assert!(matches!(
        put_q(&store, "o", "a", six.clone(), q).await,
        PutOutcome::Written { .. }
    ));
    assert!(matches!(
        put_q(&store, "o", "b", six.clone(), q).await,
        PutOutcome::Written { .. }
    ));
    assert_eq!(
        store.owner_usage(id("o")).await.unwrap(),
        Usage {
            records: 2,
            bytes: 12
        }
    );
    // A new record of any size is over; so is growing one.
    assert_eq!(
        put_q(&store, "o", "c", json!(1), q).await,
        PutOutcome::OverQuota {
            quota: QuotaKind::Bytes,
            limit: 12,
            used: 12
        }
    );
    assert_eq!(
        put_q(&store, "o", "a", json!("xxxxx"), q).await,
        PutOutcome::OverQuota {
            quota: QuotaKind::Bytes,
            limit: 12,
            used: 12
        }
    );
    let a = get_one(&store, "o", "ns", "a").await.unwrap();
    assert_eq!((a.value, a.revision), (six.clone(), 1), "nothing changed");
    // The same size and smaller are allowed, even under a lower limit.
    assert!(matches!(
        put_q(&store, "o", "a", json!("yyyy"), q).await,
        PutOutcome::Written { .. }
    ));
    assert!(matches!(
        put_q(&store, "o", "a", json!("y"), bytes_quota(1)).await,
        PutOutcome::Written { .. }
    ));
    // Freed bytes can be used again: 3 + 6 + 3 = 12.
    assert!(matches!(
        put_q(&store, "o", "c", json!("z"), q).await,
        PutOutcome::Written { created: true, .. }
    ));
    assert_eq!(
        store.owner_usage(id("o")).await.unwrap(),
        Usage {
            records: 3,
            bytes: 12
        }
    );
    assert_eq!(head_count(&store).await, 7);
    assert_chain(&store).await;
}

/// [`RACE_WRITERS`] concurrent creates of different keys by one owner under
/// `max_records`: exactly the limit is stored, however the writers
/// interleave; every attempt is audited.
pub async fn quota_concurrent_creates<S: Store>(store: S) {
    const MAX: u64 = 5;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            put_q(&*store, "o", &format!("k{i}"), json!(i), records_quota(MAX)).await
        }));
    }
    let mut written = 0;
    for t in tasks {
        match t.await.unwrap() {
            PutOutcome::Written { .. } => written += 1,
            PutOutcome::OverQuota {
                quota: QuotaKind::Records,
                limit: MAX,
                used: MAX,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(written, MAX);
    assert_eq!(store.owner_usage(id("o")).await.unwrap().records, MAX);
    assert_eq!(head_count(&*store).await, RACE_WRITERS as u64);
    assert_chain(&*store).await;
}

fn agent_run(name: &str, agent: &str, created_at: i64) -> RunRecord {
    RunRecord {
        agent: id(agent),
        created_at: Timestamp(created_at),
        ..sample_run(name, Digest::of(name.as_bytes()))
    }
}

fn run_audit(tag: &str) -> AuditFn<CreateRun> {
    let tag = tag.to_string();
    Box::new(move |outcome: &CreateRun| match outcome {
        CreateRun::Created => vec![draft("a", "run.admit", &tag, Verdict::Allow, "admitted")],
        CreateRun::OverQuota { limit, in_flight } => vec![AuditDraft {
            details: json!({"limit": limit, "in_flight": in_flight}),
            ..draft(
                "a",
                "run.admit",
                &tag,
                Verdict::Deny,
                "quota_max_runs_in_flight",
            )
        }],
        CreateRun::Existing(_) => Vec::new(),
    })
}

fn in_flight(max: u32, since: i64) -> Option<RunsInFlight> {
    Some(RunsInFlight {
        max,
        since: Timestamp(since),
    })
}

/// Runs in flight: unfinished runs of the same agent created at or after
/// `since`. At the limit a create is `OverQuota` (nothing stored, the
/// refusal audited); an existing id is returned whatever the quota; a run
/// stops counting once a step fails or is denied, once every step has an
/// outcome, or once it is older than `since`.
pub async fn runs_in_flight_limit<S: Store>(store: S) {
    for name in ["r1", "r2"] {
        let o = store
            .create_run(agent_run(name, "a", 10), in_flight(2, 0), run_audit(name))
            .await
            .unwrap();
        assert_eq!(o, CreateRun::Created);
    }
    let o = store
        .create_run(agent_run("r3", "a", 10), in_flight(2, 0), run_audit("r3"))
        .await
        .unwrap();
    assert_eq!(
        o,
        CreateRun::OverQuota {
            limit: 2,
            in_flight: 2
        }
    );
    assert_eq!(store.get_run(run_id("r3")).await.unwrap(), None);
    let last = audit_all(&store).await.pop().unwrap();
    assert_eq!(last.draft.reason, "quota_max_runs_in_flight");
    assert_eq!(last.draft.details, json!({"limit": 2, "in_flight": 2}));
    // An existing run comes back whatever the quota, appending nothing.
    let before = head_count(&store).await;
    let o = store
        .create_run(agent_run("r1", "a", 10), in_flight(0, 0), run_audit("r1"))
        .await
        .unwrap();
    assert!(
        matches!(o, CreateRun::Existing(ref s) if s.run.run_id == run_id("r1")),
        "{o:?}"
    );
    assert_eq!(head_count(&store).await, before);
    // Another agent has its own count.
    let o = store
        .create_run(agent_run("b1", "b", 10), in_flight(2, 0), run_audit("b1"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    // A failed step finishes r1.
    let failed = StepOutcome {
        status: StepStatus::Failed,
        result: None,
        error: Some("boom".into()),
        labels: Vec::new(),
        recorded_at: Timestamp(11),
    };
    store
        .record_step(run_id("r1"), step_id("s1"), failed, Vec::new())
        .await
        .unwrap();
    let o = store
        .create_run(agent_run("r3", "a", 12), in_flight(2, 0), run_audit("r3"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    // r2 completes every step: finished.
    for s in ["s1", "s2"] {
        store
            .record_step(run_id("r2"), step_id(s), completed(json!(1)), Vec::new())
            .await
            .unwrap();
    }
    let o = store
        .create_run(agent_run("r4", "a", 13), in_flight(2, 0), run_audit("r4"))
        .await
        .unwrap();
    assert_eq!(
        o,
        CreateRun::OverQuota {
            limit: 2,
            in_flight: 2
        },
        "two of three steps completed is not finished"
    );
    store
        .record_step(run_id("r2"), step_id("s3"), completed(json!(1)), Vec::new())
        .await
        .unwrap();
    let o = store
        .create_run(agent_run("r4", "a", 13), in_flight(2, 0), run_audit("r4"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    // r3 (created at 12) and r4 (13) are in flight; from `since` 13 on only
    // r4 counts, so an abandoned r3 no longer holds a slot.
    let o = store
        .create_run(agent_run("r5", "a", 14), in_flight(2, 0), run_audit("r5"))
        .await
        .unwrap();
    assert!(
        matches!(o, CreateRun::OverQuota { in_flight: 2, .. }),
        "{o:?}"
    );
    let o = store
        .create_run(agent_run("r5", "a", 14), in_flight(2, 13), run_audit("r5"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    assert_chain(&store).await;
}

/// [`RACE_WRITERS`] concurrent creates of different runs by one agent
/// never exceed the limit.
pub async fn runs_in_flight_concurrent<S: Store>(store: S) {
    const MAX: u32 = 3;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let name = format!("run-{i}");
            store
                .create_run(
                    agent_run(&name, "a", 10),
                    in_flight(MAX, 0),
                    run_audit(&name),
                )
                .await
                .unwrap()
        }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            CreateRun::Created => created += 1,
            CreateRun::OverQuota {
                limit: MAX,
                in_flight: MAX,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(created, MAX);
    assert_eq!(head_count(&*store).await, RACE_WRITERS as u64);
    assert_chain(&*store).await;
}
