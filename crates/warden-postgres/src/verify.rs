//! Verification and export of the audit log, from one snapshot.
//!
//! [`PgStore::verify_audit`] (and [`verify_audit`], which opens its own
//! connection and changes nothing, for `warden audit verify`) reads the
//! recorded head and then every entry,
//! in pages of [`VERIFY_PAGE`] by sequence number, inside one read-only
//! repeatable-read transaction: the entries and the head come from the same
//! snapshot, however many servers keep appending meanwhile, and memory stays
//! bounded by the page size. Three layers of evidence, weakest first:
//!
//! 1. **The chain** (`warden_core::audit::ChainVerifier`): an edited,
//!    deleted, inserted or reordered entry breaks it at that entry.
//! 2. **The recorded head** (the `audit_head` row, updated in the same
//!    transaction as every append): entries cut from the tail, or added
//!    past it, are detected.
//! 3. **An external anchor** ([`HeadAnchor`], `SEQ:HASH`, kept where the
//!    database's owner cannot rewrite it): detects a rewrite of the whole
//!    log and its head.
//!
//! The free functions mirror the SQLite backend's (`verify_audit`,
//! `export_audit`, `read_audit_head`, async here), and the types mirror
//! `warden_store::verify` name for name, so the CLI calls both backends
//! alike. `warden_store::verify` was merged into main after this crate was
//! written; once main is merged here, these types become re-exports of it
//! and the checker its `AuditChecker`.

use std::fmt;
use std::io::{BufWriter, Write};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use warden_core::audit::{AuditEntry, ChainBreak, ChainHead, ChainVerifier, Digest};
use warden_store::StoreError;

use crate::codec::{audit_out, u64_in};
use crate::error::DbResult;
use crate::pool::Conn;
use crate::store::{PgStore, sql};

/// Entries read per query by [`verify_audit`] and [`export_audit`].
pub const VERIFY_PAGE: usize = 4096;

/// A chain head recorded outside the store: the sequence number and hash of
/// an entry the operator saw earlier. Written and parsed as `SEQ:HASH`.
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
}

/// Why an audit log failed verification. [`VerifyError::seq`] names the
/// first bad entry where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// Entries continue past the recorded head.
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
    /// The chain ends before the external anchor.
    #[error(
        "chain ends at entry {last_seq} before the expected head entry {anchor_seq}: the log was truncated or rewritten"
    )]
    AnchorNotReached {
        /// The last entry present.
        last_seq: u64,
        /// The anchor's sequence number.
        anchor_seq: u64,
    },
    /// The entry at the anchor's sequence number has another hash.
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
        }
    }
}

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The log could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The output could not be written (a closed pipe, a full disk).
    #[error("cannot write the export: {0}")]
    Io(#[from] std::io::Error),
}

/// Checks entries in ascending order against the chain, the recorded head
/// and an optional anchor, in constant memory.
struct Checker {
    verifier: ChainVerifier,
    recorded: ChainHead,
    anchor: Option<HeadAnchor>,
}

impl Checker {
    fn push(&mut self, entry: &AuditEntry) -> Result<(), VerifyError> {
        self.verifier.push(entry)?;
        if entry.seq == self.recorded.seq && entry.hash != self.recorded.hash {
            return Err(ChainBreak::HeadMismatch { seq: entry.seq }.into());
        }
        if entry.seq > self.recorded.seq {
            return Err(VerifyError::PastHead {
                seq: entry.seq,
                head_seq: self.recorded.seq,
            });
        }
        if let Some(anchor) = &self.anchor
            && anchor.seq == entry.seq
            && anchor.hash != entry.hash
        {
            return Err(VerifyError::AnchorMismatch { seq: entry.seq });
        }
        Ok(())
    }

    fn finish(self) -> Result<VerifyReport, VerifyError> {
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
        Ok(VerifyReport {
            verified,
            anchor: self.anchor,
        })
    }
}

impl PgStore {
    /// Verify the whole audit chain against the recorded head and, if
    /// given, an external anchor, from one snapshot in bounded memory (see
    /// the [module docs](self)). `Ok` carries the verified head, which an
    /// operator can keep as the next anchor.
    pub async fn verify_audit(
        &self,
        anchor: Option<HeadAnchor>,
    ) -> Result<VerifyReport, VerifyError> {
        let mut conn = self.inner.pool.get().await?;
        verify_on(conn.conn()?, anchor).await
    }

    /// Write every entry with `seq > after` to `out` as JSON Lines (see
    /// [`export_audit`]); returns how many were written.
    pub async fn export_audit<W: Write + Send>(
        &self,
        after: u64,
        out: W,
    ) -> Result<u64, ExportError> {
        let mut conn = self.inner.pool.get().await?;
        export_on(conn.conn()?, after, out).await
    }
}

