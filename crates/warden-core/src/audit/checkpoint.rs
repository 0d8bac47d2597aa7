//! Signed checkpoints of the chain's head.
//!
//! The hash chain shows that entries were not edited, moved or removed
//! *relative to each other*; it has no key, so whoever can write the
//! database can append an entry with a correct hash (or rewrite the whole
//! chain) and move the recorded head. A [`SignedCheckpoint`] is the head
//! (`seq`, `hash`) at a moment, signed with an Ed25519 key kept outside the
//! database. The server appends each checkpoint to the chain as an entry
//! (operation [`CHECKPOINT_OPERATION`], details `{"checkpoint": {...}}`) and
//! can export it, one JSON line each, to an anchor file kept elsewhere.
//!
//! [`CheckpointVerifier`] follows a stream of entries and checks, for each
//! checkpoint entry, that its signature is valid under a trusted key and
//! that the entry it signs is in the chain with the signed hash; given
//! anchors (checkpoints read from an anchor file), it checks that the chain
//! passes through every anchored head and reaches the last one.
//!
//! What that proves, given a key the attacker does not hold:
//!
//! - **History before a checkpoint cannot be rewritten**: an entry edited,
//!   inserted or removed at or before a signed head changes every later
//!   hash, so the signed head is no longer in the chain (the verifier names
//!   the checkpoint whose signed head it is).
//! - **A forged checkpoint is refused**: without the key its signature does
//!   not verify; a checkpoint signed by an untrusted key is refused too.
//! - **Deleting the newest entries** (and the checkpoints among them) is
//!   caught against an anchor file: the chain must reach its last anchor.
//!
//! What it does not prove:
//!
//! - Entries after the last checkpoint are signed by nothing yet: a forged
//!   entry appended there (with a correct hash, the recorded head moved) is
//!   accepted by the verifier; it becomes covered by, not refused by, the
//!   next checkpoint, since the signer signs the head it finds. The report
//!   says how many entries follow the last signed head.
//! - Truncation after the last anchor the verifier is given, or of a log
//!   verified without the anchor file, back to an earlier checkpoint.
//! - Anything against a holder of the signing key.
//!
//! The signed bytes ([`Checkpoint::signing_input`]) are a domain tag, the
//! sequence number and time (8 bytes little-endian each) and the 32-byte
//! hash: fixed length, nothing to canonicalise.

use std::collections::{BTreeMap, VecDeque};

use ed25519_dalek::{Signature, Signer};
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::{AuditDraft, Digest, OPERATOR_SUBJECT};
use crate::decision::Verdict;
use crate::time::Timestamp;

/// The operation of a checkpoint entry.
pub const CHECKPOINT_OPERATION: &str = "audit.checkpoint";

/// The reason of a checkpoint entry.
pub const CHECKPOINT_REASON: &str = "checkpoint";

/// How many recent entries a verifier remembers to find the head a
/// checkpoint entry signs (the entry usually follows its head directly;
/// concurrent appends can put a few entries between).
pub const CHECKPOINT_REACH: usize = 4096;

const DOMAIN: &[u8] = b"warden.audit.checkpoint.v1\0";

/// A head of the chain at a moment: what a checkpoint signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The signed entry's sequence number (0: the empty chain).
    pub seq: u64,
    /// Its hash ([`Digest::GENESIS`] for the empty chain).
    pub hash: Digest,
    /// When the checkpoint was made.
    pub time: Timestamp,
}

impl Checkpoint {
    /// The bytes signed: a domain tag, `seq` (8 bytes LE), `time` (8 bytes
    /// LE, ms), `hash` (32 bytes).
    pub fn signing_input(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(DOMAIN.len() + 48);
        out.extend_from_slice(DOMAIN);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.time.0.to_le_bytes());
        out.extend_from_slice(&self.hash.0);
        out
    }

    /// Sign with `key`.
    pub fn sign(self, key: &SigningKey) -> SignedCheckpoint {
        let signature = key.sign(&self.signing_input());
        SignedCheckpoint {
            checkpoint: self,
            key: PublicKey(key.verifying_key()),
            signature: SignatureHex(signature),
        }
    }
}

/// An Ed25519 public key, 64 hex digits in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub VerifyingKey);

