//! Races of session writers: creators of one session id, updaters at one
//! revision, importers of one envelope version (exactly one wins each), and
//! importers of many versions of one envelope (decided one after the
//! other).

use std::collections::BTreeSet;

use super::super::*;
use super::fixtures::*;
use crate::{CreateSession, ImportRefusal, SessionRecord, UpdateSession};

/// [`RACE_WRITERS`] creators of one session id at once (each with its own
/// envelope): exactly one is `Created`, every other gets its state, and
/// only the winner's envelope is stored.
pub async fn sessions_race_create<S: Store>(store: S) {
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            let env = format!("env-race-{i}");
            let mut st = state(
                bare("s-race", &format!("agent-{i}"), 1),
                format!("idx-{i}").as_bytes(),
            );
            st.session.envelope_id = Some(eid(&env));
            barrier.wait().await;
            let o = store
                .create_session(
                    st,
                    Some(envelope(&env, "agent-a")),
                    None,
                    create_audit(i as u64),
                )
                .await
                .unwrap();
            (i, o)
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let winners: Vec<usize> = outcomes
        .iter()
        .filter(|(_, o)| *o == CreateSession::Created)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let winner = winners[0];
    let stored = get(&*store, "s-race").await.unwrap();
    assert_eq!(stored.session.agent, id(&format!("agent-{winner}")));
    assert_eq!(stored.sources, format!("idx-{winner}").into_bytes());
    for (i, o) in &outcomes {
        if *i != winner {
            assert_eq!(*o, CreateSession::Existing(Box::new(stored.clone())));
        }
        let env = store
            .get_envelope(eid(&format!("env-race-{i}")), None)
            .await
            .unwrap();
        assert_eq!(env.is_some(), *i == winner, "envelope of creator {i}");
    }
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len(), RACE_WRITERS);
    let opened: Vec<u64> = entries
        .iter()
        .filter(|e| e.draft.reason == "session_opened")
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    assert_eq!(opened, [winner as u64]);
    assert_eq!(store.list_sessions(None, 100).await.unwrap().len(), 1);
    assert_chain(&*store).await;
}

/// [`RACE_WRITERS`] updates of one session at the same revision, each with
/// its own call: exactly one is applied, the others conflict with the
/// revision it wrote, and every attempt is audited once.
pub async fn sessions_race_update<S: Store>(store: S) {
    let store = Arc::new(store);
    let base = bare("s-race-up", "agent-a", 1);
    create(&*store, state(base.clone(), b"base"), None, None).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let (store, barrier, base) = (Arc::clone(&store), Arc::clone(&barrier), base.clone());
        tasks.push(tokio::spawn(async move {
            let session = SessionRecord {
                policy_version: format!("writer-{i}"),
                ..next(&base)
            };
            let u = update(
                session,
                Some(format!("idx-{i}").as_bytes()),
                Some(call(&format!("c-{i}"), 0)),
            );
            barrier.wait().await;
            (
                i,
                store
                    .update_session(u, 1, update_audit(i as u64))
                    .await
                    .unwrap(),
            )
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, UpdateSession::Updated) => winners.push(i),
            (_, o) => assert_eq!(o, UpdateSession::Conflict { current: Some(2) }),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let w = winners[0];
    let stored = get(&*store, "s-race-up").await.unwrap();
    assert_eq!(stored.session.policy_version, format!("writer-{w}"));
    assert_eq!(stored.session.revision, 2);
    assert_eq!(stored.sources, format!("idx-{w}").into_bytes());
    assert_eq!(stored.calls, vec![call(&format!("c-{w}"), 0)]);
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len(), RACE_WRITERS + 1);
    let updated: Vec<u64> = entries
        .iter()
        .filter(|e| e.draft.reason == "session_updated")
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    assert_eq!(updated, [w as u64]);
    let mut tags: Vec<u64> = entries
        .iter()
        .skip(1)
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..RACE_WRITERS as u64).collect::<Vec<_>>());
    assert_chain(&*store).await;
}

