//! Verification of a store's audit chain against its recorded head and an
//! optional external anchor.
//!
//! Three layers of evidence, from weakest to strongest:
//!
//! 1. **The chain itself** ([`ChainVerifier`]): every entry's hash covers its
//!    fields and the previous hash, so an edit, a deletion, an insertion or a
//!    reordering breaks the chain at that entry. The chain alone cannot show
//!    that its *tail* was cut off: a prefix of a valid chain is valid.
//! 2. **The recorded head**: a backend records the head (last sequence number
//!    and hash) in the same transaction as every append. Deleting entries
//!    from the tail without also rewriting the head is detected. An actor
//!    that can only write through Warden cannot rewrite either.
//! 3. **An external anchor** ([`HeadAnchor`], printed as `SEQ:HASH`): a head
//!    exported earlier and kept somewhere the database's owner cannot
//!    rewrite (a ticket, a second machine, a signed report). Someone who can
//!    rewrite the whole database can rewrite the chain *and* the recorded
//!    head consistently; only the anchor defeats them: the rewritten chain no
//!    longer reaches the anchor's sequence number with the anchor's hash.
//!
//! A fourth, given the public key of the server's audit signing key
//! ([`AuditChecker::with_checkpoints`]): **signed checkpoints**
//! (`warden_core::audit::checkpoint`), appended to the chain by the server
//! and exported to an anchor file. Each must verify under a trusted key and
//! the chain must pass through the head it signs, so history before a
//! checkpoint cannot be rewritten even by someone who can rewrite the whole
//! database; the anchor file's checkpoints must all be reached.
//!
//! [`AuditChecker`] applies all of them to a stream of entries in constant
//! memory; [`verify_store`] drives it through any [`Store`]'s
//! `audit_page`, so every backend and the server share one verifier.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use warden_core::audit::checkpoint::{CheckpointError, CheckpointSummary, CheckpointVerifier};
use warden_core::audit::{AuditEntry, ChainBreak, ChainHead, ChainVerifier, Digest, EntryRef};

use crate::{Store, StoreError};

/// A chain head recorded outside the store: the sequence number and hash of
/// an entry the operator saw earlier. Written and parsed as `SEQ:HASH`
/// (decimal sequence number, 64 hex digits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadAnchor {
    /// The anchored entry's sequence number (0 for the empty chain).
    pub seq: u64,
    /// Its hash ([`Digest::GENESIS`] for the empty chain).
    pub hash: Digest,
}

impl HeadAnchor {
    /// The anchor for a head returned by a store or a verification.
    pub fn of(head: &ChainHead) -> Self {
        Self {
            seq: head.seq,
            hash: head.hash,
        }
    }
}

impl fmt::Display for HeadAnchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

/// Why a `SEQ:HASH` anchor could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnchorParseError {
    /// No colon between the two parts.
    #[error("expected `SEQ:HASH`, found `{0}`")]
    Shape(String),
    /// The sequence number is not a decimal integer.
    #[error("`{0}` is not a sequence number")]
    Seq(String),
    /// The hash is not 64 hex digits.
    #[error("`{0}` is not a 64-hex-digit hash")]
    Hash(String),
}

impl FromStr for HeadAnchor {
    type Err = AnchorParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (seq, hash) = s
            .trim()
            .split_once(':')
            .ok_or_else(|| AnchorParseError::Shape(s.to_string()))?;
        let seq = seq
            .parse::<u64>()
            .map_err(|_| AnchorParseError::Seq(seq.to_string()))?;
        let hash =
            Digest::from_hex(hash).ok_or_else(|| AnchorParseError::Hash(hash.to_string()))?;
        Ok(Self { seq, hash })
    }
}

/// A successful verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// The verified chain: entry count, last sequence number and hash. It
    /// equals the recorded head.
    pub verified: ChainHead,
    /// The external anchor that was checked, if one was given.
    pub anchor: Option<HeadAnchor>,
    /// What the signed checkpoints and anchors showed, if a trusted key was
    /// given.
    pub checkpoints: Option<CheckpointSummary>,
}

