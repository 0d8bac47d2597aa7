//! The fixed, length-prefixed encoding every entry hash is computed over.

use sha2::{Digest as _, Sha256};

use super::{AuditDraft, Digest};
use crate::canonical::write_canonical;
use crate::time::Timestamp;

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

/// The domain tag every entry hash starts with.
pub const ENTRY_HASH_TAG: &[u8; 16] = b"warden.audit.v1\0";

/// The part of an entry's hash input that depends on neither its position
/// nor its predecessor: every field from `time` to `details`, encoded as
/// [`entry_hash`] encodes them. The hash is SHA-256 over
/// [`ENTRY_HASH_TAG`], the 8-byte little-endian length 8 and `seq` (8
/// bytes LE), this body, the length 32 and the previous hash; so a store
/// can seal an entry where its position is decided (inside the database,
/// under the head's lock) from this body alone.
pub fn entry_body(draft: &AuditDraft) -> Vec<u8> {
    let mut details = Vec::new();
    write_canonical(&draft.details, &mut details);
    let fields: [&[u8]; 7] = [
        draft.subject.as_bytes(),
        draft.operation.as_bytes(),
        draft.resource.as_bytes(),
        draft.verdict.as_str().as_bytes(),
        draft.reason.as_bytes(),
        draft.policy_version.as_bytes(),
        &details,
    ];
    let mut out = Vec::with_capacity(16 + fields.iter().map(|f| 8 + f.len()).sum::<usize>());
    let mut put = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    put(&draft.time.0.to_le_bytes());
    for f in fields {
        put(f);
    }
    out
}

fn hash_fields(e: &EntryRef<'_>) -> Digest {
    let mut h = Sha256::new();
    h.update(ENTRY_HASH_TAG);
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
/// entries straight from storage without building an [`AuditEntry`](super::AuditEntry) (no
/// allocation, no JSON parsing). A store that keeps `details` as their
/// canonical JSON text (see [`crate::canonical`]) hashes exactly what it
/// stores; any other byte there is an alteration.
#[derive(Debug, Clone, Copy)]
pub struct EntryRef<'a> {
    /// Position in the chain.
    pub seq: u64,
    /// When the decision was made.
    pub time: Timestamp,
    /// The acting agent, or [`OPERATOR_SUBJECT`](super::OPERATOR_SUBJECT).
    pub subject: &'a str,
    /// What was attempted.
    pub operation: &'a str,
    /// On what.
    pub resource: &'a str,
    /// The verdict's snake_case name ([`Verdict::as_str`](crate::decision::Verdict::as_str)).
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
