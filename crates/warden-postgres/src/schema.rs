//! Versioned migrations, applied on start.
//!
//! Several servers may start at once against one database. Each runs
//! [`migrate`] in one transaction that first takes a transaction-scoped
//! advisory lock keyed by the schema name, so exactly one of them applies a
//! migration and the others, once they get the lock, find the schema
//! current. DDL is transactional in PostgreSQL: a migration that fails
//! leaves nothing behind. A database whose `warden_meta.schema_version` is
//! newer than this build is refused with [`StoreError::SchemaTooNew`] and
//! not changed.

use tokio_postgres::{Client, IsolationLevel};
use warden_store::StoreError;

use crate::error::DbResult;

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i64 = 9;

/// Every migration, in order: `(version it produces, SQL)`.
///
/// - 1: agents, tokens, memory, the audit log and its head, runs, changes.
/// - 2: context envelopes (`envelopes`, `envelope_heads`), the escalation
///   queue (`escalations`), and `envelope_id` on agents and runs.
/// - 3: `finished_at` on runs (runs in flight), with its partial index.
/// - 4: tool-call sessions (`sessions`, `session_calls`) and the envelope
///   imports they were opened from (`envelope_imports`).
/// - 5: a call's `seq` unique within its session.
/// - 6: the request an escalation holds (`escalations.request`) and step
///   leases (`run_steps.lease_holder`, `lease_expires_at`).
/// - 7: a session's source index in parts (`session_index`), out of the
///   session row: a result appends its delta.
/// - 8: state servers share: request-rate buckets (`request_buckets` and the
///   `take_request_tokens` function) and envelope signing keys
///   (`envelope_signing_keys`).
/// - 9: audit entries sealed inside the database (`warden_append_sealed`,
///   `warden_le8`).
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/0001_initial.sql")),
    (2, include_str!("migrations/0002_context.sql")),
    (3, include_str!("migrations/0003_runs_in_flight.sql")),
    (4, include_str!("migrations/0004_sessions.sql")),
    (5, include_str!("migrations/0005_call_seq_unique.sql")),
    (6, include_str!("migrations/0006_bound_requests.sql")),
    (7, include_str!("migrations/0007_session_index_parts.sql")),
    (8, include_str!("migrations/0008_shared_server_state.sql")),
    (9, include_str!("migrations/0009_append_in_database.sql")),
];

/// First key of the migration advisory lock ("Ward").
const LOCK_CLASS: i32 = 0x5761_7264;

/// Second key of the advisory lock: the schema name, hashed (FNV-1a), so
/// different schemas in one database migrate independently.
fn lock_key(schema: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in schema.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// `schema` as a quoted SQL identifier.
pub(crate) fn quote_ident(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// Bring `schema` to [`SCHEMA_VERSION`] on a connection whose `search_path`
/// is already `schema`, creating the schema if `create` is set. Returns the
/// version found before.
pub(crate) async fn migrate(
    client: &mut Client,
    schema: &str,
    create: bool,
) -> Result<i64, StoreError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .db()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, $2)",
        &[&LOCK_CLASS, &lock_key(schema)],
    )
    .await
    .db()?;
    if create {
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {}",
            quote_ident(schema)
        ))
        .await
        .db()?;
    }
    let has_meta: bool = tx
        .query_one(
            "SELECT to_regclass(format('%I.warden_meta', $1::text)) IS NOT NULL",
            &[&schema],
        )
        .await
        .db()?
        .try_get(0)
        .map_err(crate::error::column)?;
    let found = if has_meta {
        let row = tx
            .query_opt("SELECT schema_version FROM warden_meta", &[])
            .await
            .db()?
            .ok_or_else(|| StoreError::corrupt("warden_meta holds no schema version"))?;
        row.try_get::<_, i64>(0).map_err(crate::error::column)?
    } else {
        let tables: i64 = tx
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1 \
                 AND tablename IN ('agents', 'tokens', 'memory', 'audit_log', 'audit_head', \
                 'runs', 'run_steps', 'changes', 'envelopes', 'envelope_heads', 'escalations', \
                 'sessions', 'session_calls', 'envelope_imports')",
                &[&schema],
            )
            .await
            .db()?
            .try_get(0)
            .map_err(crate::error::column)?;
        if tables > 0 {
            return Err(StoreError::corrupt(format!(
                "schema `{schema}` holds tables named like warden's but no warden_meta"
            )));
        }
        0
    };
    if found > SCHEMA_VERSION {
        // Dropping `tx` rolls back: nothing was changed.
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        tx.commit().await.db()?;
        return Ok(found);
    }
    for (version, sql) in MIGRATIONS {
        if *version > found {
            tx.batch_execute(sql).await.map_err(|e| {
                crate::error::db(e).context(format_args!("migration to version {version} failed"))
            })?;
        }
    }
    if found == 0 {
        tx.execute(
            "INSERT INTO warden_meta (schema_version) VALUES ($1)",
            &[&SCHEMA_VERSION],
        )
        .await
        .db()?;
    } else {
        tx.execute(
            "UPDATE warden_meta SET schema_version = $1",
            &[&SCHEMA_VERSION],
        )
        .await
        .db()?;
    }
    tx.commit().await.db()?;
    Ok(found)
}

/// Check, without changing anything, that `schema` holds a Warden database
/// this build can read.
pub(crate) async fn check_existing(client: &Client, schema: &str) -> Result<(), StoreError> {
    let has_meta: bool = client
        .query_one(
            "SELECT to_regclass(format('%I.warden_meta', $1::text)) IS NOT NULL",
            &[&schema],
        )
        .await
        .db()?
        .try_get(0)
        .map_err(crate::error::column)?;
    if !has_meta {
        return Err(StoreError::corrupt(format!(
            "schema `{schema}` holds no warden database"
        )));
    }
    let found: i64 = client
        .query_opt("SELECT schema_version FROM warden_meta", &[])
        .await
        .db()?
        .ok_or_else(|| StoreError::corrupt("warden_meta holds no schema version"))?
        .try_get(0)
        .map_err(crate::error::column)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("plain"), "\"plain\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn lock_keys_differ_by_schema() {
        assert_ne!(lock_key("a"), lock_key("b"));
        assert_eq!(lock_key("public"), lock_key("public"));
    }

    #[test]
    fn migrations_are_ordered_and_end_at_the_current_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(versions.last(), Some(&SCHEMA_VERSION));
    }
}
