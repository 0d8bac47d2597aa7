//! Audit entries sealed inside the database (`warden_append_sealed`,
//! schema version 9): what an audit-only group falls back to when its
//! store's prediction of the head is wrong. The database's hash is
//! `entry_hash` exactly, for any content; two stores taking turns (each
//! one's prediction made wrong by the other) form one verifying chain; a
//! database that seals differently is reported as corrupt, never
//! acknowledged.

use serde_json::json;
use warden_core::audit::{AuditDraft, ChainHead, Digest, entry_body, entry_hash};
use warden_core::decision::Verdict;
use warden_core::time::Timestamp;
use warden_store::{Store, StoreError};

use crate::support::*;

/// Drafts whose fields hold what a text column cannot (NUL), the store's
/// own escape character, other scripts, emoji, empty and long fields,
/// negative and extreme times, and nested details with escapes.
fn awkward(i: usize) -> AuditDraft {
    let subjects = [
        "researcher",
        "",
        "nul\0inside",
        "\u{E000}escape\u{E000}\0",
        "ünïcödé-агент-代理",
        "emoji-\u{1F600}",
    ];
    let verdicts = [
        Verdict::Allow,
        Verdict::Deny,
        Verdict::Escalate,
        Verdict::Constrain,
    ];
    let times = [0, -1, i64::MIN, i64::MAX, 1_700_000_000_000];
    AuditDraft {
        time: Timestamp(times[i % times.len()] ^ i as i64),
        subject: subjects[i % subjects.len()].to_owned(),
        operation: format!("memory.read{}", "x".repeat(i % 3 * 40)),
        resource: format!("project.k{i}\u{2028}\t\"quoted\""),
        verdict: verdicts[i % verdicts.len()],
        reason: if i.is_multiple_of(5) {
            String::new()
        } else {
            format!("visible_from:a{i}")
        },
        policy_version: "pg-sealed".to_owned(),
        details: json!({
            "i": i,
            "z": [1.5, -0.0, 1e300, null, true, "a\"b\\c\u{0001}"],
            "nested": {"b": {"\u{00e9}": "\0"}, "a": []},
        }),
    }
}

/// The chain `drafts` make after `head`, as this server seals it.
fn sealed_after(head: ChainHead, drafts: &[AuditDraft]) -> Vec<ChainHead> {
    let mut at = head;
    drafts
        .iter()
        .map(|d| {
            let seq = at.seq + 1;
            at = ChainHead {
                count: at.count + 1,
                seq,
                hash: entry_hash(seq, d, &at.hash),
            };
            at
        })
        .collect()
}

/// The function itself, called on a raw connection: each position and
/// hash it returns (and stores) is what `entry_hash` gives, for groups of
/// 1 to 9 awkward drafts, one after another.
#[tokio::test]
async fn the_database_seals_each_entry_as_entry_hash_does() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let client = scratch.client().await;
    let mut head = store.audit_head().await.unwrap();
    let mut n = 0;
    for group in 1..=9 {
        let drafts: Vec<AuditDraft> = (n..n + group).map(awkward).collect();
        n += group;
        // What the columns hold does not enter the hash (the body does):
        // text without NUL, which a text column refuses.
        let text = |s: &str| s.replace('\0', "?");
        let times: Vec<i64> = drafts.iter().map(|d| d.time.0).collect();
        let subjects: Vec<String> = drafts.iter().map(|d| text(&d.subject)).collect();
        let ops: Vec<String> = drafts.iter().map(|d| text(&d.operation)).collect();
        let res: Vec<String> = drafts.iter().map(|d| text(&d.resource)).collect();
        let verdicts: Vec<&str> = drafts.iter().map(|d| d.verdict.as_str()).collect();
        let reasons: Vec<String> = drafts.iter().map(|d| text(&d.reason)).collect();
        let policies: Vec<String> = drafts.iter().map(|d| d.policy_version.clone()).collect();
        let details: Vec<String> = drafts.iter().map(|d| d.details.to_string()).collect();
        let bodies: Vec<Vec<u8>> = drafts.iter().map(entry_body).collect();
        let row = client
            .query_one(
                "SELECT base_seq, base_hash, seqs, hashes FROM warden_append_sealed(\
                 $1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    &times, &subjects, &ops, &res, &verdicts, &reasons, &policies, &details,
                    &bodies,
                ],
            )
            .await
            .unwrap();
        let base_seq: i64 = row.get(0);
        let base_hash: Vec<u8> = row.get(1);
        assert_eq!(base_seq as u64, head.seq);
        assert_eq!(base_hash, head.hash.0.to_vec());
        let seqs: Vec<i64> = row.get(2);
        let hashes: Vec<Vec<u8>> = row.get(3);
        let expected = sealed_after(head, &drafts);
        assert_eq!(
            seqs,
            expected.iter().map(|h| h.seq as i64).collect::<Vec<_>>()
        );
        assert_eq!(
            hashes,
            expected
                .iter()
                .map(|h| h.hash.0.to_vec())
                .collect::<Vec<_>>(),
            "group of {group}: the database's hashes are entry_hash's"
        );
        head = *expected.last().unwrap();
        let stored: Vec<(i64, Vec<u8>, Vec<u8>)> = client
            .query(
                "SELECT seq, prev_hash, hash FROM audit_log WHERE seq > $1 ORDER BY seq",
                &[&base_seq],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let mut prev = Digest(base_hash.try_into().unwrap());
        assert_eq!(stored.len(), group);
        for ((seq, p, h), e) in stored.into_iter().zip(&expected) {
            assert_eq!(
                (seq as u64, p, h.clone()),
                (e.seq, prev.0.to_vec(), e.hash.0.to_vec())
            );
            prev = e.hash;
        }
        assert_eq!(
            store.audit_head().await.unwrap(),
            head,
            "the head moved with them"
        );
    }
    // An empty group changes nothing and reports the head.
    let empty: Vec<String> = Vec::new();
    let none: Vec<i64> = Vec::new();
    let no_bodies: Vec<Vec<u8>> = Vec::new();
    let row = client
        .query_one(
            "SELECT base_seq, seqs FROM warden_append_sealed($1, $2, $2, $2, $2, $2, $2, $2, $3)",
            &[&none, &empty, &no_bodies],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0) as u64, head.seq);
    assert!(row.get::<_, Vec<i64>>(1).is_empty());
    assert_eq!(store.audit_head().await.unwrap(), head);
}

