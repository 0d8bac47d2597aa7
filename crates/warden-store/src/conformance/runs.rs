//! Runs: creation, exactly-once steps, mixed concurrent writers.

use super::*;

/// A new run is created and audited; the same id again returns the stored
/// run (whatever the new SOP hash) and appends nothing.
pub async fn runs_create_existing_get<S: Store>(store: S) {
    let run = sample_run("run-1", Digest::of(b"sop"));
    let audit = || {
        vec![draft(
            "researcher",
            "run.admit",
            "run-1",
            Verdict::Allow,
            "admitted",
        )]
    };
    assert_eq!(
        store
            .create_run(run.clone(), None, crate::audit_if_created(audit()))
            .await
            .unwrap(),
        CreateRun::Created
    );
    assert_eq!(head_count(&store).await, 1);
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(state.run, run);
    assert!(state.outcomes.is_empty());
    let reused = sample_run("run-1", Digest::of(b"another sop"));
    match store
        .create_run(reused, None, crate::audit_if_created(audit()))
        .await
        .unwrap()
    {
        CreateRun::Existing(existing) => {
            assert_eq!(existing.run, run);
            assert_eq!(existing.run.sop_hash, Digest::of(b"sop"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(head_count(&store).await, 1);
    assert_eq!(store.get_run(run_id("run-2")).await.unwrap(), None);
    let other = sample_run("run-2", Digest::of(b"sop"));
    assert_eq!(
        store
            .create_run(other.clone(), None, crate::audit_if_created(vec![]))
            .await
            .unwrap(),
        CreateRun::Created
    );
    assert_eq!(
        store.get_run(run_id("run-2")).await.unwrap().unwrap().run,
        other
    );
    assert_chain(&store).await;
}

/// A step outcome is recorded once: a second record returns the first
/// outcome unchanged and appends nothing.
pub async fn record_step_exactly_once<S: Store>(store: S) {
    let run = sample_run("run-1", Digest::of(b"sop"));
    store
        .create_run(run, None, crate::audit_if_created(vec![]))
        .await
        .unwrap();
    let audit = |s: &str| {
        vec![draft(
            "researcher",
            "step.complete",
            s,
            Verdict::Allow,
            "step_allowed",
        )]
    };
    let first = completed(json!({"summary": "ok", "n": 3}));
    assert_eq!(
        store
            .record_step(run_id("run-1"), step_id("s1"), first.clone(), audit("s1"))
            .await
            .unwrap(),
        RecordStep::Recorded
    );
    assert_eq!(head_count(&store).await, 1);
    let retry = StepOutcome {
        status: StepStatus::Failed,
        result: None,
        error: Some("timeout".into()),
        labels: vec![],
        recorded_at: Timestamp(99),
    };
    assert_eq!(
        store
            .record_step(run_id("run-1"), step_id("s1"), retry.clone(), audit("s1"))
            .await
            .unwrap(),
        RecordStep::AlreadyRecorded(first.clone())
    );
    assert_eq!(head_count(&store).await, 1);
    let failed = StepOutcome {
        status: StepStatus::Denied,
        error: Some("lockdown".into()),
        ..retry
    };
    assert_eq!(
        store
            .record_step(run_id("run-1"), step_id("s3"), failed.clone(), audit("s3"))
            .await
            .unwrap(),
        RecordStep::Recorded
    );
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(state.outcomes.len(), 2);
    assert_eq!(state.outcomes.get(&step_id("s1")), Some(&first));
    assert_eq!(state.outcomes.get(&step_id("s3")), Some(&failed));
    match store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap()
    {
        CreateRun::Existing(existing) => assert_eq!(existing.outcomes, state.outcomes),
        other => panic!("{other:?}"),
    }
    assert_eq!(head_count(&store).await, 2);
    assert_chain(&store).await;
}

/// Recording a step of an unknown run, or an unknown step, is `NotFound`
/// and appends nothing.
pub async fn record_step_unknown<S: Store>(store: S) {
    store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    let audit = || {
        vec![draft(
            "researcher",
            "step.complete",
            "x",
            Verdict::Allow,
            "step_allowed",
        )]
    };
    let err = store
        .record_step(run_id("ghost"), step_id("s1"), completed(json!(1)), audit())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Run, ref id } if id == "ghost"),
        "{err:?}"
    );
    let err = store
        .record_step(run_id("run-1"), step_id("s9"), completed(json!(1)), audit())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Step, ref id } if id == "run-1/s9"),
        "{err:?}"
    );
    assert_eq!(head_count(&store).await, 0);
    assert!(
        store
            .get_run(run_id("run-1"))
            .await
            .unwrap()
            .unwrap()
            .outcomes
            .is_empty()
    );
    assert_eq!(store.get_run(run_id("ghost")).await.unwrap(), None);
}

