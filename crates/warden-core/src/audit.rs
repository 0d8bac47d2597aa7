//! The decision log's entries and their hash chain.
//!
//! Every decision becomes an [`AuditEntry`]. Each entry's hash covers every
//! field (sequence number, time, subject, operation, resource, verdict,
//! reason, policy version, details) and the previous entry's hash, so an
//! edit, a deletion, an insertion or a reordering anywhere breaks the chain
//! at that entry. The encoding is fixed and length-prefixed (see
//! [`entry_hash`]); details are hashed in canonical JSON.
//!
//! Truncation of the tail cannot be seen from the entries alone: the chain up
//! to any point is valid. Detecting it needs the head (last sequence number
//! and hash) recorded somewhere the writer of the log cannot rewrite; the
//! verifier takes such an anchor ([`ChainVerifier::finish_against`]).
//!
//! Secret values and full argument payloads never enter an entry: callers put
//! ids, names and hashes into `details`, never values.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::canonical::write_canonical;
use crate::decision::{Decision, Verdict};
use crate::time::Timestamp;

/// The subject recorded for operations the operator (not an agent) performs.
pub const OPERATOR_SUBJECT: &str = crate::decision::Subject::OPERATOR;

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The all-zero digest that precedes the first entry.
    pub const GENESIS: Digest = Digest([0; 32]);

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parse lower- or upper-case hex.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }

    /// SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&s).ok_or_else(|| serde::de::Error::custom("expected 64 hex digits"))
    }
}

/// An entry before it has a place in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditDraft {
    /// When the decision was made.
    pub time: Timestamp,
    /// The acting agent, or [`OPERATOR_SUBJECT`].
    pub subject: String,
    /// What was attempted.
    pub operation: String,
    /// On what.
    pub resource: String,
    /// The outcome.
    pub verdict: Verdict,
    /// The stable reason code.
    pub reason: String,
    /// The policy version the decision was made under.
    pub policy_version: String,
    /// Extra evidence: ids, names, hashes, obligations. Never secret values.
    #[serde(default)]
    pub details: Value,
}

impl AuditDraft {
    /// The draft recording `decision`.
    pub fn from_decision(decision: &Decision) -> Self {
        let details = if decision.obligations.is_empty() {
            Value::Null
        } else {
            serde_json::json!({ "obligations": decision.obligations })
        };
        Self {
            time: decision.time,
            subject: decision.subject.to_string(),
            operation: decision.operation.clone(),
            resource: decision.resource.clone(),
            verdict: decision.verdict,
            reason: decision.reason.to_string(),
            policy_version: decision.policy_version.clone(),
            details,
        }
    }

    /// Attach `details` (merged into an object).
    pub fn with_details(mut self, details: Value) -> Self {
        match (&mut self.details, details) {
            (Value::Object(existing), Value::Object(more)) => existing.extend(more),
            (slot, more) => *slot = more,
        }
        self
    }

    /// Place the draft at `seq` after `prev`.
    pub fn seal(self, seq: u64, prev_hash: Digest) -> AuditEntry {
        let hash = entry_hash(seq, &self, &prev_hash);
        AuditEntry {
            seq,
            draft: self,
            prev_hash,
            hash,
        }
    }
}

/// One entry of the decision log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Position in the chain, from 1, without gaps.
    pub seq: u64,
    /// The recorded decision.
    #[serde(flatten)]
    pub draft: AuditDraft,
    /// The previous entry's hash ([`Digest::GENESIS`] for the first).
    pub prev_hash: Digest,
    /// This entry's hash.
    pub hash: Digest,
}

fn put_field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The hash of an entry: SHA-256 over a domain tag, then each field as an
/// 8-byte little-endian length followed by its bytes, in this order: seq
/// (8 bytes LE), time (8 bytes LE, ms), subject, operation, resource,
/// verdict, reason, policy version, canonical JSON of details, previous hash.
pub fn entry_hash(seq: u64, draft: &AuditDraft, prev_hash: &Digest) -> Digest {
    let mut details = Vec::new();
    write_canonical(&draft.details, &mut details);
    hash_fields(&EntryRef {
        seq,
        time: draft.time,
        subject: &draft.subject,
        operation: &draft.operation,
        resource: &draft.resource,
        verdict: draft.verdict.as_str(),
        reason: &draft.reason,
        policy_version: &draft.policy_version,
        details: &details,
        prev_hash: *prev_hash,
        hash: Digest::GENESIS,
    })
}

fn hash_fields(e: &EntryRef<'_>) -> Digest {
    let mut h = Sha256::new();
    h.update(b"warden.audit.v1\0");
    put_field(&mut h, &e.seq.to_le_bytes());
    put_field(&mut h, &e.time.0.to_le_bytes());
    put_field(&mut h, e.subject.as_bytes());
    put_field(&mut h, e.operation.as_bytes());
    put_field(&mut h, e.resource.as_bytes());
    put_field(&mut h, e.verdict.as_bytes());
    put_field(&mut h, e.reason.as_bytes());
    put_field(&mut h, e.policy_version.as_bytes());
    put_field(&mut h, e.details);
    put_field(&mut h, &e.prev_hash.0);
    Digest(h.finalize().into())
}