/// Two stores (two servers) append in turn, one group at a time: each
/// finds the head moved by the other since its last group, so its
/// prediction misses and the group is sealed in the database. Every
/// acknowledged head is what this server would have sealed, the entries
/// read back are the drafts (NUL and the escape character included), and
/// the chain verifies.
#[tokio::test]
async fn two_stores_taking_turns_seal_in_the_database_and_the_chain_verifies() {
    let scratch = scratch_or_skip!();
    let a = scratch.store().await;
    let b = scratch.store().await;
    let mut head = a.audit_head().await.unwrap();
    let mut all = Vec::new();
    for i in 0..40 {
        let s = if i % 2 == 0 { &a } else { &b };
        let drafts: Vec<AuditDraft> = (0..1 + i % 3).map(|k| awkward(i * 3 + k)).collect();
        let acknowledged = s.append_audit(drafts.clone()).await.unwrap();
        let expected = sealed_after(head, &drafts);
        head = *expected.last().unwrap();
        assert_eq!(acknowledged, head, "append {i}");
        all.extend(drafts);
    }
    let verified = assert_chain(&a).await;
    assert_eq!(verified, head);
    let stored: Vec<AuditDraft> = audit_all(&b).await.into_iter().map(|e| e.draft).collect();
    assert_eq!(stored, all);
}

/// A database whose `warden_append_sealed` hashes otherwise (here: one
/// that inserts nothing and answers made-up hashes) is reported as
/// corrupt, and the append is not acknowledged.
#[tokio::test]
async fn a_database_that_seals_differently_is_reported_corrupt() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    scratch
        .client()
        .await
        .batch_execute(
            "CREATE OR REPLACE FUNCTION warden_append_sealed(\
               p_times BIGINT[], p_subjects TEXT[], p_ops TEXT[], p_res TEXT[], \
               p_verdicts TEXT[], p_reasons TEXT[], p_policies TEXT[], p_details TEXT[], \
               p_bodies BYTEA[]) \
             RETURNS TABLE (base_seq BIGINT, base_hash BYTEA, seqs BIGINT[], hashes BYTEA[]) \
             LANGUAGE sql AS $$ \
               SELECT a.seq, a.hash, ARRAY[a.seq + 1], ARRAY[sha256('not the entry'::bytea)] \
               FROM audit_head a $$",
        )
        .await
        .unwrap();
    // A fresh store has no prediction: its first group is sealed there.
    let err = store.append_audit(vec![numbered(1)]).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { detail, .. } if detail.contains("sealed entry 1 differently")),
        "{err:?}"
    );
    assert_eq!(head_count(&store).await, 0);
}
