//! Tool-call sessions: creation with the first envelope version and the
//! import check in one transaction, compare-and-set updates, calls upserted
//! by id and read back by `seq`, listing, and (in [`races`]) the races
//! each of them must survive.

use warden_core::decision::{Reason, Subject};
use warden_core::envelope::Sensitivity;

use super::*;
use crate::{
    CallRecord, CallStatus, CreateSession, ImportRefusal, PutEnvelope, SessionClosure, SessionHead,
    SessionRecord, SessionState, SessionStatus, UpdateSession,
};

pub mod contract;
mod fixtures;
pub mod races;

pub use contract::*;
use fixtures::*;
pub use races::*;

/// Every field round-trips (the plan's JSON, the import, the closure, the
/// source bytes, empty ones included), the first envelope version is
/// stored with the session, and calls come back ordered by `seq`.
pub async fn sessions_create_and_get<S: Store>(store: S) {
    assert_eq!(get(&store, "s-full").await, None);
    let sources: Vec<u8> = (0..=255u8).chain([0, 0, 255]).collect();
    let full_state = state(full("s-full", "agent-a"), &sources);
    let env = envelope("env-s-full", "agent-a");
    let o = store
        .create_session(
            full_state.clone(),
            Some(env.clone()),
            Some(import(
                "issuer-a",
                "env-remote",
                3,
                &["no_export"],
                "s-full",
            )),
            crate::audit_if_session_created(vec![draft(
                "@operator",
                "session.open",
                "s-full",
                Verdict::Allow,
                "session_opened",
            )]),
        )
        .await
        .unwrap();
    assert_eq!(o, CreateSession::Created);
    assert_eq!(get(&store, "s-full").await, Some(full_state.clone()));
    assert_eq!(
        store.get_envelope(eid("env-s-full"), None).await.unwrap(),
        Some(env.clone())
    );
    assert_eq!(head_count(&store).await, 1);

    // No envelope, no plan, no import, empty sources.
    let bare_state = state(bare("s-bare", "agent-b", 43), &[]);
    assert_eq!(
        create(&store, bare_state.clone(), None, None).await,
        CreateSession::Created
    );
    let got = get(&store, "s-bare").await.unwrap();
    assert_eq!(got, bare_state);
    assert!(got.sources.is_empty());

    // A cancelled session with its closure, and calls added in neither
    // `seq` nor id order, read back by `seq`.
    let mut session = next(&full_state.session);
    session.status = SessionStatus::Cancelled;
    session.closure = Some(SessionClosure {
        by: Subject::Agent(id("parent")),
        at: Timestamp(60),
        reason: "done: \"enough\" \u{2713}".into(),
    });
    let mut last = call("c-mike", 2);
    last.verdict = Verdict::Escalate;
    last.reason = Reason::from_string("argument_not_vouched:/url".into());
    last.status = CallStatus::Escalated;
    last.escalation_id = Some("esc-1".into());
    last.plan_step = None;
    let u = store
        .update_session(
            update(session.clone(), None, Some(last.clone())),
            1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(u, UpdateSession::Updated);
    let mut first = call("c-zulu", 0);
    first.status = CallStatus::Completed;
    first.result_hash = Some(Digest::of(b"result"));
    first.result_labels = vec![label("pii"), label("financial")];
    first.completed_at = Some(Timestamp(55));
    let mut middle = call("c-alpha", 1);
    middle.verdict = Verdict::Deny;
    middle.status = CallStatus::Denied;
    for (rev, c) in [(2, first.clone()), (3, middle.clone())] {
        session = next(&session);
        let u = store
            .update_session(
                update(session.clone(), None, Some(c)),
                rev,
                audit_if_updated(),
            )
            .await
            .unwrap();
        assert_eq!(u, UpdateSession::Updated);
    }
    let got = get(&store, "s-full").await.unwrap();
    assert_eq!(got.session, session);
    assert_eq!(got.session.revision, 4);
    assert_eq!(
        got.sources, sources,
        "sources untouched by updates without them"
    );
    assert_eq!(got.calls, vec![first, middle, last]);
    assert_eq!(got.call(&cid("c-alpha")).map(|c| c.seq), Some(1));
    heads_agree(&store, "s-full").await;
    heads_agree(&store, "s-bare").await;
    // The session's envelope is not touched by session updates.
    assert_eq!(
        store.get_envelope(eid("env-s-full"), None).await.unwrap(),
        Some(env)
    );
    // The two creates and the three updates.
    assert_eq!(head_count(&store).await, 5);
    assert_chain(&store).await;
}

/// An existing id is `Existing` with the stored state and stores nothing
/// of the second attempt; an envelope id already present is `Duplicate`,
/// and then neither the session, nor its envelope, nor its import note is
/// stored, and nothing is appended.
pub async fn sessions_existing_and_duplicate_envelope<S: Store>(store: S) {
    let first = state(full("s-1", "agent-a"), b"index-1");
    assert_eq!(
        create(
            &store,
            first.clone(),
            Some(envelope("env-s-1", "agent-a")),
            None
        )
        .await,
        CreateSession::Created
    );
    let mut second = state(bare("s-1", "agent-b", 99), b"other");
    second.session.envelope_id = Some(eid("env-second"));
    let o = create(
        &store,
        second,
        Some(envelope("env-second", "agent-b")),
        Some(import("issuer-a", "env-x", 1, &[], "s-1")),
    )
    .await;
    assert_eq!(o, CreateSession::Existing(Box::new(first.clone())));
    assert_eq!(get(&store, "s-1").await, Some(first.clone()));
    assert_eq!(
        store.get_envelope(eid("env-second"), None).await.unwrap(),
        None
    );
    let o = create(
        &store,
        state(bare("s-x", "agent-a", 99), b""),
        None,
        Some(import("issuer-a", "env-x", 1, &[], "s-x")),
    )
    .await;
    assert_eq!(
        o,
        CreateSession::Created,
        "the existing outcome noted no import"
    );
    // The existing outcome was audited as the AuditFn said.
    assert_eq!(
        reasons(&store).await,
        ["session_opened", "session_exists", "session_opened"]
    );

    // An envelope id that is taken (by any envelope).
    let taken = envelope("env-taken", "agent-a");
    let o = store
        .put_envelope(taken.clone(), None, Box::new(|_: &PutEnvelope| Vec::new()))
        .await
        .unwrap();
    assert_eq!(o, PutEnvelope::Written);
    let mut clash = state(bare("s-2", "agent-a", 50), b"x");
    clash.session.envelope_id = Some(eid("env-taken"));
    let mut newer = envelope("env-taken", "agent-b");
    newer.labels = labels(&["financial"]);
    let before = store.audit_head().await.unwrap();
    let err = store
        .create_session(
            clash,
            Some(newer),
            Some(import("issuer-a", "env-y", 1, &[], "s-2")),
            create_audit(1),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Envelope, ref id } if id == "env-taken"),
        "{err:?}"
    );
    assert_eq!(get(&store, "s-2").await, None);
    assert_eq!(
        store.get_envelope(eid("env-taken"), None).await.unwrap(),
        Some(taken)
    );
    assert_eq!(store.audit_head().await.unwrap(), before);
    // The import of the failed create was not noted: it is not a replay.
    let o = create(
        &store,
        state(bare("s-3", "agent-a", 51), b""),
        None,
        Some(import("issuer-a", "env-y", 1, &[], "s-3")),
    )
    .await;
    assert_eq!(o, CreateSession::Created);
    assert_eq!(store.list_sessions(None, 10).await.unwrap().len(), 3);
    assert_chain(&store).await;
}