/// Why an audit log failed verification. [`VerifyError::seq`] names the
/// first bad entry where there is one.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The log could not be read at all.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The chain is broken at an entry, or ends before the recorded head.
    #[error(transparent)]
    Broken(#[from] ChainBreak),
    /// An entry's stored fields cannot be decoded (a field was edited to a
    /// value Warden never writes).
    #[error("entry {seq} cannot be decoded: {reason}")]
    Undecodable {
        /// The entry's sequence number.
        seq: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Entries continue past the recorded head: the head was rewound or
    /// entries were added outside Warden.
    #[error(
        "entry {seq} lies past the recorded head (entry {head_seq}): the head was rewound or entries were added outside warden"
    )]
    PastHead {
        /// The first entry past the head.
        seq: u64,
        /// The recorded head.
        head_seq: u64,
    },
    /// The recorded head itself is missing or unreadable.
    #[error("the recorded audit head is missing or damaged: {0}")]
    HeadMissing(String),
    /// The chain ends before the external anchor: it was truncated, or
    /// rewritten and shortened.
    #[error(
        "chain ends at entry {last_seq} before the expected head entry {anchor_seq}: the log was truncated or rewritten"
    )]
    AnchorNotReached {
        /// The last entry present.
        last_seq: u64,
        /// The anchor's sequence number.
        anchor_seq: u64,
    },
    /// A signed checkpoint or anchor is refused, or the chain does not pass
    /// through one.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The entry at the anchor's sequence number has another hash: the log
    /// was rewritten up to there.
    #[error("entry {seq} does not match the expected head hash: the log was rewritten")]
    AnchorMismatch {
        /// The anchored entry.
        seq: u64,
    },
}

impl VerifyError {
    /// The sequence number of the first bad (or first missing) entry, if
    /// the failure is about an entry.
    pub fn seq(&self) -> Option<u64> {
        match self {
            VerifyError::Store(_) | VerifyError::HeadMissing(_) => None,
            VerifyError::Broken(b) => Some(b.seq()),
            VerifyError::Undecodable { seq, .. }
            | VerifyError::PastHead { seq, .. }
            | VerifyError::AnchorMismatch { seq } => Some(*seq),
            VerifyError::AnchorNotReached { last_seq, .. } => Some(last_seq.saturating_add(1)),
            VerifyError::Checkpoint(c) => c.seq(),
        }
    }
}

/// Checks a stream of entries, in ascending order, against the chain rules,
/// the recorded head and an optional anchor, in constant memory.
#[derive(Debug, Clone)]
pub struct AuditChecker {
    verifier: ChainVerifier,
    recorded: ChainHead,
    anchor: Option<HeadAnchor>,
    checkpoints: Option<CheckpointVerifier>,
}

impl AuditChecker {
    /// A checker for a log whose recorded head is `recorded`.
    pub fn new(recorded: ChainHead, anchor: Option<HeadAnchor>) -> Self {
        Self {
            verifier: ChainVerifier::new(),
            recorded,
            anchor,
            checkpoints: None,
        }
    }

    /// Also check signed checkpoints (and anchors) with `checkpoints`.
    pub fn with_checkpoints(mut self, checkpoints: Option<CheckpointVerifier>) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// Check the next entry.
    pub fn push(&mut self, entry: &AuditEntry) -> Result<(), VerifyError> {
        self.verifier.push(entry)?;
        self.against_heads(entry.seq, &entry.hash)?;
        if let Some(c) = &mut self.checkpoints {
            c.push(entry.seq, &entry.hash, &entry.draft.operation, || {
                Ok(entry.draft.details.clone())
            })?;
        }
        Ok(())
    }

