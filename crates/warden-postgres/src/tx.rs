//! The end of every group transaction: the audit append under the head
//! lock, the change records, the commit; and helpers the operations share.

use warden_core::audit::{AuditDraft, ChainHead};
use warden_core::ids::{AgentId, Key, Namespace};
use warden_store::{Entity, StoreError};

use crate::changes::ChangeKind;
use crate::codec::{self, json_in, text_in, u64_in, u64_out};
use crate::pool::Tx;

use crate::sql;

/// The chain head in a row of `seq, hash`.
pub(crate) fn head_out(row: &tokio_postgres::Row) -> Result<ChainHead, StoreError> {
    let seq: i64 = row.try_get(0).map_err(crate::error::column)?;
    let hash: &[u8] = row.try_get(1).map_err(crate::error::column)?;
    let seq = u64_out(seq, "audit head sequence number")?;
    Ok(ChainHead {
        // Sequence numbers start at 1 without gaps: the count is the last.
        count: seq,
        seq,
        hash: codec::digest_out(hash, "the audit head hash")?,
    })
}

pub(crate) fn missing_head() -> StoreError {
    StoreError::corrupt("the audit head row is missing")
}

/// A change to record with the transaction.
pub(crate) struct ChangeRec {
    pub kind: ChangeKind,
    pub ids: Vec<String>,
}

impl Tx<'_> {
    /// The end of a writer's group transaction: take the head row lock,
    /// record `changes` in order, seal `drafts` after the head and insert
    /// them with the new head, and commit (the insert and the `COMMIT`
    /// pipelined). Returns the head before the append and the head after
    /// each draft, in order.
    ///
    /// The head row lock is taken last, after every job's own statements,
    /// so it is held only for the lock itself, the changes (rare: agent and
    /// token changes), one pipelined round trip and the commit flush.
    pub(crate) async fn seal_and_commit(
        mut self,
        drafts: Vec<AuditDraft>,
        changes: Vec<ChangeRec>,
        channel: &str,
    ) -> Result<(ChainHead, Vec<ChainHead>), StoreError> {
        if drafts.is_empty() && changes.is_empty() {
            let head = self
                .query_opt(sql::HEAD, &[])
                .await?
                .ok_or_else(missing_head)
                .and_then(|r| head_out(&r))?;
            self.commit().await?;
            return Ok((head, Vec::new()));
        }
        let row = self
            .query_opt(sql::LOCK_HEAD, &[])
            .await?
            .ok_or_else(missing_head)?;
        let head = head_out(&row)?;
        for change in changes {
            let ids: Vec<String> = change.ids.iter().map(|s| text_in(s).into_owned()).collect();
            self.query(sql::RECORD_CHANGE, &[&change.kind.as_str(), &ids, &channel])
                .await?;
        }
        if drafts.is_empty() {
            self.commit().await?;
            return Ok((head, Vec::new()));
        }
        let heads = self.append_and_commit(head, drafts).await?;
        Ok((head, heads))
    }

    /// Seal `drafts` after `head` (whose row lock this transaction holds),
    /// insert them with the new head in one statement and commit; returns
    /// the head after each draft.
    async fn append_and_commit(
        self,
        head: ChainHead,
        drafts: Vec<AuditDraft>,
    ) -> Result<Vec<ChainHead>, StoreError> {
        let n = drafts.len();
        let mut seqs = Vec::with_capacity(n);
        let mut times = Vec::with_capacity(n);
        let mut subjects = Vec::with_capacity(n);
        let mut operations = Vec::with_capacity(n);
        let mut resources = Vec::with_capacity(n);
        let mut verdicts = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        let mut policies = Vec::with_capacity(n);
        let mut details = Vec::with_capacity(n);
        let mut prevs: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut hashes: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut heads = Vec::with_capacity(n);
        let mut next = head;
        for draft in drafts {
            let seq = next.seq.checked_add(1).ok_or_else(|| {
                StoreError::backend("the audit log is full (sequence number overflow)")
            })?;
            let entry = draft.seal(seq, next.hash);
            seqs.push(u64_in(entry.seq, "audit sequence number")?);
            times.push(entry.draft.time.0);
            subjects.push(text_in(&entry.draft.subject).into_owned());
            operations.push(text_in(&entry.draft.operation).into_owned());
            resources.push(text_in(&entry.draft.resource).into_owned());
            verdicts.push(codec::verdict_in(entry.draft.verdict));
            reasons.push(text_in(&entry.draft.reason).into_owned());
            policies.push(text_in(&entry.draft.policy_version).into_owned());
            details.push(json_in(&entry.draft.details)?);
            prevs.push(entry.prev_hash.0.to_vec());
            hashes.push(entry.hash.0.to_vec());
            next = ChainHead {
                count: next.count + 1,
                seq: entry.seq,
                hash: entry.hash,
            };
            heads.push(next);
        }
        let head_seq = u64_in(next.seq, "audit sequence number")?;
        let head_hash = next.hash.0.to_vec();
        self.execute_and_commit(
            sql::APPEND,
            &[
                &seqs,
                &times,
                &subjects,
                &operations,
                &resources,
                &verdicts,
                &reasons,
                &policies,
                &details,
                &prevs,
                &hashes,
                &head_seq,
                &head_hash,
            ],
        )
        .await?;
        Ok(heads)
    }
}

pub(crate) fn not_found(entity: Entity, id: impl std::fmt::Display) -> StoreError {
    StoreError::not_found(entity, id)
}

/// The `(owner, namespace, key)` parameters of a record.
pub(crate) fn record_key<'a>(
    owner: &'a AgentId,
    namespace: &'a Namespace,
    key: &'a Key,
) -> [&'a str; 3] {
    [owner.as_str(), namespace.as_str(), key.as_str()]
}

/// Most passes of a revocation's cascade to descendants (each pass finds
/// those registered concurrently since the last; two suffice in practice).
pub(crate) const CASCADE_PASSES: usize = 16;

/// Most attempts of a put whose conditional statement keeps losing to
/// concurrent writers before it gives up with a backend error.
pub(crate) const PUT_ATTEMPTS: usize = 64;
