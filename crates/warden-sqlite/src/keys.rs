//! Envelope signing keys (schema version 8): read by generation, created
//! once per generation in the writer's transaction.

use rusqlite::{Connection, OptionalExtension, params};
use warden_core::audit::AuditDraft;
use warden_core::time::Timestamp;
use warden_store::{SigningKeyRecord, StoreError};

use crate::codec::{column, seq_to_sql, to_u64};
use crate::error::{SqlResultExt, corrupt};
use crate::writer::Tx;

const WHAT: &str = "envelope_signing_keys";

fn bytes32(v: Vec<u8>, what: &str) -> Result<[u8; 32], StoreError> {
    <[u8; 32]>::try_from(v).map_err(|_| corrupt(WHAT, format!("a {what} is not 32 bytes")))
}

pub(crate) fn signing_keys_in(conn: &mut Connection) -> Result<Vec<SigningKeyRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT generation, seed, public_key, created_at FROM envelope_signing_keys \
             ORDER BY generation",
        )
        .store()?;
    let mut rows = stmt.query([]).store()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().store()? {
        let generation: i64 = column(row, 0, &WHAT)?;
        out.push(SigningKeyRecord {
            generation: to_u64(WHAT, generation)?,
            seed: bytes32(column(row, 1, &WHAT)?, "seed")?,
            public_key: bytes32(column(row, 2, &WHAT)?, "public key")?,
            created_at: Timestamp(column(row, 3, &WHAT)?),
        });
    }
    Ok(out)
}

/// Insert `key` unless its generation is taken (then `false`, nothing
/// written or appended); `audit` is appended with it.
pub(crate) fn insert_signing_key_in(
    tx: &mut Tx<'_>,
    key: &SigningKeyRecord,
    audit: Vec<AuditDraft>,
) -> Result<bool, StoreError> {
    let generation = seq_to_sql(key.generation)?;
    let taken = tx
        .conn()
        .prepare_cached("SELECT 1 FROM envelope_signing_keys WHERE generation = ?1")
        .store()?
        .query_row([generation], |_| Ok(()))
        .optional()
        .store()?
        .is_some();
    if taken {
        return Ok(false);
    }
    tx.conn()
        .prepare_cached(
            "INSERT INTO envelope_signing_keys (generation, seed, public_key, created_at) \
             VALUES (?1, ?2, ?3, ?4)",
        )
        .store()?
        .execute(params![
            generation,
            key.seed.as_slice(),
            key.public_key.as_slice(),
            key.created_at.0
        ])
        .store()?;
    tx.append(audit)?;
    Ok(true)
}