impl PublicKey {
    /// Parse 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, CheckpointKeyError> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut bytes).map_err(|_| CheckpointKeyError::Hex)?;
        VerifyingKey::from_bytes(&bytes)
            .map(PublicKey)
            .map_err(|_| CheckpointKeyError::NotAKey)
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.as_bytes())
    }
}

/// Why a key could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointKeyError {
    /// Not 64 hex digits.
    #[error("expected 64 hex digits")]
    Hex,
    /// Not a valid Ed25519 public key.
    #[error("not an Ed25519 public key")]
    NotAKey,
}

/// A signing key from its 32-byte seed in 64 hex digits (the key file's
/// and `WARDEN_AUDIT_SIGNING_KEY`'s format).
pub fn signing_key_from_hex(s: &str) -> Result<SigningKey, CheckpointKeyError> {
    let mut seed = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut seed).map_err(|_| CheckpointKeyError::Hex)?;
    Ok(SigningKey::from_bytes(&seed))
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// An Ed25519 signature, 128 hex digits in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignatureHex(pub Signature);

impl Serialize for SignatureHex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0.to_bytes()))
    }
}

impl<'de> Deserialize<'de> for SignatureHex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut bytes = [0u8; 64];
        hex::decode_to_slice(s.as_ref(), &mut bytes)
            .map_err(|_| serde::de::Error::custom("expected 128 hex digits"))?;
        Ok(SignatureHex(Signature::from_bytes(&bytes)))
    }
}

/// A checkpoint with the key that signed it and the signature: a line of
/// an anchor file, and the `checkpoint` of a checkpoint entry's details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedCheckpoint {
    /// What is signed.
    #[serde(flatten)]
    pub checkpoint: Checkpoint,
    /// The signer's public key.
    pub key: PublicKey,
    /// The signature over [`Checkpoint::signing_input`].
    pub signature: SignatureHex,
}

impl SignedCheckpoint {
    /// Check the signature, and that the signer is one of `trusted`.
    pub fn verify(&self, trusted: &[VerifyingKey]) -> Result<(), SignatureProblem> {
        if !trusted.contains(&self.key.0) {
            return Err(SignatureProblem::UntrustedKey);
        }
        self.key
            .0
            .verify_strict(&self.checkpoint.signing_input(), &self.signature.0)
            .map_err(|_| SignatureProblem::BadSignature)
    }

    /// The entry recording this checkpoint (as the operator, under
    /// `policy_version`).
    pub fn draft(&self, policy_version: &str) -> AuditDraft {
        AuditDraft {
            time: self.checkpoint.time,
            subject: OPERATOR_SUBJECT.to_owned(),
            operation: CHECKPOINT_OPERATION.to_owned(),
            resource: format!("audit/{}", self.checkpoint.seq),
            verdict: Verdict::Allow,
            reason: CHECKPOINT_REASON.to_owned(),
            policy_version: policy_version.to_owned(),
            details: serde_json::json!({ "checkpoint": self }),
        }
    }

    /// The checkpoint an entry's details carry.
    pub fn from_details(details: &Value) -> Result<Self, String> {
        let inner = details
            .get("checkpoint")
            .ok_or_else(|| "no `checkpoint` in its details".to_owned())?;
        serde_json::from_value(inner.clone()).map_err(|e| e.to_string())
    }
}

/// Why a signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureProblem {
    /// Signed by a key the verifier was not told to trust.
    #[error("it is signed by a key that is not trusted")]
    UntrustedKey,
    /// The signature does not verify.
    #[error("its signature does not verify")]
    BadSignature,
}