/// An entry's fields borrowed as a store holds them, so a verifier can hash
/// entries straight from storage without building an [`AuditEntry`] (no
/// allocation, no JSON parsing). A store that keeps `details` as their
/// canonical JSON text (see [`crate::canonical`]) hashes exactly what it
/// stores; any other byte there is an alteration.
#[derive(Debug, Clone, Copy)]
pub struct EntryRef<'a> {
    /// Position in the chain.
    pub seq: u64,
    /// When the decision was made.
    pub time: Timestamp,
    /// The acting agent, or [`OPERATOR_SUBJECT`].
    pub subject: &'a str,
    /// What was attempted.
    pub operation: &'a str,
    /// On what.
    pub resource: &'a str,
    /// The verdict's snake_case name ([`Verdict::as_str`]).
    pub verdict: &'a str,
    /// The stable reason code.
    pub reason: &'a str,
    /// The policy version.
    pub policy_version: &'a str,
    /// The canonical JSON encoding of the details.
    pub details: &'a [u8],
    /// The previous entry's hash, as stored.
    pub prev_hash: Digest,
    /// This entry's hash, as stored.
    pub hash: Digest,
}

impl EntryRef<'_> {
    /// The hash the fields call for (compare with the stored
    /// [`hash`](Self::hash)); equals [`entry_hash`] of the same entry.
    pub fn computed_hash(&self) -> Digest {
        hash_fields(self)
    }
}

/// Where and how a chain is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainBreak {
    /// The entry's stored hash does not match its contents: it was edited.
    #[error("entry {seq} was altered: its hash does not match its contents")]
    Altered {
        /// The entry's sequence number.
        seq: u64,
    },
    /// The entry does not link to the previous one: something before it was
    /// deleted, inserted or reordered.
    #[error(
        "entry {seq} does not follow entry {prev_seq}: an entry was deleted, inserted or moved"
    )]
    Unlinked {
        /// The entry's sequence number.
        seq: u64,
        /// The previous entry's sequence number (0 for the start).
        prev_seq: u64,
    },
    /// The sequence numbers skip or repeat.
    #[error("entry {seq} found where entry {expected} was expected")]
    OutOfSequence {
        /// The number found.
        seq: u64,
        /// The number expected.
        expected: u64,
    },
    /// The chain ends before its recorded head: the tail was truncated.
    #[error(
        "chain ends at entry {last_seq} but its recorded head is entry {head_seq}: the tail was truncated"
    )]
    Truncated {
        /// The last entry present.
        last_seq: u64,
        /// The recorded head.
        head_seq: u64,
    },
    /// The chain's head does not match the recorded head hash.
    #[error("entry {seq} does not match the recorded head hash")]
    HeadMismatch {
        /// The head entry's sequence number.
        seq: u64,
    },
}

impl ChainBreak {
    /// The sequence number of the first bad entry.
    pub fn seq(&self) -> u64 {
        match self {
            ChainBreak::Altered { seq }
            | ChainBreak::Unlinked { seq, .. }
            | ChainBreak::OutOfSequence { seq, .. }
            | ChainBreak::HeadMismatch { seq } => *seq,
            ChainBreak::Truncated { last_seq, .. } => last_seq.saturating_add(1),
        }
    }
}

/// A verified chain's extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    /// Number of entries verified.
    pub count: u64,
    /// The last sequence number (0 for an empty chain).
    pub seq: u64,
    /// The last hash ([`Digest::GENESIS`] for an empty chain).
    pub hash: Digest,
}

/// Streaming chain verification in constant memory.
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    head: ChainHead,
}

impl Default for ChainVerifier {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainVerifier {
    /// Verify from the start of the log.
    pub fn new() -> Self {
        Self {
            head: ChainHead {
                count: 0,
                seq: 0,
                hash: Digest::GENESIS,
            },
        }
    }

    /// Verify entries that follow an already verified `seq` with `hash`.
    pub fn resume(seq: u64, hash: Digest) -> Self {
        Self {
            head: ChainHead {
                count: 0,
                seq,
                hash,
            },
        }
    }

    /// Check the next entry.
    pub fn push(&mut self, entry: &AuditEntry) -> Result<(), ChainBreak> {
        let computed = entry_hash(entry.seq, &entry.draft, &entry.prev_hash);
        self.check(entry.seq, &computed, &entry.prev_hash, &entry.hash)
    }

    /// Check the next entry given as borrowed stored fields (see
    /// [`EntryRef`]); the same checks as [`push`](Self::push).
    pub fn push_ref(&mut self, entry: &EntryRef<'_>) -> Result<(), ChainBreak> {
        self.check(
            entry.seq,
            &entry.computed_hash(),
            &entry.prev_hash,
            &entry.hash,
        )
    }

    fn check(
        &mut self,
        seq: u64,
        computed: &Digest,
        prev_hash: &Digest,
        hash: &Digest,
    ) -> Result<(), ChainBreak> {
        let expected = self.head.seq.saturating_add(1);
        if computed != hash {
            return Err(ChainBreak::Altered { seq });
        }
        if prev_hash != &self.head.hash {
            return Err(ChainBreak::Unlinked {
                seq,
                prev_seq: self.head.seq,
            });
        }
        if seq != expected {
            return Err(ChainBreak::OutOfSequence { seq, expected });
        }
        self.head = ChainHead {
            count: self.head.count + 1,
            seq,
            hash: *hash,
        };
        Ok(())
    }

    /// The chain verified so far.
    pub fn finish(self) -> ChainHead {
        self.head
    }

    /// Finish, checking the chain reaches a head recorded out of band.
    pub fn finish_against(
        self,
        anchor_seq: u64,
        anchor_hash: &Digest,
    ) -> Result<ChainHead, ChainBreak> {
        if self.head.seq < anchor_seq {
            return Err(ChainBreak::Truncated {
                last_seq: self.head.seq,
                head_seq: anchor_seq,
            });
        }
        if self.head.seq == anchor_seq && &self.head.hash != anchor_hash {
            return Err(ChainBreak::HeadMismatch { seq: anchor_seq });
        }
        Ok(self.head)
    }
}

#[cfg(test)]
mod tests {
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
}
