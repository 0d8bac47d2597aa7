//! The session store's contract where a backend could silently store what
//! it should refuse: a create whose envelope is not the session's, a call
//! at a position another call holds; and the one order sessions are listed
//! in.

use super::fixtures::*;
use super::*;

/// Everything a refused request must leave as it was: the sessions listed,
/// the audit head, and the envelopes named.
async fn snapshot<S: Store>(
    store: &S,
    envelopes: &[&str],
) -> (
    Vec<SessionRecord>,
    ChainHead,
    Vec<Option<warden_core::envelope::EnvelopeRecord>>,
) {
    let mut stored = Vec::new();
    for e in envelopes {
        stored.push(store.get_envelope(eid(e), None).await.unwrap());
    }
    (
        store.list_sessions(None, usize::MAX).await.unwrap(),
        store.audit_head().await.unwrap(),
        stored,
    )
}

/// A create must be consistent in itself: an envelope given for a session
/// without an envelope id, or with another id, is `Invalid`; a session
/// naming an envelope it neither gives nor finds stored is `NotFound` of
/// that envelope; two starting calls with one id or one `seq` are
/// `Duplicate` of a call. Each stores nothing: no session, no envelope, no
/// import note (the same import is then accepted), nothing appended. A
/// session naming an envelope already stored, without giving it, shares
/// it, untouched.
pub async fn sessions_create_refuses_inconsistent<S: Store>(store: S) {
    let touched = ["env-given", "env-named", "env-absent"];
    let before = snapshot(&store, &touched).await;
    async fn refuse<S: Store>(
        store: &S,
        state: SessionState,
        envelope: Option<&str>,
    ) -> StoreError {
        store
            .create_session(
                state,
                envelope.map(|e| super::fixtures::envelope(e, "agent-a")),
                Some(import("issuer-a", "env-remote", 1, &[], "s-bad")),
                create_audit(9),
            )
            .await
            .unwrap_err()
    }

    // An envelope for a session without an envelope id.
    let err = refuse(
        &store,
        state(bare("s-bad", "agent-a", 10), b"i"),
        Some("env-given"),
    )
    .await;
    assert_eq!(
        err,
        StoreError::invalid(
            Entity::Session,
            "s-bad",
            "envelope `env-given` given for a session without an envelope id"
        ),
    );
    // An envelope other than the session's.
    let mut named = state(bare("s-bad", "agent-a", 10), b"i");
    named.session.envelope_id = Some(eid("env-named"));
    let err = refuse(&store, named.clone(), Some("env-given")).await;
    assert_eq!(
        err,
        StoreError::invalid(
            Entity::Session,
            "s-bad",
            "envelope `env-given` given for a session whose envelope is `env-named`"
        ),
    );
    // An envelope id without the envelope, none stored.
    let mut absent = state(bare("s-bad", "agent-a", 10), b"i");
    absent.session.envelope_id = Some(eid("env-absent"));
    let err = refuse(&store, absent, None).await;
    assert_eq!(err, StoreError::not_found(Entity::Envelope, "env-absent"));
    // Starting calls at one position, or with one id.
    let mut two_at_zero = state(bare("s-bad", "agent-a", 10), b"i");
    two_at_zero.calls = vec![call("c-a", 0), call("c-b", 0)];
    let err = refuse(&store, two_at_zero, None).await;
    assert_eq!(err, StoreError::duplicate(Entity::Call, "s-bad/#0"));
    let mut one_id_twice = state(bare("s-bad", "agent-a", 10), b"i");
    one_id_twice.calls = vec![call("c-a", 0), call("c-a", 1)];
    let err = refuse(&store, one_id_twice, None).await;
    assert_eq!(err, StoreError::duplicate(Entity::Call, "s-bad/c-a"));

    assert_eq!(get(&store, "s-bad").await, None);
    assert_eq!(snapshot(&store, &touched).await, before);

    // The import of the refused creates was never noted.
    let o = store
        .create_session(
            named.clone(),
            Some(super::fixtures::envelope("env-named", "agent-a")),
            Some(import("issuer-a", "env-remote", 1, &[], "s-bad")),
            create_audit(1),
        )
        .await
        .unwrap();
    assert_eq!(o, CreateSession::Created);
    assert_eq!(get(&store, "s-bad").await, Some(named));
    // A second session sharing the stored envelope, without giving it.
    let shared_env = store.get_envelope(eid("env-named"), None).await.unwrap();
    assert!(shared_env.is_some());
    let mut sharing = state(bare("s-share", "agent-a", 11), b"j");
    sharing.session.envelope_id = Some(eid("env-named"));
    assert_eq!(
        create(&store, sharing.clone(), None, None).await,
        CreateSession::Created
    );
    assert_eq!(get(&store, "s-share").await, Some(sharing));
    assert_eq!(
        store.get_envelope(eid("env-named"), None).await.unwrap(),
        shared_env
    );
    // Starting calls at distinct positions are stored, by `seq`.
    let mut started = state(bare("s-started", "agent-a", 12), b"k");
    started.calls = vec![call("c-z", 0), call("c-y", 1)];
    assert_eq!(
        create(&store, started.clone(), None, None).await,
        CreateSession::Created
    );
    assert_eq!(get(&store, "s-started").await, Some(started));
    // The refusals appended nothing; the three creates one entry each.
    assert_eq!(head_count(&store).await, before.1.count + 3);
    assert_chain(&store).await;
}

