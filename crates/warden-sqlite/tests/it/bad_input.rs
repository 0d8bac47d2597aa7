//! Files Warden must refuse, with a precise error, without changing them.

use std::os::unix::fs::PermissionsExt;

use serde_json::json;
use warden_sqlite::{SqliteOptions, SqliteStore, verify_audit};
use warden_store::conformance::put_audit;
use warden_store::{Store, StoreError, VerifyError};

use crate::support::{Rng, Snapshot, id, note, put, temp_db, url};

async fn open(path: &std::path::Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::open(&url(path)).await
}

#[tokio::test]
async fn random_bytes_are_corrupt_and_untouched() {
    let (_dir, path) = temp_db();
    let mut rng = Rng::new(7);
    let bytes: Vec<u8> = (0..65_536).map(|_| rng.next() as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let before = Snapshot::of(&path);
    let err = open(&path).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("not a sqlite database"), "{err}");
    assert_eq!(Snapshot::of(&path), before);
    // A SQLite header followed by garbage is no better.
    let mut fake = b"SQLite format 3\0".to_vec();
    fake.extend_from_slice(&bytes[..4096]);
    std::fs::write(&path, &fake).unwrap();
    let before = Snapshot::of(&path);
    let err = open(&path).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(Snapshot::of(&path), before);
    let err = verify_audit(&url(&path), None).unwrap_err();
    assert!(
        matches!(err, VerifyError::Store(StoreError::Corrupt { .. })),
        "{err:?}"
    );
    assert_eq!(Snapshot::of(&path), before);
}

#[tokio::test]
async fn foreign_sqlite_database_is_corrupt_and_untouched() {
    let (dir, path) = temp_db();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada');",
        )
        .unwrap();
    }
    let before = Snapshot::of(&path);
    let err = open(&path).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("another application"), "{err}");
    assert_eq!(Snapshot::of(&path), before);
    let err = verify_audit(&url(&path), None).unwrap_err();
    assert!(
        matches!(err, VerifyError::Store(StoreError::Corrupt { .. })),
        "{err:?}"
    );
    assert_eq!(Snapshot::of(&path), before);
    // Nothing was left beside it either (no journal, no WAL).
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["warden.db"]);
}

#[tokio::test]
async fn newer_schema_is_refused_and_untouched() {
    let (_dir, path) = temp_db();
    {
        let store = open(&path).await.unwrap();
        store.append_audit(vec![note(1)]).await.unwrap();
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("UPDATE meta SET schema_version = 99", [])
            .unwrap();
    }
    let before = Snapshot::of(&path);
    let expected = StoreError::SchemaTooNew {
        found: 99,
        supported: warden_sqlite::SCHEMA_VERSION,
    };
    assert_eq!(open(&path).await.unwrap_err(), expected);
    assert_eq!(Snapshot::of(&path), before);
    let ro = format!("{}?mode=ro", url(&path));
    assert_eq!(SqliteStore::open(&ro).await.unwrap_err(), expected);
    assert_eq!(
        verify_audit(&url(&path), None).unwrap_err(),
        VerifyError::Store(expected)
    );
    assert_eq!(Snapshot::of(&path), before);
}

