//! Streaming verification of the chain.

use serde::{Deserialize, Serialize};

use super::{AuditEntry, Digest, EntryRef, entry_hash};

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
