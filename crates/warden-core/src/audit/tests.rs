use super::*;
use serde_json::json;

fn draft(i: u64) -> AuditDraft {
    AuditDraft {
        time: Timestamp(i as i64),
        subject: "researcher".into(),
        operation: "memory.read".into(),
        resource: format!("project.k{i}"),
        verdict: Verdict::Allow,
        reason: "visible_from:report_manager".into(),
        policy_version: "lab-1".into(),
        details: json!({"b": 1, "a": 2}),
    }
}

fn chain(n: u64) -> Vec<AuditEntry> {
    let mut prev = Digest::GENESIS;
    (1..=n)
        .map(|i| {
            let e = draft(i).seal(i, prev);
            prev = e.hash;
            e
        })
        .collect()
}

fn verify(entries: &[AuditEntry]) -> Result<ChainHead, ChainBreak> {
    let mut v = ChainVerifier::new();
    for e in entries {
        v.push(e)?;
    }
    Ok(v.finish())
}

#[test]
fn intact_chain_verifies() {
    let c = chain(5);
    let head = verify(&c).unwrap();
    assert_eq!(head.count, 5);
    assert_eq!(head.hash, c[4].hash);
}

#[test]
fn every_field_is_covered() {
    let c = chain(3);
    type Edit = Box<dyn Fn(&mut AuditEntry)>;
    let edits: Vec<Edit> = vec![
        Box::new(|e| e.draft.time = Timestamp(99)),
        Box::new(|e| e.draft.subject = "x".into()),
        Box::new(|e| e.draft.operation = "x".into()),
        Box::new(|e| e.draft.resource = "x".into()),
        Box::new(|e| e.draft.verdict = Verdict::Deny),
        Box::new(|e| e.draft.reason = "x".into()),
        Box::new(|e| e.draft.policy_version = "x".into()),
        Box::new(|e| e.draft.details = json!({"a": 2, "b": 2})),
    ];
    for edit in edits {
        let mut bad = c.clone();
        edit(&mut bad[1]);
        assert_eq!(verify(&bad), Err(ChainBreak::Altered { seq: 2 }));
    }
}

#[test]
fn deletion_reorder_and_truncation_are_detected() {
    let c = chain(4);
    let mut deleted = c.clone();
    deleted.remove(1);
    assert_eq!(verify(&deleted).unwrap_err().seq(), 3);
    let mut swapped = c.clone();
    swapped.swap(1, 2);
    assert_eq!(verify(&swapped).unwrap_err().seq(), 3);
    let truncated = &c[..2];
    let mut v = ChainVerifier::new();
    for e in truncated {
        v.push(e).unwrap();
    }
    assert_eq!(
        v.finish_against(4, &c[3].hash),
        Err(ChainBreak::Truncated {
            last_seq: 2,
            head_seq: 4
        })
    );
}

#[test]
fn the_encoding_is_stable() {
    // A known answer: changing the encoding breaks every stored chain.
    let e = draft(1).seal(1, Digest::GENESIS);
    assert_eq!(
        e.hash.to_hex(),
        "527cbd671c115850b9ffdcc49baa8f0acd0ff8a0f5d5268b48b4c2ea43007ec4"
    );
}

#[test]
fn borrowed_fields_hash_and_verify_alike() {
    let c = chain(3);
    let mut v = ChainVerifier::new();
    for e in &c {
        let details = crate::canonical::to_canonical(&e.draft.details);
        let r = EntryRef {
            seq: e.seq,
            time: e.draft.time,
            subject: &e.draft.subject,
            operation: &e.draft.operation,
            resource: &e.draft.resource,
            verdict: e.draft.verdict.as_str(),
            reason: &e.draft.reason,
            policy_version: &e.draft.policy_version,
            details: &details,
            prev_hash: e.prev_hash,
            hash: e.hash,
        };
        assert_eq!(r.computed_hash(), e.hash);
        v.push_ref(&r).unwrap();
    }
    assert_eq!(v.finish().hash, c[2].hash);
    let e = &c[0];
    let bad = EntryRef {
        seq: 1,
        time: e.draft.time,
        subject: "someone else",
        operation: &e.draft.operation,
        resource: &e.draft.resource,
        verdict: e.draft.verdict.as_str(),
        reason: &e.draft.reason,
        policy_version: &e.draft.policy_version,
        details: b"{}",
        prev_hash: e.prev_hash,
        hash: e.hash,
    };
    assert_eq!(
        ChainVerifier::new().push_ref(&bad),
        Err(ChainBreak::Altered { seq: 1 })
    );
}

#[test]
fn key_order_of_details_does_not_matter() {
    let mut a = draft(1);
    a.details = json!({"x": 1, "y": 2});
    let mut b = draft(1);
    b.details = json!({"y": 2, "x": 1});
    assert_eq!(
        entry_hash(1, &a, &Digest::GENESIS),
        entry_hash(1, &b, &Digest::GENESIS)
    );
}

proptest::proptest! {
    /// The hash is the tag, the position, the body and the previous hash,
    /// in that order: what a store sealing inside its database computes
    /// from [`entry_body`] alone.
    #[test]
    fn the_hash_is_the_tag_the_position_the_body_and_the_previous_hash(
        seq in proptest::prelude::any::<u64>(),
        time in proptest::prelude::any::<i64>(),
        subject in "\\PC{0,12}",
        reason in "[a-z_:]{0,20}",
        key in "\\PC{0,8}",
        prev in proptest::prelude::any::<[u8; 32]>(),
    ) {
        let mut d = draft(1);
        d.time = Timestamp(time);
        d.subject = subject;
        d.reason = reason;
        d.details = json!({ key: [1.5, "x", null] });
        let mut input = ENTRY_HASH_TAG.to_vec();
        input.extend_from_slice(&8u64.to_le_bytes());
        input.extend_from_slice(&seq.to_le_bytes());
        input.extend_from_slice(&entry_body(&d));
        input.extend_from_slice(&32u64.to_le_bytes());
        input.extend_from_slice(&prev);
        proptest::prop_assert_eq!(Digest::of(&input), entry_hash(seq, &d, &Digest(prev)));
    }
}