#[tokio::test]
async fn read_only_mode_reads_and_refuses_writes() {
    let (_dir, path) = temp_db();
    {
        let store = open(&path).await.unwrap();
        store
            .put_record(
                put("a", "ns", "k", json!(1), None),
                warden_core::time::Timestamp(1),
                warden_store::StorageQuota::default(),
                put_audit("a", "ns.k", 1),
            )
            .await
            .unwrap();
    }
    let before = Snapshot::of(&path);
    let store = SqliteStore::open(&format!("{}?mode=ro", url(&path)))
        .await
        .unwrap();
    let got = store
        .get_records(
            warden_core::ids::Namespace::parse("ns").unwrap(),
            warden_core::ids::Key::parse("k").unwrap(),
            vec![id("a")],
        )
        .await
        .unwrap();
    assert_eq!(got[0].value, json!(1));
    let head = store.audit_head().await.unwrap();
    let err = store.append_audit(vec![note(2)]).await.unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    let err = store
        .put_record(
            put("a", "ns", "k", json!(2), None),
            warden_core::time::Timestamp(2),
            warden_store::StorageQuota::default(),
            put_audit("a", "ns.k", 2),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    assert_eq!(store.audit_head().await.unwrap(), head);
    assert!(store.verify_audit(None).await.is_ok());
    drop(store);
    assert_eq!(Snapshot::of(&path), before);
}

#[tokio::test]
async fn read_only_mode_never_creates_or_initialises() {
    let (dir, path) = temp_db();
    let ro = format!("{}?mode=ro", url(&path));
    let err = SqliteStore::open(&ro).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(!path.exists());
    // `rw` needs an existing file too.
    let err = SqliteStore::open(&format!("{}?mode=rw", url(&path)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(!path.exists());
    // An empty file would need initialising, which read-only cannot do.
    std::fs::write(&path, b"").unwrap();
    let err = SqliteStore::open(&ro).await.unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    drop(dir);
}

#[tokio::test]
async fn unusable_locations_are_clear_errors() {
    let (dir, _) = temp_db();
    // Under a directory that does not exist: nothing is created.
    let missing = dir.path().join("no/such/dir/warden.db");
    let err = open(&missing).await.unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(!dir.path().join("no").exists());
    // A directory is not a database.
    let err = open(dir.path()).await.unwrap_err();
    assert!(err.to_string().contains("directory"), "{err}");
    // A URL that is not SQLite's.
    let err = SqliteStore::open("postgres://localhost/warden")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a sqlite url"), "{err}");
}

#[tokio::test]
async fn unwritable_directory_is_read_only() {
    let (dir, _) = temp_db();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let path = locked.join("warden.db");
    // Root (as in CI) ignores directory permissions; check whether this
    // process can in fact create a file there.
    let probe = locked.join("probe");
    let privileged = std::fs::write(&probe, b"").is_ok();
    if privileged {
        std::fs::remove_file(&probe).unwrap();
        // What holds whoever we are: a read-only open of a database created
        // here changes nothing and refuses writes.
        let store = open(&path).await.unwrap();
        store.append_audit(vec![note(1)]).await.unwrap();
        drop(store);
        let before = Snapshot::of(&path);
        let ro = SqliteStore::open_with(SqliteOptions::new(&path).read_only())
            .await
            .unwrap();
        let err = ro.append_audit(vec![note(2)]).await.unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
        drop(ro);
        assert_eq!(Snapshot::of(&path), before);
    } else {
        let err = open(&path).await.unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
        assert!(!path.exists());
    }
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A file a writer left in the middle of a transaction (a hot rollback
/// journal beside it, no lock held): verifying it read-only is refused as
/// read-only, saying it needs recovery, not called corrupt, and neither the
/// file nor its journal changes.
#[test]
fn a_hot_journal_needs_recovery_and_a_read_only_verify_changes_nothing() {
    let (dir, path) = temp_db();
    let live = dir.path().join("live.db");
    let conn = rusqlite::Connection::open(&live).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = DELETE; PRAGMA cache_size = 1;
         CREATE TABLE t (x BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
         INSERT INTO t SELECT zeroblob(1000) FROM n;
         BEGIN; UPDATE t SET x = zeroblob(1001);",
    )
    .unwrap();
    // The transaction is open: its journal holds the pages it changed,
    // some already spilled to the file. Copies of both, with no connection
    // and so no lock, are what a writer killed at this point leaves.
    let journal = |p: &std::path::Path| {
        let mut j = p.as_os_str().to_owned();
        j.push("-journal");
        std::path::PathBuf::from(j)
    };
    std::fs::copy(&live, &path).unwrap();
    std::fs::copy(journal(&live), journal(&path)).unwrap();
    drop(conn);
    let before = (Snapshot::of(&path), Snapshot::of(&journal(&path)));
    let err = verify_audit(&url(&path), None).unwrap_err();
    match &err {
        VerifyError::Store(StoreError::ReadOnly { source }) => {
            assert!(source.to_string().contains("needs recovery"), "{err}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((Snapshot::of(&path), Snapshot::of(&journal(&path))), before);
}
