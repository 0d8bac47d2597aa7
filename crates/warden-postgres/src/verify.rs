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
//! `export_audit`, `read_audit_head`, async here), and the report, error
//! and anchor types are `warden_store::verify`'s, re-exported, so the CLI
//! handles both backends' results alike; the checks are its
//! [`AuditChecker`].

use std::io::{BufWriter, Write};

use warden_core::audit::checkpoint::CheckpointVerifier;
use warden_store::StoreError;
pub use warden_store::verify::{
    AnchorParseError, AuditChecker, HeadAnchor, VerifyError, VerifyReport,
};

use crate::codec::{audit_out, u64_in};
use crate::error::DbResult;
use crate::pool::Conn;
use crate::sql;
use crate::store::PgStore;

/// Entries read per query by [`verify_audit`] and [`export_audit`].
pub const VERIFY_PAGE: usize = 4096;

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
        verify_on(conn.conn()?, anchor, None).await
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
    verify_audit_with(url, anchor, None).await
}

/// [`verify_audit`], also checking the signed checkpoints in the log (and
/// the anchors) with `checkpoints` (`warden audit verify --trust PUBKEY
/// [--anchors FILE]`): each checkpoint entry must be signed by a trusted
/// key and the chain must pass through the head it signs; the chain must
/// pass through and reach every anchor.
pub async fn verify_audit_with(
    url: &str,
    anchor: Option<HeadAnchor>,
    checkpoints: Option<CheckpointVerifier>,
) -> Result<VerifyReport, VerifyError> {
    let mut conn = reader(url).await?;
    verify_on(&mut conn, anchor, checkpoints).await
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
        .ok_or_else(|| StoreError::corrupt("the audit head row is missing"))?;
    Ok(HeadAnchor::of(&crate::tx::head_out(&row)?))
}

/// One connection to an existing Warden schema, for reading only: refuses a
/// schema Warden did not create, or one from a newer Warden.
async fn reader(url: &str) -> Result<Conn, StoreError> {
    let timeouts = crate::store::PgTimeouts::default();
    let config = crate::store::parse_url(url, &timeouts)?;
    let mut client = crate::pool::connect(&config).await?;
    let schema = crate::store::current_schema(&client).await?;
    let setup = crate::store::setup_sql(&mut client, &schema, &timeouts).await?;
    client.batch_execute(&setup).await.db()?;
    crate::schema::check_existing(&client, &schema).await?;
    Ok(Conn::new(client))
}

async fn verify_on(
    conn: &mut Conn,
    anchor: Option<HeadAnchor>,
    checkpoints: Option<CheckpointVerifier>,
) -> Result<VerifyReport, VerifyError> {
    let mut tx = conn.snapshot().await?;
    let head = tx
        .query_opt(sql::HEAD, &[])
        .await?
        .ok_or_else(|| VerifyError::HeadMissing("the audit_head row is missing".into()))?;
    let recorded = crate::tx::head_out(&head).map_err(|e| match e {
        e @ StoreError::Corrupt { .. } => VerifyError::HeadMissing(e.to_string()),
        other => VerifyError::Store(other),
    })?;
    let mut checker = AuditChecker::new(recorded, anchor).with_checkpoints(checkpoints);
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