/// Why a chain fails its checkpoints or anchors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// A checkpoint entry whose details are not a checkpoint.
    #[error("checkpoint entry {seq} cannot be read: {reason}")]
    Malformed {
        /// The checkpoint entry.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint entry whose signature is refused.
    #[error("checkpoint entry {seq}: {problem}")]
    Signature {
        /// The checkpoint entry.
        seq: u64,
        /// Why.
        problem: SignatureProblem,
    },
    /// The head a checkpoint signs is not in the chain as signed: the
    /// history up to it was rewritten.
    #[error(
        "checkpoint entry {seq} signs entry {signed_seq} with hash {signed_hash}, but the chain does not pass through it: the log before the checkpoint was rewritten"
    )]
    NotOnChain {
        /// The checkpoint entry.
        seq: u64,
        /// The head it signs.
        signed_seq: u64,
        /// The signed hash.
        signed_hash: Digest,
    },
    /// An anchored head is not in the chain as anchored.
    #[error(
        "the chain does not pass through anchor {signed_seq}:{signed_hash} (line {line} of the anchors): the log was rewritten"
    )]
    AnchorNotOnChain {
        /// The anchor's line (from 1).
        line: usize,
        /// The anchored entry.
        signed_seq: u64,
        /// The anchored hash.
        signed_hash: Digest,
    },
    /// The chain ends before the last anchor.
    #[error(
        "the chain ends at entry {last_seq} before anchor {anchor_seq} (line {line} of the anchors): its newest entries were deleted"
    )]
    AnchorNotReached {
        /// The anchor's line (from 1).
        line: usize,
        /// The last entry present.
        last_seq: u64,
        /// The anchored entry.
        anchor_seq: u64,
    },
    /// An anchor whose signature is refused.
    #[error("anchor line {line}: {problem}")]
    AnchorSignature {
        /// The anchor's line (from 1).
        line: usize,
        /// Why.
        problem: SignatureProblem,
    },
}

impl CheckpointError {
    /// The sequence number of the checkpoint entry, or of the first entry
    /// missing or different from an anchor, where there is one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            CheckpointError::Malformed { seq, .. }
            | CheckpointError::Signature { seq, .. }
            | CheckpointError::NotOnChain { seq, .. } => Some(*seq),
            CheckpointError::AnchorNotOnChain { signed_seq, .. } => Some(*signed_seq),
            CheckpointError::AnchorNotReached { last_seq, .. } => Some(last_seq.saturating_add(1)),
            CheckpointError::AnchorSignature { .. } => None,
        }
    }
}

/// What the checkpoints of a verified chain showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CheckpointSummary {
    /// Checkpoint entries verified.
    pub checkpoints: u64,
    /// Anchors verified.
    pub anchors: u64,
    /// The newest signed head found (entry or anchor), if any.
    pub last_signed: Option<Checkpoint>,
    /// Entries after the newest signed head: signed by nothing yet.
    pub unsigned_entries: u64,
}

/// Checks the checkpoints of a stream of entries (in order, each already
/// checked by a [`ChainVerifier`](super::ChainVerifier)) and the anchors,
/// in memory bounded by [`CHECKPOINT_REACH`] and the number of anchors.
#[derive(Debug, Clone)]
pub struct CheckpointVerifier {
    trusted: Vec<VerifyingKey>,
    /// The last entries: sequence number, hash, whether a checkpoint.
    recent: VecDeque<(u64, Digest, bool)>,
    /// Anchors by sequence number: (line, checkpoint).
    anchors: BTreeMap<u64, (usize, Checkpoint)>,
    summary: CheckpointSummary,
    last_seq: u64,
}

impl CheckpointVerifier {
    /// A verifier trusting `trusted`, with `anchors` (an anchor file's
    /// checkpoints, in file order; each must be signed by a trusted key).
    pub fn new(
        trusted: Vec<VerifyingKey>,
        anchors: &[SignedCheckpoint],
    ) -> Result<Self, CheckpointError> {
        let mut by_seq: BTreeMap<u64, (usize, Checkpoint)> = BTreeMap::new();
        for (i, anchor) in anchors.iter().enumerate() {
            let line = i + 1;
            anchor
                .verify(&trusted)
                .map_err(|problem| CheckpointError::AnchorSignature { line, problem })?;
            let c = anchor.checkpoint;
            if let Some((_, other)) = by_seq.get(&c.seq)
                && other.hash != c.hash
            {
                // Two signed anchors disagree on one entry: the key signed
                // two histories; the chain can pass through at most one.
                return Err(CheckpointError::AnchorNotOnChain {
                    line,
                    signed_seq: c.seq,
                    signed_hash: c.hash,
                });
            }
            by_seq.insert(c.seq, (line, c));
        }
        let mut recent = VecDeque::with_capacity(CHECKPOINT_REACH);
        recent.push_back((0, Digest::GENESIS, false));
        let mut verifier = Self {
            trusted,
            recent,
            anchors: by_seq,
            summary: CheckpointSummary::default(),
            last_seq: 0,
        };
        verifier.check_anchor(0, &Digest::GENESIS)?;
        Ok(verifier)
    }

