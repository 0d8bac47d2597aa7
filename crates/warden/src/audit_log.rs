//! The decision log as the engine offers it: pages of entries, the recorded
//! head, a verification of the whole chain against that head, and signed
//! checkpoints of the head ([`Engine::checkpoint_audit`]).

use warden_core::audit::checkpoint::{
    CHECKPOINT_OPERATION, Checkpoint, SignedCheckpoint, SigningKey,
};
use warden_core::audit::{AuditEntry, ChainHead, ChainVerifier};
use warden_store::Store;

use crate::engine::Engine;
use crate::error::EngineError;

/// Entries read per step while verifying.
const VERIFY_BATCH: usize = 10_000;

/// The first problem a verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditProblem {
    /// The first bad (or first missing) entry's sequence number.
    pub seq: u64,
    /// What is wrong, one line.
    pub message: String,
}

/// The result of [`Engine::verify_audit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditVerification {
    /// The chain as verified: the whole chain (equal to the recorded head)
    /// when valid, the entries before the first problem otherwise.
    pub head: ChainHead,
    /// The first problem, if the chain is not valid.
    pub problem: Option<AuditProblem>,
}

impl AuditVerification {
    /// Whether the whole chain is intact and reaches the recorded head.
    pub fn is_valid(&self) -> bool {
        self.problem.is_none()
    }
}

impl<S: Store> Engine<S> {
    /// Up to `limit` entries of the decision log after sequence number
    /// `after`, in order.
    pub async fn audit_page(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, EngineError> {
        Ok(self.inner.store.audit_page(after, limit).await?)
    }

    /// The head the store recorded with its last append.
    pub async fn audit_head(&self) -> Result<ChainHead, EngineError> {
        Ok(self.inner.store.audit_head().await?)
    }

    /// Sign the chain's current head with `key` and append the checkpoint
    /// to the chain (operation `audit.checkpoint`, details
    /// `{"checkpoint": {seq, hash, time, key, signature}}`). Nothing is
    /// signed (`None`) when the chain is empty or its last entry is already
    /// a checkpoint. The checkpoint signs the head as the store has it: see
    /// `warden_core::audit::checkpoint` for what that does and does not
    /// prove.
    pub async fn checkpoint_audit(
        &self,
        key: &SigningKey,
    ) -> Result<Option<SignedCheckpoint>, EngineError> {
        let store = &self.inner.store;
        let head = store.audit_head().await?;
        if head.seq == 0 {
            return Ok(None);
        }
        let last = store.audit_page(head.seq - 1, 1).await?;
        if last
            .first()
            .is_some_and(|e| e.seq == head.seq && e.draft.operation == CHECKPOINT_OPERATION)
        {
            return Ok(None);
        }
        let signed = Checkpoint {
            seq: head.seq,
            hash: head.hash,
            time: self.now(),
        }
        .sign(key);
        store
            .append_audit(vec![signed.draft(&self.inner.policy.version)])
            .await?;
        Ok(Some(signed))
    }

    /// Recompute the whole chain, in batches, and check it reaches the
    /// recorded head (read before the entries).
    pub async fn verify_audit(&self) -> Result<AuditVerification, EngineError> {
        let store = &self.inner.store;
        let head = store.audit_head().await?;
        let mut verifier = ChainVerifier::new();
        let mut after = 0;
        loop {
            let batch = store.audit_page(after, VERIFY_BATCH).await?;
            for entry in &batch {
                if let Err(e) = verifier.push(entry) {
                    return Ok(AuditVerification {
                        head: verifier.finish(),
                        problem: Some(AuditProblem {
                            seq: e.seq(),
                            message: e.to_string(),
                        }),
                    });
                }
            }
            match batch.last() {
                Some(last) if batch.len() == VERIFY_BATCH => after = last.seq,
                _ => break,
            }
        }
        let so_far = verifier.clone().finish();
        Ok(match verifier.finish_against(head.seq, &head.hash) {
            Ok(verified) => AuditVerification {
                head: verified,
                problem: None,
            },
            Err(e) => AuditVerification {
                head: so_far,
                problem: Some(AuditProblem {
                    seq: e.seq(),
                    message: e.to_string(),
                }),
            },
        })
    }
}
