//! State every server sharing the database shares (schema version 8):
//! request-rate buckets, charged by the `take_request_tokens` function in
//! one statement, and envelope signing keys, created once per generation.

use warden_core::audit::AuditDraft;
use warden_core::time::Timestamp;
use warden_store::rates::check_charges;
use warden_store::{RateCharge, SigningKeyRecord, StoreError, TakeTokens, check_signing_key};

use crate::codec::{u64_in, u64_out};
use crate::error::column;
use crate::pool::{Pooled, Tx};
use crate::store::PgStore;
use crate::writer::{Done, Route};

const TAKE_TOKENS: &str = "SELECT refused, retry_after_ms FROM take_request_tokens($1::text[], $2::bigint[], $3::bigint[], $4)";

const SIGNING_KEYS: &str = "SELECT generation, seed, public_key, created_at \
     FROM envelope_signing_keys ORDER BY generation";

const INSERT_SIGNING_KEY: &str = "INSERT INTO envelope_signing_keys \
     (generation, seed, public_key, created_at) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (generation) DO NOTHING";

/// Charge one request on `conn`: one statement, one round trip, atomic
/// (its own transaction).
pub(crate) async fn take_tokens_on(
    conn: &mut Pooled<'_>,
    charges: &[RateCharge],
    now: Timestamp,
) -> Result<TakeTokens, StoreError> {
    check_charges(charges)?;
    let buckets: Vec<&str> = charges.iter().map(|c| c.bucket.as_str()).collect();
    let rates: Vec<i64> = charges.iter().map(|c| i64::from(c.rate)).collect();
    let bursts: Vec<i64> = charges.iter().map(|c| i64::from(c.burst)).collect();
    let rows = conn
        .query(TAKE_TOKENS, &[&buckets, &rates, &bursts, &now.0])
        .await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::corrupt("take_request_tokens returned no row"))?;
    let refused: Option<i32> = row.try_get(0).map_err(column)?;
    let wait: i64 = row.try_get(1).map_err(column)?;
    Ok(match refused {
        None => TakeTokens::Taken,
        Some(i) => TakeTokens::Refused {
            index: usize::try_from(i)
                .ok()
                .filter(|i| *i < charges.len())
                .ok_or_else(|| StoreError::corrupt(format!("refused bucket index {i}")))?,
            retry_after_ms: u64_out(wait, "retry wait")?,
        },
    })
}

pub(crate) async fn take_request_tokens(
    store: &PgStore,
    charges: Vec<RateCharge>,
    now: Timestamp,
) -> Result<TakeTokens, StoreError> {
    check_charges(&charges)?;
    let mut conn = store.inner.pool.get().await?;
    take_tokens_on(&mut conn, &charges, now).await
}

fn key_out(row: &tokio_postgres::Row) -> Result<SigningKeyRecord, StoreError> {
    let generation: i64 = row.try_get(0).map_err(column)?;
    let seed: &[u8] = row.try_get(1).map_err(column)?;
    let public: &[u8] = row.try_get(2).map_err(column)?;
    let created_at: i64 = row.try_get(3).map_err(column)?;
    let bytes = |b: &[u8], what: &str| {
        <[u8; 32]>::try_from(b)
            .map_err(|_| StoreError::corrupt(format!("a signing key's {what} is not 32 bytes")))
    };
    Ok(SigningKeyRecord {
        generation: u64_out(generation, "signing key generation")?,
        seed: bytes(seed, "seed")?,
        public_key: bytes(public, "public key")?,
        created_at: Timestamp(created_at),
    })
}

pub(crate) async fn signing_keys(store: &PgStore) -> Result<Vec<SigningKeyRecord>, StoreError> {
    store.read(SIGNING_KEYS, &[], key_out).await
}

/// Insert `key` in `tx`, create-only: `false` (and nothing written) when
/// its generation is taken.
pub(crate) async fn insert_signing_key_in(
    tx: &mut Tx<'_>,
    key: &SigningKeyRecord,
) -> Result<bool, StoreError> {
    check_signing_key(key)?;
    let generation = u64_in(key.generation, "signing key generation")?;
    let inserted = tx
        .execute(
            INSERT_SIGNING_KEY,
            &[
                &generation,
                &key.seed.as_slice(),
                &key.public_key.as_slice(),
                &key.created_at.0,
            ],
        )
        .await?;
    Ok(inserted == 1)
}

pub(crate) async fn insert_signing_key(
    store: &PgStore,
    key: SigningKeyRecord,
    audit: Vec<AuditDraft>,
) -> Result<bool, StoreError> {
    check_signing_key(&key)?;
    store
        .inner
        .writers
        .write(Route::Key("envelope_signing_keys"), move |tx| {
            Box::pin(async move {
                if !insert_signing_key_in(tx, &key).await? {
                    // Nothing stored, nothing appended.
                    return Ok(Done::new(false, Vec::new(), None));
                }
                Ok(Done::new(true, audit, None))
            })
        })
        .await
}