/// Verify the audit log of the database at `url`, without changing it:
/// `warden audit verify --database postgres://...`.
///
/// Connects once, reads the schema the URL's `search_path` names (`public`
/// unless the URL says `?options=-csearch_path%3DNAME`), never migrates or
/// creates anything, and checks, in one snapshot and bounded memory, every
/// entry's hash and link, gap-free sequence numbers, that the chain ends
/// exactly at the recorded head, and, with `anchor` (`--expect-head
/// SEQ:HASH`), that the anchored entry has the anchor's hash. The error
/// names the first bad entry ([`VerifyError::seq`]).
pub async fn verify_audit(
    url: &str,
    anchor: Option<HeadAnchor>,
) -> Result<VerifyReport, VerifyError> {
    let mut conn = reader(url).await?;
    verify_on(&mut conn, anchor).await
}

/// Write every audit entry with `seq > after` of the database at `url` to
/// `out` as JSON Lines, ascending, from one snapshot in bounded memory,
/// without changing the database: `warden audit export --database
/// postgres://... [--after SEQ]`. Returns how many were written.
///
/// One line per entry, the serde form of `AuditEntry` (`seq`, `time`,
/// `subject`, `operation`, `resource`, `verdict`, `reason`,
/// `policy_version`, `details`, `prev_hash`, `hash`), the same as the SQLite
/// backend's export. Export does not verify: run [`verify_audit`].
pub async fn export_audit<W: Write + Send>(
    url: &str,
    after: u64,
    out: W,
) -> Result<u64, ExportError> {
    let mut conn = reader(url).await?;
    export_on(&mut conn, after, out).await
}

/// The recorded head of the audit log of the database at `url`: what an
/// operator exports (as `SEQ:HASH`) and keeps elsewhere, to pass back later
/// as the anchor of [`verify_audit`].
pub async fn read_audit_head(url: &str) -> Result<HeadAnchor, StoreError> {
    let mut conn = reader(url).await?;
    let row = conn
        .query(sql::HEAD, &[])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::Corrupt("the audit head row is missing".into()))?;
    Ok(HeadAnchor::of(&crate::store::head_out(&row)?))
}

/// One connection to an existing Warden schema, for reading only: refuses a
/// schema Warden did not create, or one from a newer Warden.
async fn reader(url: &str) -> Result<Conn, StoreError> {
    let config = crate::store::parse_url(url)?;
    let mut client = crate::pool::connect(&config).await?;
    let schema = crate::store::current_schema(&client).await?;
    let setup = crate::store::setup_sql(&mut client, &schema).await?;
    client.batch_execute(&setup).await.db()?;
    crate::schema::check_existing(&client, &schema).await?;
    Ok(Conn::new(client))
}

async fn verify_on(
    conn: &mut Conn,
    anchor: Option<HeadAnchor>,
) -> Result<VerifyReport, VerifyError> {
    let mut tx = conn.snapshot().await?;
    let head = tx
        .query_opt(sql::HEAD, &[])
        .await?
        .ok_or_else(|| VerifyError::HeadMissing("the audit_head row is missing".into()))?;
    let recorded = crate::store::head_out(&head).map_err(|e| match e {
        StoreError::Corrupt(m) => VerifyError::HeadMissing(m),
        other => VerifyError::Store(other),
    })?;
    let mut checker = Checker {
        verifier: ChainVerifier::new(),
        recorded,
        anchor,
    };
    let limit = i64::try_from(VERIFY_PAGE).unwrap_or(i64::MAX);
    let mut after: i64 = 0;
    loop {
        let rows = tx.query(sql::AUDIT_PAGE, &[&after, &limit]).await?;
        for row in &rows {
            let seq: i64 = row.try_get(0).map_err(crate::error::column)?;
            let entry = audit_out(row).map_err(|e| VerifyError::Undecodable {
                seq: u64::try_from(seq).unwrap_or(0),
                reason: e.to_string(),
            })?;
            checker.push(&entry)?;
            after = seq;
        }
        if rows.len() < VERIFY_PAGE {
            break;
        }
    }
    tx.commit().await?;
    checker.finish()
}

async fn export_on<W: Write + Send>(
    conn: &mut Conn,
    after: u64,
    out: W,
) -> Result<u64, ExportError> {
    let Ok(mut after) = i64::try_from(after) else {
        return Ok(0);
    };
    let mut out = BufWriter::new(out);
    let mut tx = conn.snapshot().await?;
    let limit = i64::try_from(VERIFY_PAGE).unwrap_or(i64::MAX);
    let mut written = 0u64;
    loop {
        let rows = tx.query(sql::AUDIT_PAGE, &[&after, &limit]).await?;
        for row in &rows {
            let entry = audit_out(row)?;
            serde_json::to_writer(&mut out, &entry).map_err(std::io::Error::from)?;
            out.write_all(b"\n")?;
            after = u64_in(entry.seq, "audit sequence number")?;
            written += 1;
        }
        if rows.len() < VERIFY_PAGE {
            break;
        }
    }
    tx.commit().await?;
    out.flush()?;
    Ok(written)
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
        assert_eq!(a.to_string().parse::<HeadAnchor>(), Ok(a));
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