    /// Check the next entry given as borrowed stored fields (a backend's
    /// allocation-free path; see `warden_core::audit::EntryRef`).
    pub fn push_ref(&mut self, entry: &EntryRef<'_>) -> Result<(), VerifyError> {
        self.verifier.push_ref(entry)?;
        self.against_heads(entry.seq, &entry.hash)?;
        if let Some(c) = &mut self.checkpoints {
            c.push(entry.seq, &entry.hash, entry.operation, || {
                serde_json::from_slice(entry.details).map_err(|e| e.to_string())
            })?;
        }
        Ok(())
    }

    fn against_heads(&self, seq: u64, hash: &Digest) -> Result<(), VerifyError> {
        if seq == self.recorded.seq && hash != &self.recorded.hash {
            return Err(ChainBreak::HeadMismatch { seq }.into());
        }
        if seq > self.recorded.seq {
            return Err(VerifyError::PastHead {
                seq,
                head_seq: self.recorded.seq,
            });
        }
        if let Some(anchor) = &self.anchor
            && anchor.seq == seq
            && &anchor.hash != hash
        {
            return Err(VerifyError::AnchorMismatch { seq });
        }
        Ok(())
    }

    /// Finish: the chain must reach the recorded head and the anchor.
    pub fn finish(self) -> Result<VerifyReport, VerifyError> {
        let recorded = self.recorded;
        let verified = self.verifier.finish_against(recorded.seq, &recorded.hash)?;
        if let Some(anchor) = &self.anchor {
            if verified.seq < anchor.seq {
                return Err(VerifyError::AnchorNotReached {
                    last_seq: verified.seq,
                    anchor_seq: anchor.seq,
                });
            }
            if anchor.seq == 0 && anchor.hash != Digest::GENESIS {
                return Err(VerifyError::AnchorMismatch { seq: 0 });
            }
        }
        let checkpoints = match self.checkpoints {
            Some(c) => Some(c.finish()?),
            None => None,
        };
        Ok(VerifyReport {
            verified,
            anchor: self.anchor,
            checkpoints,
        })
    }
}

/// Entries fetched per page by [`verify_store`].
pub const VERIFY_PAGE: usize = 4096;

/// Verify any store's audit log through the [`Store`] trait, in pages of
/// [`VERIFY_PAGE`] entries (bounded memory).
///
/// The head is read first; entries appended concurrently after it are not
/// examined, so a live store can be verified. A backend with a direct path
/// to its data may offer a faster, snapshot-consistent verifier (the SQLite
/// backend does), with the same report and errors.
pub async fn verify_store<S: Store>(
    store: &S,
    anchor: Option<HeadAnchor>,
) -> Result<VerifyReport, VerifyError> {
    verify_store_with(store, anchor, None).await
}

/// [`verify_store`], also checking signed checkpoints with `checkpoints`.
pub async fn verify_store_with<S: Store>(
    store: &S,
    anchor: Option<HeadAnchor>,
    checkpoints: Option<CheckpointVerifier>,
) -> Result<VerifyReport, VerifyError> {
    let recorded = store.audit_head().await?;
    let mut checker = AuditChecker::new(recorded, anchor).with_checkpoints(checkpoints);
    let mut after = 0;
    while after < recorded.seq {
        let page = store.audit_page(after, VERIFY_PAGE).await?;
        if page.is_empty() {
            break;
        }
        for entry in &page {
            if entry.seq > recorded.seq {
                return checker.finish();
            }
            checker.push(entry)?;
            after = entry.seq;
        }
    }
    checker.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_round_trips_and_rejects_garbage() {
        let a = HeadAnchor {
            seq: 42,
            hash: Digest::of(b"x"),
        };
        let s = a.to_string();
        assert_eq!(s.parse::<HeadAnchor>(), Ok(a));
        assert!(matches!(
            "42".parse::<HeadAnchor>(),
            Err(AnchorParseError::Shape(_))
        ));
        assert!(matches!(
            "x:00".parse::<HeadAnchor>(),
            Err(AnchorParseError::Seq(_))
        ));
        assert!(matches!(
            "1:00".parse::<HeadAnchor>(),
            Err(AnchorParseError::Hash(_))
        ));
    }
}
