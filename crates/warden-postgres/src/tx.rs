//! The end of every group transaction: the audit append under the head
//! lock, the change records, the commit; and helpers the operations share.

use warden_core::audit::{AuditDraft, ChainHead, entry_body, entry_hash};
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
    /// Take the audit head's row lock: the first statement of a writer's
    /// group that runs statements of its own. Every such group, on every
    /// server, takes this one lock before any row of its jobs, so two
    /// groups never wait for each other's rows in opposite orders (with
    /// the lock last, groups of two servers touching the same rows in
    /// different orders deadlocked until PostgreSQL's `deadlock_timeout`
    /// broke the cycle). The price: such groups run one at a time across
    /// the deployment, their statements under the lock; audit-only groups
    /// (reads, denials) take it for their append alone.
    ///
    /// The lock is sent with the group's first statement, ahead of it
    /// ([`Tx::lock_row`]): the lock is held from there, and the answer to
    /// the first statement is the first the group waits for under it, one
    /// round trip fewer than a lock of its own would hold it.
    pub(crate) async fn lock_head(&mut self) -> Result<(), StoreError> {
        self.lock_row(sql::LOCK_HEAD).await
    }

    /// The end of a writer's group transaction, whose head row lock
    /// [`Tx::lock_head`] asked for: record `changes` in order, seal
    /// `drafts` after the head and insert them with the new head, and
    /// commit (the insert and the `COMMIT` pipelined). Returns the head
    /// before the append and the head after each draft, in order.
    pub(crate) async fn seal_and_commit(
        mut self,
        drafts: Vec<AuditDraft>,
        changes: Vec<ChangeRec>,
        channel: &str,
    ) -> Result<(ChainHead, Vec<ChainHead>), StoreError> {
        let head = head_out(&self.locked_row().await?.ok_or_else(missing_head)?)?;
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
        let sealed = Sealed::new(head, &drafts)?;
        self.execute_and_commit(sql::APPEND, &sealed.params())
            .await?;
        Ok(sealed.heads)
    }
}

/// A group's audit entries sealed after the head, as the parameters of
/// [`sql::APPEND`].
pub(crate) struct Sealed {
    seqs: Vec<i64>,
    times: Vec<i64>,
    subjects: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
    verdicts: Vec<&'static str>,
    reasons: Vec<String>,
    policies: Vec<String>,
    details: Vec<String>,
    prevs: Vec<Vec<u8>>,
    hashes: Vec<Vec<u8>>,
    head_seq: i64,
    head_hash: Vec<u8>,
    /// The head after each entry.
    pub(crate) heads: Vec<ChainHead>,
}

impl Sealed {
    /// The head after the last entry (`head` when there is none).
    pub(crate) fn last(&self, head: ChainHead) -> ChainHead {
        self.heads.last().copied().unwrap_or(head)
    }

    pub(crate) fn new(head: ChainHead, drafts: &[AuditDraft]) -> Result<Self, StoreError> {
        let n = drafts.len();
        let mut s = Sealed {
            seqs: Vec::with_capacity(n),
            times: Vec::with_capacity(n),
            subjects: Vec::with_capacity(n),
            operations: Vec::with_capacity(n),
            resources: Vec::with_capacity(n),
            verdicts: Vec::with_capacity(n),
            reasons: Vec::with_capacity(n),
            policies: Vec::with_capacity(n),
            details: Vec::with_capacity(n),
            prevs: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
            head_seq: 0,
            head_hash: Vec::new(),
            heads: Vec::with_capacity(n),
        };
        let mut next = head;
        for draft in drafts {
            let seq = next.seq.checked_add(1).ok_or_else(|| {
                StoreError::backend("the audit log is full (sequence number overflow)")
            })?;
            let hash = entry_hash(seq, draft, &next.hash);
            s.seqs.push(u64_in(seq, "audit sequence number")?);
            s.times.push(draft.time.0);
            s.subjects.push(text_in(&draft.subject).into_owned());
            s.operations.push(text_in(&draft.operation).into_owned());
            s.resources.push(text_in(&draft.resource).into_owned());
            s.verdicts.push(codec::verdict_in(draft.verdict));
            s.reasons.push(text_in(&draft.reason).into_owned());
            s.policies.push(text_in(&draft.policy_version).into_owned());
            s.details.push(json_in(&draft.details)?);
            s.prevs.push(next.hash.0.to_vec());
            s.hashes.push(hash.0.to_vec());
            next = ChainHead {
                count: next.count + 1,
                seq,
                hash,
            };
            s.heads.push(next);
        }
        s.head_seq = u64_in(next.seq, "audit sequence number")?;
        s.head_hash = next.hash.0.to_vec();
        Ok(s)
    }

    pub(crate) fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 13] {
        [
            &self.seqs,
            &self.times,
            &self.subjects,
            &self.operations,
            &self.resources,
            &self.verdicts,
            &self.reasons,
            &self.policies,
            &self.details,
            &self.prevs,
            &self.hashes,
            &self.head_seq,
            &self.head_hash,
        ]
    }

    /// The parameters of [`sql::APPEND_AFTER`]: those of [`sql::APPEND`]
    /// and the head the entries were sealed after.
    pub(crate) fn params_after<'a>(
        &'a self,
        expected_seq: &'a i64,
        expected_hash: &'a &'a [u8],
    ) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 15] {
        let [a, b, c, d, e, f, g, h, i, j, k, l, m] = self.params();
        [
            a,
            b,
            c,
            d,
            e,
            f,
            g,
            h,
            i,
            j,
            k,
            l,
            m,
            expected_seq,
            expected_hash,
        ]
    }
}

