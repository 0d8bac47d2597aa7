//! Verifying and exporting the audit log straight from the file: the entry
//! points of `warden audit verify` and `warden audit export`.
//!
//! All of them open the database read-only (they never change the file,
//! never migrate it, never create it) and read one snapshot, so they can run
//! while a server is writing: entries appended meanwhile are simply not
//! part of that snapshot. Memory stays bounded however long the log is:
//! rows are streamed from one cursor, one entry at a time.

use std::io::{BufWriter, Write};
use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use warden_core::audit::checkpoint::CheckpointVerifier;
use warden_core::audit::{AuditEntry, ChainHead, Digest};
use warden_store::verify::AuditChecker;
use warden_store::{HeadAnchor, StoreError, VerifyError, VerifyReport};

use crate::codec::{self, AUDIT_COLUMNS};
use crate::error::{SqlResultExt, corrupt};
use crate::options::SqliteOptions;
use crate::schema;

/// The recorded head (the `audit_head` row).
pub(crate) fn read_head(conn: &Connection) -> Result<ChainHead, StoreError> {
    let (seq, hash): (i64, Vec<u8>) = conn
        .prepare_cached("SELECT seq, hash FROM audit_head WHERE id = 1")
        .store()?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .store()?
        .ok_or_else(|| corrupt("audit head", "the head row is missing"))?;
    let seq = codec::to_u64("audit head", seq)?;
    let hash = <[u8; 32]>::try_from(hash.as_slice())
        .map_err(|_| corrupt("audit head", "hash is not 32 bytes"))?;
    Ok(ChainHead {
        count: seq,
        seq,
        hash: Digest(hash),
    })
}

fn reader_for_url(url: &str) -> Result<Connection, StoreError> {
    let options = SqliteOptions::from_url(url)
        .map_err(|e| StoreError::backend(format!("invalid database url: {e}")))?;
    schema::open_reader(&options.path)
}

/// Verify the audit log of the database at `url` (a `sqlite://` URL; its
/// `mode` is ignored, the file is always opened read-only).
///
/// Checks, in one read snapshot and constant memory: every entry's hash
/// against its fields, every link to the previous entry, gap-free sequence
/// numbers, that the chain ends exactly at the recorded head (the
/// `audit_head` row, so a cut tail is detected), and, when `anchor` is given
/// (`--expect-head SEQ:HASH`), that the entry at the anchor's sequence
/// number has the anchor's hash (so a consistent rewrite of the whole file
/// is detected too). The error names the first bad entry
/// ([`VerifyError::seq`]).
///
/// `warden audit verify --database URL [--expect-head SEQ:HASH]` prints the
/// report (or the error) and exits 0 when verified, 1 when the log is
/// broken ([`VerifyError`] other than `Store`), 2 when it cannot be read.
pub fn verify_audit(url: &str, anchor: Option<HeadAnchor>) -> Result<VerifyReport, VerifyError> {
    verify_audit_with(url, anchor, None)
}

/// [`verify_audit`], also checking the signed checkpoints in the log (and
/// the anchors) with `checkpoints` (`warden audit verify --trust PUBKEY
/// [--anchors FILE]`): each checkpoint entry must be signed by a trusted
/// key and the chain must pass through the head it signs; the chain must
/// pass through and reach every anchor.
pub fn verify_audit_with(
    url: &str,
    anchor: Option<HeadAnchor>,
    checkpoints: Option<CheckpointVerifier>,
) -> Result<VerifyReport, VerifyError> {
    let mut conn = reader_for_url(url)?;
    verify_conn(&mut conn, anchor, checkpoints)
}

/// [`verify_audit`] for a file path.
pub fn verify_audit_path(
    path: &Path,
    anchor: Option<HeadAnchor>,
) -> Result<VerifyReport, VerifyError> {
    let mut conn = schema::open_reader(path)?;
    verify_conn(&mut conn, anchor, None)
}

