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
//! The chain has no key: whoever can write the database can append an
//! entry with a correct hash. Signed checkpoints of the head ([`checkpoint`])
//! bound what such a writer can do.
//!
//! Secret values and full argument payloads never enter an entry: callers put
//! ids, names and hashes into `details`, never values.

pub mod checkpoint;
mod hash;
#[cfg(test)]
mod tests;
mod verify;

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::decision::{Decision, Verdict};
use crate::time::Timestamp;

pub use hash::{ENTRY_HASH_TAG, EntryRef, entry_body, entry_hash};
pub use verify::{ChainBreak, ChainHead, ChainVerifier};

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
            operation: decision.operation.to_string(),
            resource: decision.resource.to_string(),
            verdict: decision.verdict,
            reason: decision.reason.to_string(),
            policy_version: decision.policy_version.to_string(),
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