/// What [`append_predicted`] found.
pub(crate) enum Predicted {
    /// The head was the predicted one: the entries are committed; the
    /// head after each.
    Appended(Vec<ChainHead>),
    /// Another transaction moved the head first: nothing was written.
    Moved,
}

/// The audit-only group, `sealed` after the predicted `head`, in one round
/// trip: [`sql::APPEND_AFTER`] (the head update and the insert, both only
/// if the head is still `head`) as a transaction of its own (one statement
/// is atomic: both happen or neither). A group sealed after the
/// head that an earlier group of this process is committing waits for that
/// commit on the head row and then finds its prediction right, so
/// consecutive groups need no round trip between them.
pub(crate) async fn append_predicted(
    conn: &mut crate::pool::Conn,
    head: ChainHead,
    sealed: Sealed,
) -> Result<Predicted, StoreError> {
    let expected_seq = u64_in(head.seq, "audit sequence number")?;
    let expected_hash: &[u8] = &head.hash.0;
    let inserted = conn
        .execute_committed(
            sql::APPEND_AFTER,
            &sealed.params_after(&expected_seq, &expected_hash),
        )
        .await?;
    let sent = sealed.heads.len();
    match usize::try_from(inserted) {
        Ok(n) if n == sent => Ok(Predicted::Appended(sealed.heads)),
        Ok(0) => Ok(Predicted::Moved),
        _ => Err(StoreError::corrupt(format!(
            "a predicted append of {sent} entries inserted {inserted}"
        ))),
    }
}

/// The audit-only group sealed inside the database, in one round trip:
/// [`sql::APPEND_SEALED`] (run as its own transaction) locks the head,
/// gives each draft its position and hash from its [`entry_body`], inserts
/// them and moves the head, holding the head's lock for that statement and
/// its commit only. No server predicts the head or holds its lock across a
/// round trip, so groups of several servers never undo each other's work.
/// Every hash returned is checked against [`entry_hash`] here: a database
/// that sealed differently is reported as corrupt. Returns the head before
/// and after each draft.
pub(crate) async fn append_sealed(
    conn: &mut crate::pool::Conn,
    drafts: &[AuditDraft],
) -> Result<(ChainHead, Vec<ChainHead>), StoreError> {
    let n = drafts.len();
    let mut times = Vec::with_capacity(n);
    let mut subjects = Vec::with_capacity(n);
    let mut operations = Vec::with_capacity(n);
    let mut resources = Vec::with_capacity(n);
    let mut verdicts = Vec::with_capacity(n);
    let mut reasons = Vec::with_capacity(n);
    let mut policies = Vec::with_capacity(n);
    let mut details = Vec::with_capacity(n);
    let mut bodies = Vec::with_capacity(n);
    for d in drafts {
        times.push(d.time.0);
        subjects.push(text_in(&d.subject).into_owned());
        operations.push(text_in(&d.operation).into_owned());
        resources.push(text_in(&d.resource).into_owned());
        verdicts.push(codec::verdict_in(d.verdict));
        reasons.push(text_in(&d.reason).into_owned());
        policies.push(text_in(&d.policy_version).into_owned());
        details.push(json_in(&d.details)?);
        bodies.push(entry_body(d));
    }
    let rows = conn
        .query(
            sql::APPEND_SEALED,
            &[
                &times,
                &subjects,
                &operations,
                &resources,
                &verdicts,
                &reasons,
                &policies,
                &details,
                &bodies,
            ],
        )
        .await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::corrupt("the sealed append returned no row"))?;
    let base = head_out(row)?;
    let seqs: Vec<i64> = row.try_get(2).map_err(crate::error::column)?;
    let hashes: Vec<Vec<u8>> = row.try_get(3).map_err(crate::error::column)?;
    if seqs.len() != n || hashes.len() != n {
        return Err(StoreError::corrupt(format!(
            "a sealed append of {n} entries returned {} positions and {} hashes",
            seqs.len(),
            hashes.len()
        )));
    }
    let mut heads = Vec::with_capacity(n);
    let mut prev = base;
    for ((draft, seq), hash) in drafts.iter().zip(seqs).zip(hashes) {
        let seq = u64_out(seq, "audit sequence number")?;
        let hash = codec::digest_out(&hash, "a sealed entry's hash")?;
        if seq != prev.seq + 1 || hash != entry_hash(seq, draft, &prev.hash) {
            return Err(StoreError::corrupt(format!(
                "the database sealed entry {seq} differently from this server \
                 (after {}): the audit log no longer verifies from there",
                prev.seq
            )));
        }
        prev = ChainHead {
            count: prev.count + 1,
            seq,
            hash,
        };
        heads.push(prev);
    }
    Ok((base, heads))
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