/// Writers of every kind, some failing, run concurrently: each successful
/// operation's entries are in the chain, failed ones left none, and the
/// chain verifies.
pub async fn mixed_concurrent_writers<S: Store>(store: S) {
    let store = Arc::new(store);
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut expected = 0u64;
            for i in 0..10u64 {
                let k = format!("t{t}k{i}");
                let outcome = store
                    .put_record(
                        put("root", "ns", &k, json!(i), Some(0)),
                        Timestamp(1),
                        crate::StorageQuota::default(),
                        put_audit("root", &k, i),
                    )
                    .await
                    .unwrap();
                assert!(matches!(outcome, PutOutcome::Written { .. }));
                expected += 1;
                // Always fails: duplicate agent.
                let dup = store
                    .insert_agent(agent("root", None), register("dup"))
                    .await;
                assert!(matches!(
                    dup,
                    Err(StoreError::Duplicate {
                        entity: Entity::Agent,
                        ..
                    })
                ));
                // Fails: unknown step.
                let bad = store
                    .record_step(
                        run_id("run-1"),
                        step_id("nope"),
                        completed(json!(0)),
                        register("bad-step"),
                    )
                    .await;
                assert!(matches!(
                    bad,
                    Err(StoreError::NotFound {
                        entity: Entity::Step,
                        ..
                    })
                ));
                store
                    .append_audit(vec![draft("root", "note", &k, Verdict::Allow, "ok")])
                    .await
                    .unwrap();
                expected += 1;
            }
            expected
        }));
    }
    let mut expected = 1;
    for t in tasks {
        expected += t.await.unwrap();
    }
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len() as u64, expected);
    assert!(
        entries
            .iter()
            .all(|e| e.draft.resource != "dup" && e.draft.resource != "bad-step")
    );
    for t in 0..4 {
        for i in 0..10 {
            let k = format!("t{t}k{i}");
            assert_eq!(
                get_one(&*store, "root", "ns", &k).await.unwrap().value,
                json!(i)
            );
        }
    }
    assert_chain(&*store).await;
}

fn lease(holder: &str, at: i64, until: i64) -> StepLease {
    StepLease {
        holder: holder.to_owned(),
        acquired_at: Timestamp(at),
        expires_at: Timestamp(until),
    }
}

fn lease_audit(tag: &'static str) -> AuditFn<LeaseStep> {
    Box::new(move |o: &LeaseStep| match o {
        LeaseStep::Granted => vec![draft(
            "researcher",
            "step.begin",
            tag,
            Verdict::Allow,
            "step_allowed",
        )],
        _ => vec![draft(
            "researcher",
            "step.begin",
            tag,
            Verdict::Deny,
            "step_in_progress",
        )],
    })
}