/// Verify on an open connection, in one read transaction.
pub(crate) fn verify_conn(
    conn: &mut Connection,
    anchor: Option<HeadAnchor>,
    checkpoints: Option<CheckpointVerifier>,
) -> Result<VerifyReport, VerifyError> {
    let tx = conn.transaction().store()?;
    let recorded = read_head(&tx).map_err(|e| VerifyError::HeadMissing(e.to_string()))?;
    let mut checker = AuditChecker::new(recorded, anchor).with_checkpoints(checkpoints);
    {
        let mut stmt = tx
            .prepare(&format!("SELECT {AUDIT_COLUMNS} FROM audit ORDER BY seq"))
            .store()?;
        let mut rows = stmt.query([]).store()?;
        while let Some(row) = rows.next().store()? {
            // Hash the stored bytes as they are: no entry is built.
            let entry = codec::audit_ref(row).map_err(|b| VerifyError::Undecodable {
                seq: b.seq,
                reason: b.reason,
            })?;
            checker.push_ref(&entry)?;
        }
    }
    tx.finish().store()?;
    checker.finish()
}

/// The recorded head of the database at `url`: what an operator exports
/// (as `SEQ:HASH`, see [`HeadAnchor`]) and keeps elsewhere, to pass back
/// later as `--expect-head`.
pub fn read_audit_head(url: &str) -> Result<HeadAnchor, StoreError> {
    let conn = reader_for_url(url)?;
    read_head(&conn).map(|h| HeadAnchor::of(&h))
}

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The database could not be read (or an entry does not decode).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing the output failed (a broken pipe, say: the CLI treats that as
    /// success).
    #[error("cannot write the export: {0}")]
    Io(#[from] std::io::Error),
}

/// Write every audit entry with `seq > after` to `out` as JSON Lines, in
/// ascending order, from one read snapshot; returns how many were written.
///
/// One line per entry, the serde form of `AuditEntry`: `seq`, `time`,
/// `subject`, `operation`, `resource`, `verdict`, `reason`,
/// `policy_version`, `details`, `prev_hash`, `hash` (hex). Export does not
/// verify; run [`verify_audit`] for that. This is `warden audit export
/// --database URL [--after SEQ]`.
pub fn export_audit<W: Write>(url: &str, after: u64, out: W) -> Result<u64, ExportError> {
    let mut conn = reader_for_url(url)?;
    export_conn(&mut conn, after, out)
}

fn export_conn<W: Write>(conn: &mut Connection, after: u64, out: W) -> Result<u64, ExportError> {
    let Ok(after) = i64::try_from(after) else {
        return Ok(0);
    };
    let mut out = BufWriter::new(out);
    let tx = conn.transaction().store()?;
    let mut written = 0;
    {
        let mut stmt = tx
            .prepare(&format!(
                "SELECT {AUDIT_COLUMNS} FROM audit WHERE seq > ?1 ORDER BY seq"
            ))
            .store()?;
        let mut rows = stmt.query([after]).store()?;
        while let Some(row) = rows.next().store()? {
            let entry = codec::audit_from_row(row).map_err(StoreError::from)?;
            serde_json::to_writer(&mut out, &entry).map_err(std::io::Error::from)?;
            out.write_all(b"\n")?;
            written += 1;
        }
    }
    tx.finish().store()?;
    out.flush()?;
    Ok(written)
}

/// Up to `limit` entries with `seq > after`, ascending.
pub(crate) fn audit_page_in(
    conn: &Connection,
    after: u64,
    limit: usize,
) -> Result<Vec<AuditEntry>, StoreError> {
    let Ok(after) = i64::try_from(after) else {
        return Ok(Vec::new());
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {} FROM audit WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            codec::AUDIT_COLUMNS
        ))
        .store()?;
    let mut rows = stmt.query(params![after, limit]).store()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().store()? {
        out.push(codec::audit_from_row(row)?);
    }
    Ok(out)
}
