//! Migrations on start: concurrent starts, reconnects, refusal of a newer
//! schema, and the URL and schema-name checks.

use serde_json::json;
use warden_core::time::Timestamp;
use warden_postgres::{PgStore, SCHEMA_VERSION, is_postgres_url};
use warden_store::{Store, StoreError};

use crate::support::*;

async fn count_tables(sql: &tokio_postgres::Client, schema: &str) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM pg_tables WHERE schemaname = $1",
        &[&schema],
    )
    .await
    .unwrap()
    .get(0)
}

/// Four servers start at once on an empty schema: all connect, one schema
/// results, with one version row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_concurrent_starts_migrate_once() {
    let scratch = scratch_or_skip!();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (url, schema) = (scratch.url.clone(), scratch.schema.clone());
        tasks.push(tokio::spawn(async move {
            PgStore::connect_in_schema(&url, &schema).await
        }));
    }
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.unwrap().unwrap());
    }
    let sql = scratch.client().await;
    let versions: Vec<i64> = sql
        .query("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [SCHEMA_VERSION]);
    assert_eq!(count_tables(&sql, &scratch.schema).await, 9);
    // Every instance works on the same data.
    for (i, store) in stores.iter().enumerate() {
        store
            .put_record(
                put("a", "ns", &format!("k{i}"), json!(i), Some(0)),
                Timestamp(1),
                put_audit("a", "k", 0),
            )
            .await
            .unwrap();
    }
    assert_eq!(head_count(&stores[0]).await, 4);
    assert_chain(&stores[3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_keeps_the_data() {
    let scratch = scratch_or_skip!();
    {
        let store = scratch.store().await;
        store.append_audit(vec![numbered(1)]).await.unwrap();
        store
            .insert_agent(agent("root", None), register("root"))
            .await
            .unwrap();
    }
    let store = scratch.store().await;
    assert_eq!(
        store.load_agents().await.unwrap(),
        vec![agent("root", None)]
    );
    assert_eq!(head_count(&store).await, 2);
    assert_eq!(store.schema(), scratch.schema);
    assert_eq!(
        store.channel(),
        format!("warden_changes_{}", scratch.schema)
    );
}

/// A database written by a newer Warden is refused and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_without_changes() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store.append_audit(vec![numbered(1)]).await.unwrap();
    drop(store);
    let sql = scratch.client().await;
    let newer = SCHEMA_VERSION + 1;
    sql.execute("UPDATE warden_meta SET schema_version = $1", &[&newer])
        .await
        .unwrap();
    let tables = count_tables(&sql, &scratch.schema).await;
    let err = PgStore::connect_in_schema(&scratch.url, &scratch.schema)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::SchemaTooNew {
            found: newer,
            supported: SCHEMA_VERSION
        }
    );
    let version: i64 = sql
        .query_one("SELECT schema_version FROM warden_meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, newer);
    assert_eq!(count_tables(&sql, &scratch.schema).await, tables);
    let entries: i64 = sql
        .query_one("SELECT count(*) FROM audit_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(entries, 1);
}

/// A schema that holds tables named like Warden's but is not a Warden
/// schema is refused, not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_tables_are_not_adopted() {
    let scratch = scratch_or_skip!();
    let sql = raw_client(&scratch.url).await;
    sql.batch_execute(&format!(
        "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".memory (id int)",
        scratch.schema
    ))
    .await
    .unwrap();
    let err = PgStore::connect_in_schema(&scratch.url, &scratch.schema)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert_eq!(count_tables(&sql, &scratch.schema).await, 1);
}

/// `connect` without a schema uses the connection's current schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_uses_the_current_schema() {
    let scratch = scratch_or_skip!();
    let sql = raw_client(&scratch.url).await;
    sql.batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let sep = if scratch.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options=-csearch_path%3D{}",
        scratch.url, scratch.schema
    );
    let store = PgStore::connect(&url).await.unwrap();
    assert_eq!(store.schema(), scratch.schema);
    store.append_audit(vec![numbered(1)]).await.unwrap();
    assert_eq!(count_tables(&sql, &scratch.schema).await, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_postgres_urls_and_plain_schema_names_are_accepted() {
    assert!(is_postgres_url("postgres://u@h/db"));
    assert!(is_postgres_url("postgresql://u@h/db"));
    assert!(!is_postgres_url("sqlite://warden.db"));
    let err = PgStore::connect("sqlite://warden.db").await.unwrap_err();
    assert!(
        matches!(err, StoreError::Backend(ref m) if m.contains("postgres://")),
        "{err:?}"
    );
    for bad in [
        "",
        "Upper",
        "1digit",
        "semi;colon",
        "quo\"te",
        &"x".repeat(49),
    ] {
        let err = PgStore::connect_in_schema("postgres://nobody@127.0.0.1:1/none", bad)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Backend(_)), "{bad}: {err:?}");
    }
}