/// A step's lease is a compare-and-set in the store: of concurrent takers
/// exactly one is granted and the others see its lease; the holder renews
/// it; only the holder records the outcome while it is live (anyone else,
/// or no holder, is `LeaseHeld`, storing and appending nothing); a lapsed
/// lease is taken over, after which the old holder is refused; a recorded
/// step leases to no one; an unknown step is `NotFound`.
pub async fn step_leases<S: Store>(store: S) {
    let store = Arc::new(store);
    store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let l = lease(&format!("w{i}"), 100, 200);
                let out = store
                    .lease_step(run_id("run-1"), step_id("s1"), l, lease_audit("s1"))
                    .await
                    .unwrap();
                (format!("w{i}"), out)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut held = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (w, LeaseStep::Granted) => winners.push(w),
            (_, LeaseStep::Held(l)) => held.push(l),
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one taker is granted");
    let holder = winners.remove(0);
    assert_eq!(held.len(), 7);
    assert!(held.iter().all(|l| *l == lease(&holder, 100, 200)));
    assert_eq!(head_count(&*store).await, 8, "every outcome was recorded");
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(
        state.leases.get(&step_id("s1")),
        Some(&lease(&holder, 100, 200))
    );
    // The holder renews its own lease.
    assert_eq!(
        store
            .lease_step(
                run_id("run-1"),
                step_id("s1"),
                lease(&holder, 150, 250),
                lease_audit("s1")
            )
            .await
            .unwrap(),
        LeaseStep::Granted
    );
    // Nobody else records while it is live; nothing changes.
    let head = head_count(&*store).await;
    let mut early = completed(json!("other"));
    early.recorded_at = Timestamp(160);
    for who in [Some("intruder".to_owned()), None] {
        assert_eq!(
            store
                .record_step_as(
                    run_id("run-1"),
                    step_id("s1"),
                    early.clone(),
                    who,
                    vec![draft(
                        "researcher",
                        "step.complete",
                        "s1",
                        Verdict::Allow,
                        "x"
                    )],
                )
                .await
                .unwrap(),
            RecordStep::LeaseHeld(lease(&holder, 150, 250))
        );
    }
    assert_eq!(head_count(&*store).await, head);
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert!(state.outcomes.is_empty());
    // Lapsed: another worker takes it over, and the old holder is refused.
    assert_eq!(
        store
            .lease_step(
                run_id("run-1"),
                step_id("s1"),
                lease("late", 250, 400),
                lease_audit("s1")
            )
            .await
            .unwrap(),
        LeaseStep::Granted
    );
    let mut stale = completed(json!("stale"));
    stale.recorded_at = Timestamp(260);
    assert_eq!(
        store
            .record_step_as(
                run_id("run-1"),
                step_id("s1"),
                stale,
                Some(holder.clone()),
                vec![]
            )
            .await
            .unwrap(),
        RecordStep::LeaseHeld(lease("late", 250, 400))
    );
    let mut done = completed(json!("done"));
    done.recorded_at = Timestamp(270);
    assert_eq!(
        store
            .record_step_as(
                run_id("run-1"),
                step_id("s1"),
                done.clone(),
                Some("late".into()),
                vec![draft(
                    "researcher",
                    "step.complete",
                    "s1",
                    Verdict::Allow,
                    "step_recorded"
                )]
            )
            .await
            .unwrap(),
        RecordStep::Recorded
    );
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(state.outcomes.get(&step_id("s1")), Some(&done));
    assert!(state.leases.is_empty(), "a recorded step holds no lease");
    assert_eq!(
        store
            .lease_step(
                run_id("run-1"),
                step_id("s1"),
                lease("again", 300, 500),
                lease_audit("s1")
            )
            .await
            .unwrap(),
        LeaseStep::Recorded(done)
    );
    // A lease that lapsed with nobody taking over: the holder still records.
    store
        .lease_step(
            run_id("run-1"),
            step_id("s2"),
            lease("w", 10, 20),
            lease_audit("s2"),
        )
        .await
        .unwrap();
    let mut late = completed(json!("late"));
    late.recorded_at = Timestamp(30);
    assert_eq!(
        store
            .record_step_as(
                run_id("run-1"),
                step_id("s2"),
                late,
                Some("w".into()),
                vec![]
            )
            .await
            .unwrap(),
        RecordStep::Recorded
    );
    let err = store
        .lease_step(
            run_id("run-1"),
            step_id("s9"),
            lease("w", 1, 2),
            lease_audit("s9"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                entity: Entity::Step,
                ..
            }
        ),
        "{err:?}"
    );
    let err = store
        .lease_step(
            run_id("ghost"),
            step_id("s1"),
            lease("w", 1, 2),
            lease_audit("s1"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                entity: Entity::Run,
                ..
            }
        ),
        "{err:?}"
    );
    assert_chain(&*store).await;
}