    /// The next entry: its sequence number, hash, operation and (read only
    /// for a checkpoint entry) details.
    pub fn push(
        &mut self,
        seq: u64,
        hash: &Digest,
        operation: &str,
        details: impl FnOnce() -> Result<Value, String>,
    ) -> Result<(), CheckpointError> {
        if operation == CHECKPOINT_OPERATION {
            let signed = details()
                .and_then(|d| SignedCheckpoint::from_details(&d))
                .map_err(|reason| CheckpointError::Malformed { seq, reason })?;
            signed
                .verify(&self.trusted)
                .map_err(|problem| CheckpointError::Signature { seq, problem })?;
            let c = signed.checkpoint;
            let on_chain = self
                .recent
                .iter()
                .any(|(s, h, _)| *s == c.seq && h == &c.hash);
            if !on_chain {
                return Err(CheckpointError::NotOnChain {
                    seq,
                    signed_seq: c.seq,
                    signed_hash: c.hash,
                });
            }
            self.summary.checkpoints += 1;
            self.signed(c);
        }
        let is_checkpoint = operation == CHECKPOINT_OPERATION;
        if self.recent.len() == CHECKPOINT_REACH {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, *hash, is_checkpoint));
        self.last_seq = seq;
        if !is_checkpoint {
            self.summary.unsigned_entries += 1;
        }
        self.check_anchor(seq, hash)
    }

    fn check_anchor(&mut self, seq: u64, hash: &Digest) -> Result<(), CheckpointError> {
        if let Some((line, c)) = self.anchors.get(&seq).copied() {
            if &c.hash != hash {
                return Err(CheckpointError::AnchorNotOnChain {
                    line,
                    signed_seq: c.seq,
                    signed_hash: c.hash,
                });
            }
            self.summary.anchors += 1;
            self.signed(c);
        }
        Ok(())
    }

    fn signed(&mut self, c: Checkpoint) {
        if self.summary.last_signed.is_none_or(|l| l.seq <= c.seq) {
            self.summary.last_signed = Some(c);
            // Entries after the new signed head (all within reach: it was
            // found there), checkpoints aside.
            self.summary.unsigned_entries = self
                .recent
                .iter()
                .filter(|(s, _, cp)| *s > c.seq && !cp)
                .count() as u64;
        }
    }

    /// Finish: the chain must reach the last anchor.
    pub fn finish(self) -> Result<CheckpointSummary, CheckpointError> {
        if let Some((&anchor_seq, &(line, _))) = self.anchors.last_key_value()
            && anchor_seq > self.last_seq
        {
            return Err(CheckpointError::AnchorNotReached {
                line,
                last_seq: self.last_seq,
                anchor_seq,
            });
        }
        Ok(self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditEntry, ChainVerifier};

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    fn entry(seq: u64, prev: Digest, operation: &str, details: Value) -> AuditEntry {
        AuditDraft {
            time: Timestamp(seq as i64),
            subject: "a".into(),
            operation: operation.into(),
            resource: "r".into(),
            verdict: Verdict::Allow,
            reason: "ok".into(),
            policy_version: "p".into(),
            details,
        }
        .seal(seq, prev)
    }

    /// Three entries, a checkpoint of entry 3 (as entry 4), one more.
    fn chain(signer: &SigningKey) -> (Vec<AuditEntry>, SignedCheckpoint) {
        let mut out: Vec<AuditEntry> = Vec::new();
        let mut prev = Digest::GENESIS;
        for seq in 1..=3 {
            let e = entry(seq, prev, "memory.read", Value::Null);
            prev = e.hash;
            out.push(e);
        }
        let signed = Checkpoint {
            seq: 3,
            hash: prev,
            time: Timestamp(9),
        }
        .sign(signer);
        let cp = signed.draft("p").seal(4, prev);
        prev = cp.hash;
        out.push(cp);
        out.push(entry(5, prev, "memory.read", Value::Null));
        (out, signed)
    }

    fn run(
        entries: &[AuditEntry],
        trusted: &[VerifyingKey],
        anchors: &[SignedCheckpoint],
    ) -> Result<CheckpointSummary, CheckpointError> {
        let mut chain = ChainVerifier::new();
        let mut v = CheckpointVerifier::new(trusted.to_vec(), anchors)?;
        for e in entries {
            chain.push(e).unwrap();
            v.push(e.seq, &e.hash, &e.draft.operation, || {
                Ok(e.draft.details.clone())
            })?;
        }
        v.finish()
    }

    #[test]
    fn a_signed_checkpoint_round_trips_and_verifies_only_under_its_key() {
        let signed = Checkpoint {
            seq: 7,
            hash: Digest::of(b"x"),
            time: Timestamp(1),
        }
        .sign(&key(1));
        let text = serde_json::to_string(&signed).unwrap();
        let back: SignedCheckpoint = serde_json::from_str(&text).unwrap();
        assert_eq!(back, signed);
        assert_eq!(back.verify(&[key(1).verifying_key()]), Ok(()));
        assert_eq!(
            back.verify(&[key(2).verifying_key()]),
            Err(SignatureProblem::UntrustedKey)
        );
        let mut moved = back;
        moved.checkpoint.seq = 8;
        assert_eq!(
            moved.verify(&[key(1).verifying_key()]),
            Err(SignatureProblem::BadSignature)
        );
    }

    #[test]
    fn a_chain_through_its_checkpoints_passes_and_counts_the_unsigned_tail() {
        let (entries, signed) = chain(&key(1));
        let summary = run(&entries, &[key(1).verifying_key()], &[signed]).unwrap();
        assert_eq!(summary.checkpoints, 1);
        assert_eq!(summary.anchors, 1);
        assert_eq!(summary.last_signed, Some(signed.checkpoint));
        assert_eq!(summary.unsigned_entries, 1);
    }

    #[test]
    fn a_rewritten_history_fails_at_the_checkpoint_that_signed_it() {
        let (entries, _) = chain(&key(1));
        // Rewrite entry 2 and re-seal everything after it consistently: the
        // chain alone is valid again; the checkpoint's signed head is gone.
        let mut forged = entries.clone();
        let mut prev = forged[0].hash;
        for e in forged.iter_mut().skip(1) {
            let mut draft = e.draft.clone();
            if e.seq == 2 {
                draft.resource = "forged".into();
            }
            *e = draft.seal(e.seq, prev);
            prev = e.hash;
        }
        let mut chain = ChainVerifier::new();
        for e in &forged {
            chain.push(e).unwrap();
        }
        let err = run(&forged, &[key(1).verifying_key()], &[]).unwrap_err();
        assert!(
            matches!(
                err,
                CheckpointError::NotOnChain {
                    seq: 4,
                    signed_seq: 3,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn wrong_keys_tampered_signatures_and_deleted_tails_fail() {
        let (entries, signed) = chain(&key(1));
        let err = run(&entries, &[key(2).verifying_key()], &[]).unwrap_err();
        assert_eq!(
            err,
            CheckpointError::Signature {
                seq: 4,
                problem: SignatureProblem::UntrustedKey
            }
        );
        // A checkpoint entry whose signature was changed (and re-sealed).
        let mut tampered = entries.clone();
        let mut bad = signed;
        bad.signature = Checkpoint {
            seq: 1,
            ..signed.checkpoint
        }
        .sign(&key(1))
        .signature;
        tampered[3] = bad.draft("p").seal(4, tampered[2].hash);
        tampered[4] = tampered[4].draft.clone().seal(5, tampered[3].hash);
        let err = run(&tampered, &[key(1).verifying_key()], &[]).unwrap_err();
        assert_eq!(
            err,
            CheckpointError::Signature {
                seq: 4,
                problem: SignatureProblem::BadSignature
            }
        );
        // The newest entries deleted: the anchor is not reached.
        let err = run(&entries[..2], &[key(1).verifying_key()], &[signed]).unwrap_err();
        assert!(
            matches!(
                err,
                CheckpointError::AnchorNotReached {
                    line: 1,
                    last_seq: 2,
                    anchor_seq: 3
                }
            ),
            "{err}"
        );
        // An anchor signed by another key is refused up front.
        let err = CheckpointVerifier::new(vec![key(2).verifying_key()], &[signed]).unwrap_err();
        assert!(matches!(
            err,
            CheckpointError::AnchorSignature { line: 1, .. }
        ));
    }
}