/// A call's `seq` is unique within its session: a new call at a position
/// another call holds, and a call moved onto one, are `Duplicate` of the
/// call `session/#seq`, and nothing changes (the row and its revision, the
/// calls, the audit head); the same `seq` in another session, a call
/// replaced at its own position and a call moved to a free one are
/// stored. A stale revision is still a conflict first.
pub async fn sessions_call_seq_unique<S: Store>(store: S) {
    let mut session = bare("s-seq", "agent-a", 10);
    create(&store, state(session.clone(), b"i"), None, None).await;
    create(
        &store,
        state(bare("s-seq-2", "agent-a", 11), b""),
        None,
        None,
    )
    .await;
    let mut rev = 1;
    for c in [call("c-a", 0), call("c-b", 1)] {
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
        rev += 1;
    }
    let stored = get(&store, "s-seq").await.unwrap();
    let head = store.audit_head().await.unwrap();

    // A new call at a taken position, with new sources: refused whole.
    let err = store
        .update_session(
            update(next(&session), Some(b"new"), Some(call("c-c", 1))),
            rev,
            audit_if_updated(),
        )
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::duplicate(Entity::Call, "s-seq/#1"));
    // A stored call moved onto another's position.
    let err = store
        .update_session(
            update(next(&session), None, Some(call("c-b", 0))),
            rev,
            audit_if_updated(),
        )
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::duplicate(Entity::Call, "s-seq/#0"));
    assert_eq!(get(&store, "s-seq").await, Some(stored.clone()));
    assert_eq!(store.audit_head().await.unwrap(), head);
    heads_agree(&store, "s-seq").await;

    // A stale revision conflicts, whatever its call.
    let o = store
        .update_session(
            update(next(&session), None, Some(call("c-c", 1))),
            rev - 1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(rev) });
    assert_eq!(get(&store, "s-seq").await, Some(stored));

    // The same position in another session.
    let o = store
        .update_session(
            update(
                next(&bare("s-seq-2", "agent-a", 11)),
                None,
                Some(call("c-a", 0)),
            ),
            1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Updated);
    // A call replaced at its own position, then moved to a free one, and
    // a new call at the position it left.
    let mut done = call("c-b", 1);
    done.status = CallStatus::Completed;
    let mut moved = done.clone();
    moved.seq = 2;
    for c in [done, moved.clone(), call("c-c", 1)] {
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
        rev += 1;
    }
    let got = heads_agree(&store, "s-seq").await;
    assert_eq!(got.calls, vec![call("c-a", 0), call("c-c", 1), moved]);
    assert_eq!(got.session.revision, rev);
    assert_eq!(head_count(&store).await, head.count + 4);
    assert_chain(&store).await;
}

/// Sessions are listed in the order their creates were stored, whatever
/// their `created_at` (here newest first) and ids (here descending), with
/// or without an agent filter and a limit; a refused create takes no
/// place.
pub async fn sessions_list_in_creation_order<S: Store>(store: S) {
    let plan = [
        ("o-zulu", "agent-a", 50),
        ("o-yankee", "agent-b", 40),
        ("o-xray", "agent-a", 40),
        ("o-whisky", "agent-a", 30),
        ("o-victor", "agent-b", 10),
    ];
    let mut records = Vec::new();
    for (i, (s, agent, at)) in plan.into_iter().enumerate() {
        if i == 2 {
            // Refused: stores nothing and takes no place.
            let mut bad = state(bare("o-refused", "agent-a", 45), b"");
            bad.session.envelope_id = Some(eid("env-none"));
            store
                .create_session(bad, None, None, create_audit(0))
                .await
                .unwrap_err();
        }
        let r = bare(s, agent, at);
        create(&store, state(r.clone(), b"i"), None, None).await;
        records.push(r);
    }
    let pick =
        |idx: &[usize]| -> Vec<SessionRecord> { idx.iter().map(|&i| records[i].clone()).collect() };
    assert_eq!(
        store.list_sessions(None, 100).await.unwrap(),
        pick(&[0, 1, 2, 3, 4])
    );
    assert_eq!(store.list_sessions(None, 2).await.unwrap(), pick(&[0, 1]));
    assert_eq!(
        store.list_sessions(Some(id("agent-a")), 100).await.unwrap(),
        pick(&[0, 2, 3])
    );
    assert_eq!(
        store.list_sessions(Some(id("agent-b")), 1).await.unwrap(),
        pick(&[1])
    );
}