/// [`RACE_WRITERS`] sessions opened at once from the same envelope version:
/// exactly one is created; the others are replays naming it, and none of
/// them is stored.
pub async fn sessions_race_import<S: Store>(store: S) {
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            let session = format!("s-imp-{i}");
            let imp = import("issuer-a", "env-shared", 7, &["no_export"], &session);
            let mut st = state(bare(&session, "agent-a", 1), b"");
            st.session.imported = Some(imp.clone());
            st.session.envelope_id = Some(eid(&format!("env-{session}")));
            let env = envelope(&format!("env-{session}"), "agent-a");
            barrier.wait().await;
            let o = store
                .create_session(st, Some(env), Some(imp), create_audit(i as u64))
                .await
                .unwrap();
            (i, o)
        }));
    }
    let mut winners = Vec::new();
    let mut outcomes = Vec::new();
    for t in tasks {
        let (i, o) = t.await.unwrap();
        if o == CreateSession::Created {
            winners.push(i);
        }
        outcomes.push((i, o));
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let w = winners[0];
    let winner = sid(&format!("s-imp-{w}"));
    for (i, o) in outcomes {
        let session = format!("s-imp-{i}");
        if i != w {
            assert_eq!(
                o,
                CreateSession::ImportRefused(ImportRefusal::Replayed {
                    session_id: winner.clone()
                })
            );
        }
        assert_eq!(get(&*store, &session).await.is_some(), i == w, "{session}");
        let env = store
            .get_envelope(eid(&format!("env-{session}")), None)
            .await
            .unwrap();
        assert_eq!(env.is_some(), i == w, "envelope of {session}");
    }
    let listed = store.list_sessions(None, 100).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session_id, winner);
    assert_eq!(head_count(&*store).await, RACE_WRITERS as u64);
    assert_chain(&*store).await;
}

/// [`RACE_WRITERS`] sessions opened at once from as many versions of one
/// envelope: the imports are decided one after the other, in the order
/// their audit entries commit. The versions created rise in that order,
/// and every other one is a downgrade below a version created before it.
pub async fn sessions_race_import_versions<S: Store>(store: S) {
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            let version = 1 + i as u64;
            let session = format!("s-ver-{version}");
            let imp = import(
                "issuer-a",
                "env-versions",
                version,
                &["no_export"],
                &session,
            );
            let mut st = state(bare(&session, "agent-a", 1), b"");
            st.session.imported = Some(imp.clone());
            barrier.wait().await;
            let o = store
                .create_session(st, None, Some(imp), create_audit(version))
                .await
                .unwrap();
            (version, o)
        }));
    }
    let mut created = BTreeSet::new();
    for t in tasks {
        match t.await.unwrap() {
            (v, CreateSession::Created) => {
                created.insert(v);
            }
            (v, CreateSession::ImportRefused(ImportRefusal::Downgraded { seen_version })) => {
                assert!(seen_version > v, "{v} refused against {seen_version}");
            }
            (v, other) => panic!("version {v}: {other:?}"),
        }
    }
    assert!(
        created.contains(&(RACE_WRITERS as u64)),
        "the highest version opens"
    );
    let mut latest = 0;
    let mut in_order = BTreeSet::new();
    for e in audit_all(&*store).await {
        let v = e.draft.details["tag"].as_u64().unwrap();
        if e.draft.reason == "session_opened" {
            assert!(v > latest, "version {v} created after {latest}");
            latest = v;
            in_order.insert(v);
        } else {
            assert_eq!(e.draft.reason, "envelope_downgraded");
            assert!(
                v < latest,
                "version {v} refused while the latest was {latest}"
            );
        }
    }
    assert_eq!(in_order, created);
    let listed: BTreeSet<u64> = store
        .list_sessions(None, 100)
        .await
        .unwrap()
        .iter()
        .map(|s| s.imported.as_ref().unwrap().version)
        .collect();
    assert_eq!(listed, created);
    assert_chain(&*store).await;
}