/// `update_session` is a compare-and-set: a stale revision, a new revision
/// that is not the expected one plus one, and an unknown session conflict
/// and change nothing (stored state and audit head alike).
pub async fn sessions_update_compare_and_set<S: Store>(store: S) {
    let created = state(bare("s-cas", "agent-a", 10), b"v1");
    create(&store, created.clone(), None, None).await;
    let rev2 = SessionRecord {
        policy_version: "conf-2".into(),
        ..next(&created.session)
    };
    let o = store
        .update_session(
            update(rev2.clone(), Some(b"v2".as_slice()), Some(call("c-a", 0))),
            1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    let stored = get(&store, "s-cas").await.unwrap();
    assert_eq!(stored.session, rev2);
    assert_eq!(stored.sources, b"v2");
    assert_eq!(stored.calls, vec![call("c-a", 0)]);
    let head = store.audit_head().await.unwrap();

    let attempts = vec![
        // Stale: the loser of a race expected revision 1.
        (
            update(
                next(&created.session),
                Some(b"stale".as_slice()),
                Some(call("c-b", 1)),
            ),
            1,
        ),
        // The new revision skips one.
        (
            update(
                next(&next(&rev2)),
                Some(b"skip".as_slice()),
                Some(call("c-b", 1)),
            ),
            2,
        ),
        // The new revision does not move.
        (
            update(rev2.clone(), Some(b"same".as_slice()), Some(call("c-b", 1))),
            2,
        ),
        // The new revision goes back.
        (
            update(created.session.clone(), None, Some(call("c-b", 1))),
            2,
        ),
    ];
    for (u, expected) in attempts {
        let o = store
            .update_session(u, expected, audit_if_updated())
            .await
            .unwrap();
        assert_eq!(o, UpdateSession::Conflict { current: Some(2) });
        assert_eq!(get(&store, "s-cas").await, Some(stored.clone()));
        assert_eq!(store.audit_head().await.unwrap(), head);
    }
    let o = store
        .update_session(
            update(
                next(&bare("s-ghost", "agent-a", 1)),
                Some(b"g".as_slice()),
                Some(call("c-g", 0)),
            ),
            1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: None });
    assert_eq!(get(&store, "s-ghost").await, None);
    assert_eq!(store.audit_head().await.unwrap(), head);
    assert_eq!(
        store.list_sessions(None, 10).await.unwrap(),
        vec![rev2.clone()]
    );

    // Empty sources replace the stored ones; `None` keeps them.
    let rev3 = next(&rev2);
    let o = store
        .update_session(
            update(rev3.clone(), Some(b"".as_slice()), None),
            2,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    let got = get(&store, "s-cas").await.unwrap();
    assert_eq!(
        (got.session, got.sources.len(), got.calls.len()),
        (rev3, 0, 1)
    );
    assert_eq!(head_count(&store).await, head.count + 1);
    assert_chain(&store).await;
}

/// A call with a known `call_id` replaces the stored one (its `seq` too);
/// the others are kept.
pub async fn sessions_call_upsert<S: Store>(store: S) {
    let mut session = bare("s-up", "agent-a", 10);
    create(&store, state(session.clone(), b""), None, None).await;
    for (rev, c) in [(1, call("c-a", 0)), (2, call("c-b", 1))] {
        session = next(&session);
        let o = store
            .update_session(
                update(session.clone(), None, Some(c)),
                rev,
                audit_if_updated(),
            )
            .await
            .unwrap();
        assert_eq!(o, UpdateSession::Updated);
    }
    let mut done = call("c-a", 0);
    done.status = CallStatus::Completed;
    done.result_hash = Some(Digest::of(b"out"));
    done.result_labels = vec![label("pii")];
    done.completed_at = Some(Timestamp(70));
    session = next(&session);
    store
        .update_session(
            update(session.clone(), None, Some(done.clone())),
            3,
            audit_if_updated(),
        )
        .await
        .unwrap();
    let got = get(&store, "s-up").await.unwrap();
    assert_eq!(got.calls, vec![done.clone(), call("c-b", 1)]);
    // Replaced with a later position.
    let mut moved = done.clone();
    moved.seq = 5;
    session = next(&session);
    store
        .update_session(
            update(session.clone(), None, Some(moved.clone())),
            4,
            audit_if_updated(),
        )
        .await
        .unwrap();
    let got = get(&store, "s-up").await.unwrap();
    assert_eq!(got.calls, vec![call("c-b", 1), moved]);
    assert_eq!(got.session.revision, 5);
    heads_agree(&store, "s-up").await;
    // The create and the four updates.
    assert_eq!(head_count(&store).await, 5);
}

/// [`Store::get_session_head`] of `id` agrees with
/// [`Store::get_session`]: for no call, for every stored call id, and for
/// an id no call has; with no known revision, another one, and the stored
/// one (then without the index bytes, and only then); returns the state it
/// checked against.
pub async fn heads_agree<S: Store>(store: &S, id: &str) -> SessionState {
    let state = get(store, id).await.expect("the session is stored");
    let calls = u64::try_from(state.calls.len()).unwrap();
    let revision = state.session.revision;
    let expect = |call: Option<CallRecord>, with_sources: bool| SessionHead {
        session: state.session.clone(),
        sources: with_sources.then(|| state.sources.clone()),
        calls,
        call,
    };
    let knowns = [
        (None, true),
        (Some(revision - 1), true),
        (Some(revision + 1), true),
        (Some(u64::MAX), true),
        (Some(revision), false),
    ];
    for (known, with_sources) in knowns {
        assert_eq!(
            store.get_session_head(sid(id), None, known).await.unwrap(),
            Some(expect(None, with_sources)),
            "head of `{id}` without a call, known revision {known:?}"
        );
        for c in &state.calls {
            assert_eq!(
                store
                    .get_session_head(sid(id), Some(c.call_id.clone()), known)
                    .await
                    .unwrap(),
                Some(expect(Some(c.clone()), with_sources)),
                "head of `{id}` with call `{}`, known revision {known:?}",
                c.call_id
            );
        }
        assert_eq!(
            store
                .get_session_head(sid(id), Some(cid("c-never-decided")), known)
                .await
                .unwrap(),
            Some(expect(None, with_sources)),
            "head of `{id}` with an unknown call, known revision {known:?}"
        );
    }
    state
}

/// The head of a session (row, index, number of calls, one call by id)
/// agrees with the whole session after every kind of change: calls
/// inserted, one replaced in place and moved, new sources, a conflicting
/// update (nothing changes), a cancel; an unknown session has none, even
/// with a call id another session holds.
pub async fn sessions_head<S: Store>(store: S) {
    for known in [None, Some(1)] {
        assert_eq!(
            store
                .get_session_head(sid("s-none"), None, known)
                .await
                .unwrap(),
            None
        );
    }
    let mut session = bare("s-head", "agent-a", 10);
    create(&store, state(session.clone(), b"\x00index"), None, None).await;
    let s = heads_agree(&store, "s-head").await;
    assert!(s.calls.is_empty());
    let head = store
        .get_session_head(sid("s-head"), None, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (head.calls, head.sources.as_deref()),
        (0, Some(&b"\x00index"[..]))
    );

    let mut rev = 1;
    for (i, name) in ["c-zulu", "c-alpha", "c-mike"].into_iter().enumerate() {
        session = next(&session);
        let o = store
            .update_session(
                update(session.clone(), None, Some(call(name, i as u64))),
                rev,
                audit_if_updated(),
            )
            .await
            .unwrap();
        assert_eq!(o, UpdateSession::Updated);
        rev += 1;
        let s = heads_agree(&store, "s-head").await;
        assert_eq!(s.calls.len(), i + 1);
    }
    // A call replaced (same id: the count stays), with new sources.
    let mut done = call("c-alpha", 1);
    done.status = CallStatus::Completed;
    done.result_hash = Some(Digest::of(b"out"));
    done.completed_at = Some(Timestamp(80));
    session = next(&session);
    store
        .update_session(
            update(session.clone(), Some(b"more"), Some(done.clone())),
            rev,
            audit_if_updated(),
        )
        .await
        .unwrap();
    rev += 1;
    heads_agree(&store, "s-head").await;
    // A caller holding the index of the revision before the new sources
    // gets the new bytes.
    let head = store
        .get_session_head(sid("s-head"), Some(cid("c-alpha")), Some(rev - 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head.calls, 3);
    assert_eq!(head.call, Some(done));
    assert_eq!(head.sources, Some(b"more".to_vec()));
    assert_eq!(head.session.revision, rev);

    // A stale update changes nothing the head shows.
    let o = store
        .update_session(
            update(next(&session), None, Some(call("c-late", 3))),
            rev - 1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(rev) });
    let s = heads_agree(&store, "s-head").await;
    assert_eq!(s.calls.len(), 3);
    assert_eq!(
        store
            .get_session_head(sid("s-head"), Some(cid("c-late")), None)
            .await
            .unwrap()
            .unwrap()
            .call,
        None
    );

    // Cancelled, without a call.
    session = next(&session);
    session.status = SessionStatus::Cancelled;
    store
        .update_session(update(session.clone(), None, None), rev, audit_if_updated())
        .await
        .unwrap();
    let s = heads_agree(&store, "s-head").await;
    assert_eq!(s.session.status, SessionStatus::Cancelled);

    // Another session's call id is not this session's; an unknown session
    // has no head whatever the call id.
    create(
        &store,
        state(bare("s-other", "agent-b", 11), b""),
        None,
        None,
    )
    .await;
    let other = heads_agree(&store, "s-other").await;
    assert!(other.calls.is_empty());
    assert_eq!(
        store
            .get_session_head(sid("s-other"), Some(cid("c-zulu")), Some(1))
            .await
            .unwrap()
            .map(|h| (h.calls, h.call)),
        Some((0, None))
    );
    assert_eq!(
        store
            .get_session_head(sid("s-none"), Some(cid("c-zulu")), None)
            .await
            .unwrap(),
        None
    );
}

/// Every outcome is handed to the `AuditFn` and exactly its entries commit
/// with it, in order; an `AuditFn` that returns nothing appends nothing.
pub async fn sessions_audit_follows_outcome<S: Store>(store: S) {
    let s = bare("s-aud", "agent-a", 1);
    let mut imported = state(bare("s-imp", "agent-a", 2), b"");
    imported.session.imported = Some(import("issuer-a", "env-r", 2, &[], "s-imp"));
    let run = |o: CreateSession, expected: CreateSession| assert_eq!(o, expected);
    run(
        store
            .create_session(state(s.clone(), b""), None, None, create_audit(1))
            .await
            .unwrap(),
        CreateSession::Created,
    );
    let o = store
        .create_session(state(s.clone(), b""), None, None, create_audit(2))
        .await
        .unwrap();
    assert!(matches!(o, CreateSession::Existing(_)), "{o:?}");
    run(
        store
            .create_session(
                imported,
                None,
                Some(import("issuer-a", "env-r", 2, &[], "s-imp")),
                create_audit(3),
            )
            .await
            .unwrap(),
        CreateSession::Created,
    );
    let o = store
        .create_session(
            state(bare("s-rep", "agent-a", 3), b""),
            None,
            Some(import("issuer-a", "env-r", 2, &[], "s-rep")),
            create_audit(4),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            o,
            CreateSession::ImportRefused(ImportRefusal::Replayed { .. })
        ),
        "{o:?}"
    );
    let o = store
        .create_session(
            state(bare("s-old", "agent-a", 3), b""),
            None,
            Some(import("issuer-a", "env-r", 1, &[], "s-old")),
            create_audit(5),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            o,
            CreateSession::ImportRefused(ImportRefusal::Downgraded { .. })
        ),
        "{o:?}"
    );
    let o = store
        .update_session(update(next(&s), None, None), 1, update_audit(6))
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    let o = store
        .update_session(update(next(&s), None, None), 1, update_audit(7))
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(2) });
    let o = store
        .update_session(
            update(next(&bare("s-none", "a", 1)), None, None),
            1,
            update_audit(8),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: None });
    // Silent AuditFns.
    let silent = store
        .create_session(
            state(bare("s-quiet", "agent-a", 4), b""),
            None,
            None,
            crate::audit_if_session_created(Vec::new()),
        )
        .await
        .unwrap();
    assert_eq!(silent, CreateSession::Created);
    let o = store
        .update_session(update(next(&s), None, None), 1, audit_if_updated())
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(2) });

    let entries = audit_all(&store).await;
    let got: Vec<(&str, u64)> = entries
        .iter()
        .map(|e| {
            (
                e.draft.reason.as_str(),
                e.draft.details["tag"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("session_opened", 1),
            ("session_exists", 2),
            ("session_opened", 3),
            ("envelope_replayed", 4),
            ("envelope_downgraded", 5),
            ("session_updated", 6),
            ("revision_conflict", 7),
            ("revision_conflict", 8),
        ]
    );
    assert_eq!(entries[6].draft.details["current"], json!(2));
    assert_eq!(entries[7].draft.details["current"], Value::Null);
    assert_chain(&store).await;
}

/// The import rules, decided in the create's transaction against every
/// earlier import of the same `(issuer, envelope_id)`: a first import
/// opens; the same version again is a replay and a lower version or one
/// that drops a restriction a downgrade (nothing stored, not even the
/// session's own envelope); a higher version with the restrictions kept
/// opens even with a lower sensitivity.
pub async fn sessions_import_rules<S: Store>(store: S) {
    let st = &store;
    let open = |session: &str, version: u64, restrictions: &[&str], sensitivity: Sensitivity| {
        let mut imp = import("issuer-a", "env-r", version, restrictions, session);
        imp.sensitivity = sensitivity;
        let mut state = state(bare(session, "agent-a", 5), b"idx");
        state.session.envelope_id = Some(eid(&format!("env-{session}")));
        state.session.imported = Some(imp.clone());
        (
            state,
            Some(envelope(&format!("env-{session}"), "agent-a")),
            Some(imp),
        )
    };
    let refused = |o: CreateSession| match o {
        CreateSession::ImportRefused(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let attempt = move |session: &'static str,
                        version: u64,
                        restrictions: &'static [&'static str],
                        sensitivity: Sensitivity| {
        let (state, env, imp) = open(session, version, restrictions, sensitivity);
        async move { create(st, state, env, imp).await }
    };
    let absent = move |session: &'static str| async move {
        assert_eq!(get(st, session).await, None, "{session} stored");
        assert_eq!(
            st.get_envelope(eid(&format!("env-{session}")), None)
                .await
                .unwrap(),
            None,
            "{session}'s envelope stored"
        );
    };

    let (first, env, imp) = open(
        "s-v3",
        3,
        &["no_export", "no_mail"],
        Sensitivity::Restricted,
    );
    assert_eq!(
        create(&store, first.clone(), env, imp).await,
        CreateSession::Created
    );
    assert_eq!(get(&store, "s-v3").await, Some(first));

    let r = refused(
        attempt(
            "s-again",
            3,
            &["no_export", "no_mail"],
            Sensitivity::Restricted,
        )
        .await,
    );
    assert_eq!(
        r,
        ImportRefusal::Replayed {
            session_id: sid("s-v3")
        }
    );
    absent("s-again").await;
    let r = refused(
        attempt(
            "s-lower",
            2,
            &["no_export", "no_mail", "x"],
            Sensitivity::TopSecret,
        )
        .await,
    );
    assert_eq!(r, ImportRefusal::Downgraded { seen_version: 3 });
    absent("s-lower").await;
    let r = refused(attempt("s-dropped", 4, &["no_export"], Sensitivity::Restricted).await);
    assert_eq!(r, ImportRefusal::Downgraded { seen_version: 3 });
    absent("s-dropped").await;
    // Version 4 was refused, not noted: with its restrictions kept (and a
    // lower sensitivity: a signed declassification) it opens.
    assert_eq!(
        attempt(
            "s-v4",
            4,
            &["no_export", "no_mail", "extra"],
            Sensitivity::Internal
        )
        .await,
        CreateSession::Created
    );
    // Now 4 is the latest: 3 is a replay still (it names its session), and
    // 5 must keep 4's restrictions.
    let r = refused(
        attempt(
            "s-three",
            3,
            &["no_export", "no_mail"],
            Sensitivity::Restricted,
        )
        .await,
    );
    assert_eq!(
        r,
        ImportRefusal::Replayed {
            session_id: sid("s-v3")
        }
    );
    let r = refused(
        attempt(
            "s-five",
            5,
            &["no_export", "no_mail"],
            Sensitivity::Restricted,
        )
        .await,
    );
    assert_eq!(r, ImportRefusal::Downgraded { seen_version: 4 });
    absent("s-five").await;
    // Imports are per issuer and per envelope id.
    let mut other_issuer = import("issuer-b", "env-r", 1, &[], "s-b1");
    other_issuer.sensitivity = Sensitivity::Public;
    let o = create(
        &store,
        state(bare("s-b1", "agent-a", 6), b""),
        None,
        Some(other_issuer),
    )
    .await;
    assert_eq!(o, CreateSession::Created);
    let o = create(
        &store,
        state(bare("s-e1", "agent-a", 6), b""),
        None,
        Some(import("issuer-a", "env-other", 1, &[], "s-e1")),
    )
    .await;
    assert_eq!(o, CreateSession::Created);
    let listed: Vec<String> = store
        .list_sessions(None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id.to_string())
        .collect();
    assert_eq!(listed, ["s-v3", "s-v4", "s-b1", "s-e1"]);
    assert_chain(&store).await;
}

/// Sessions are listed oldest first (creation order, ties included),
/// filtered by agent and cut at `limit`, as their current rows.
pub async fn sessions_list<S: Store>(store: S) {
    assert!(store.list_sessions(None, 10).await.unwrap().is_empty());
    let plan = [
        ("l-1", "agent-a", 10),
        ("l-2", "agent-b", 11),
        ("l-3", "agent-a", 11),
        ("l-4", "agent-c", 11),
        ("l-5", "agent-a", 12),
    ];
    let mut records = Vec::new();
    for (s, agent, at) in plan {
        let r = bare(s, agent, at);
        create(&store, state(r.clone(), b"i"), None, None).await;
        records.push(r);
    }
    // A listed session is its current row.
    records[2] = SessionRecord {
        status: SessionStatus::Cancelled,
        ..next(&records[2])
    };
    let o = store
        .update_session(
            update(records[2].clone(), None, Some(call("c", 0))),
            1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    let pick =
        |idx: &[usize]| -> Vec<SessionRecord> { idx.iter().map(|&i| records[i].clone()).collect() };
    assert_eq!(
        store.list_sessions(None, 100).await.unwrap(),
        pick(&[0, 1, 2, 3, 4])
    );
    assert_eq!(
        store.list_sessions(None, 3).await.unwrap(),
        pick(&[0, 1, 2])
    );
    assert_eq!(
        store.list_sessions(Some(id("agent-a")), 100).await.unwrap(),
        pick(&[0, 2, 4])
    );
    assert_eq!(
        store.list_sessions(Some(id("agent-a")), 2).await.unwrap(),
        pick(&[0, 2])
    );
    assert_eq!(
        store.list_sessions(Some(id("agent-c")), 1).await.unwrap(),
        pick(&[3])
    );
    assert!(
        store
            .list_sessions(Some(id("agent-z")), 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.list_sessions(None, 0).await.unwrap().is_empty());
    assert_eq!(
        store.list_sessions(None, usize::MAX).await.unwrap().len(),
        5
    );
}