/// The update that records a result appends to the stored index
/// (`IndexChange::Append`) instead of rewriting it: the index read back
/// (whole session and head alike) is the created bytes followed by every
/// applied append, in order, through updates that carry no index change
/// and after a replace; an append that conflicts, or whose call takes
/// another call's position, adds nothing; an empty session index takes
/// appends too; and a session's appends never show in another's.
pub async fn sessions_index_appends<S: Store>(store: S) {
    use crate::IndexChange::{Append, Replace};
    use crate::SessionUpdate;
    let mut session = bare("s-app", "agent-a", 10);
    create(&store, state(session.clone(), b"base"), None, None).await;
    create(
        &store,
        state(bare("s-app-2", "agent-a", 11), b""),
        None,
        None,
    )
    .await;
    let mut expected = b"base".to_vec();
    let mut rev = 1;
    let steps: [(Option<crate::IndexChange>, Option<CallRecord>); 5] = [
        (Some(Append(b"+one".to_vec())), Some(call("c-a", 0))),
        (None, Some(call("c-b", 1))),
        (Some(Append(b"+two".to_vec())), None),
        (Some(Append(Vec::new())), None),
        (Some(Append(b"+three\x00".to_vec())), Some(call("c-c", 2))),
    ];
    for (change, c) in steps {
        session = next(&session);
        if let Some(change) = &change {
            change.clone().apply_to(&mut expected);
        }
        let o = store
            .update_session(
                SessionUpdate {
                    session: session.clone(),
                    sources: change,
                    call: c,
                },
                rev,
                audit_if_updated(),
            )
            .await
            .unwrap();
        assert_eq!(o, UpdateSession::Updated);
        rev += 1;
        let s = heads_agree(&store, "s-app").await;
        assert_eq!(s.sources, expected, "after revision {rev}");
    }
    assert_eq!(expected, b"base+one+two+three\x00");
    // A caller holding an older revision gets every part.
    let head = store
        .get_session_head(sid("s-app"), None, Some(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head.sources.as_deref(), Some(expected.as_slice()));

    // Refused appends add nothing: a stale revision, a taken position.
    let stored = get(&store, "s-app").await.unwrap();
    let audit = store.audit_head().await.unwrap();
    let o = store
        .update_session(
            SessionUpdate {
                session: next(&session),
                sources: Some(Append(b"+stale".to_vec())),
                call: None,
            },
            rev - 1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(o, UpdateSession::Conflict { current: Some(rev) });
    let err = store
        .update_session(
            SessionUpdate {
                session: next(&session),
                sources: Some(Append(b"+taken".to_vec())),
                call: Some(call("c-d", 1)),
            },
            rev,
            audit_if_updated(),
        )
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::duplicate(Entity::Call, "s-app/#1"));
    assert_eq!(get(&store, "s-app").await, Some(stored));
    assert_eq!(store.audit_head().await.unwrap(), audit);

    // A replace drops every part; appends then follow it.
    for change in [Replace(b"fresh".to_vec()), Append(b"+after".to_vec())] {
        session = next(&session);
        store
            .update_session(
                SessionUpdate {
                    session: session.clone(),
                    sources: Some(change),
                    call: None,
                },
                rev,
                audit_if_updated(),
            )
            .await
            .unwrap();
        rev += 1;
    }
    assert_eq!(heads_agree(&store, "s-app").await.sources, b"fresh+after");

    // An empty index takes appends; the other session is untouched.
    let other = next(&bare("s-app-2", "agent-a", 11));
    store
        .update_session(
            SessionUpdate {
                session: other,
                sources: Some(Append(b"x".to_vec())),
                call: None,
            },
            1,
            audit_if_updated(),
        )
        .await
        .unwrap();
    assert_eq!(heads_agree(&store, "s-app-2").await.sources, b"x");
    assert_eq!(heads_agree(&store, "s-app").await.sources, b"fresh+after");
}
