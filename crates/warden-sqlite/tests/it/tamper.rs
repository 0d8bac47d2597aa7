//! Someone edits the file behind Warden's back: verification names the
//! first bad entry. Each case opens the file with rusqlite directly, drops
//! the append-only triggers (as an attacker with the file would), and
//! tampers.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};
use warden_core::audit::{AuditEntry, ChainBreak, Digest};
use warden_sqlite::{SqliteStore, read_audit_head, verify_audit, verify_audit_path};
use warden_store::{HeadAnchor, Store, StoreError, VerifyError, verify_store};

use crate::support::{note, temp_db, url};

const N: u64 = 10;

/// A database with entries 1..=10 and no open store.
async fn fresh() -> (tempfile::TempDir, PathBuf, HeadAnchor) {
    let (dir, path) = temp_db();
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    for i in 1..=N {
        store.append_audit(vec![note(i)]).await.unwrap();
    }
    drop(store);
    let anchor = read_audit_head(&url(&path)).unwrap();
    assert_eq!(anchor.seq, N);
    assert!(verify_audit(&url(&path), Some(anchor)).is_ok());
    (dir, path, anchor)
}

fn attacker(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;
         DROP TRIGGER audit_head_forward; DROP TRIGGER audit_head_no_delete;",
    )
    .unwrap();
    conn
}

fn tamper(path: &Path, sql: &str) {
    attacker(path).execute_batch(sql).unwrap();
}

fn verify(path: &Path) -> Result<warden_store::VerifyReport, VerifyError> {
    verify_audit_path(path, None)
}

#[tokio::test]
async fn the_triggers_refuse_plain_sql_edits() {
    let (_dir, path, _) = fresh().await;
    let conn = Connection::open(&path).unwrap();
    for sql in [
        "UPDATE audit SET reason = 'x' WHERE seq = 2",
        "DELETE FROM audit WHERE seq = 10",
        "UPDATE audit_head SET seq = 3",
        "DELETE FROM audit_head",
    ] {
        let err = conn.execute_batch(sql).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("append-only") || msg.contains("audit head"),
            "{sql}: {msg}"
        );
    }
    drop(conn);
    assert!(verify(&path).is_ok());
}

#[tokio::test]
async fn an_edited_field_is_named() {
    let (_dir, path, _) = fresh().await;
    tamper(
        &path,
        "UPDATE audit SET reason = 'approved_by_admin' WHERE seq = 4",
    );
    let err = verify(&path).unwrap_err();
    assert!(
        matches!(err, VerifyError::Broken(ChainBreak::Altered { seq: 4 })),
        "{err:?}"
    );
    assert!(err.to_string().contains("entry 4"), "{err}");

    let (_dir, path, _) = fresh().await;
    tamper(
        &path,
        r#"UPDATE audit SET details = '{"i":99}' WHERE seq = 5"#,
    );
    assert_eq!(verify(&path).unwrap_err().seq(), Some(5));

    // Even a change that keeps the JSON's meaning: the stored bytes are
    // what is hashed.
    let (_dir, path, _) = fresh().await;
    tamper(
        &path,
        r#"UPDATE audit SET details = '{ "i": 3 }' WHERE seq = 3"#,
    );
    assert_eq!(
        verify(&path).unwrap_err(),
        VerifyError::Broken(ChainBreak::Altered { seq: 3 })
    );

    let (_dir, path, _) = fresh().await;
    tamper(&path, "UPDATE audit SET time = time + 1 WHERE seq = 1");
    assert_eq!(
        verify(&path).unwrap_err(),
        VerifyError::Broken(ChainBreak::Altered { seq: 1 })
    );
}

#[tokio::test]
async fn an_undecodable_field_is_named() {
    let (_dir, path, _) = fresh().await;
    tamper(&path, "UPDATE audit SET verdict = 'maybe' WHERE seq = 6");
    let err = verify(&path).unwrap_err();
    assert!(
        matches!(err, VerifyError::Undecodable { seq: 6, .. }),
        "{err:?}"
    );

    let (_dir, path, _) = fresh().await;
    tamper(&path, "UPDATE audit SET hash = x'0102' WHERE seq = 7");
    assert!(matches!(
        verify(&path).unwrap_err(),
        VerifyError::Undecodable { seq: 7, .. }
    ));

    // The store reports the same entry as corrupt when it is paged.
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    let err = store.audit_page(0, 100).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { detail, .. } if detail.contains("audit entry 7")),
        "{err:?}"
    );
    assert!(matches!(
        store.verify_audit(None).await,
        Err(VerifyError::Undecodable { seq: 7, .. })
    ));
}

#[tokio::test]
async fn a_deleted_entry_is_named() {
    let (_dir, path, _) = fresh().await;
    tamper(&path, "DELETE FROM audit WHERE seq = 3");
    let err = verify(&path).unwrap_err();
    assert_eq!(
        err,
        VerifyError::Broken(ChainBreak::Unlinked {
            seq: 4,
            prev_seq: 2
        })
    );
    assert_eq!(err.seq(), Some(4));
}

#[tokio::test]
async fn swapped_entries_are_named() {
    let (_dir, path, _) = fresh().await;
    tamper(
        &path,
        "CREATE TEMP TABLE t AS SELECT * FROM audit WHERE seq IN (2, 3);
         UPDATE audit SET (time, subject, operation, resource, verdict, reason, policy_version, details, prev_hash, hash) =
           (SELECT time, subject, operation, resource, verdict, reason, policy_version, details, prev_hash, hash
            FROM t WHERE t.seq = 5 - audit.seq)
         WHERE seq IN (2, 3);",
    );
    assert_eq!(
        verify(&path).unwrap_err(),
        VerifyError::Broken(ChainBreak::Altered { seq: 2 })
    );
}

#[tokio::test]
async fn a_cut_tail_is_caught_by_the_recorded_head() {
    let (_dir, path, _) = fresh().await;
    tamper(&path, "DELETE FROM audit WHERE seq > 7");
    let err = verify(&path).unwrap_err();
    assert_eq!(
        err,
        VerifyError::Broken(ChainBreak::Truncated {
            last_seq: 7,
            head_seq: 10
        })
    );
    assert_eq!(err.seq(), Some(8));
    // Through the store as well, both verifiers.
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    assert_eq!(store.verify_audit(None).await.unwrap_err().seq(), Some(8));
    assert_eq!(verify_store(&store, None).await.unwrap_err().seq(), Some(8));
}

#[tokio::test]
async fn a_cut_tail_with_a_rewound_head_needs_the_anchor() {
    let (_dir, path, anchor) = fresh().await;
    tamper(
        &path,
        "DELETE FROM audit WHERE seq > 7;
         UPDATE audit_head SET seq = 7, hash = (SELECT hash FROM audit WHERE seq = 7);",
    );
    // Consistent on its own...
    assert_eq!(verify(&path).unwrap().verified.seq, 7);
    // ...but not with the head exported before.
    let err = verify_audit(&url(&path), Some(anchor)).unwrap_err();
    assert_eq!(
        err,
        VerifyError::AnchorNotReached {
            last_seq: 7,
            anchor_seq: 10
        }
    );
    assert_eq!(err.seq(), Some(8));
}

#[tokio::test]
async fn a_full_rewrite_needs_the_anchor() {
    let (_dir, path, anchor) = fresh().await;
    // Forge entry 3 and recompute every later hash and the head.
    let conn = attacker(&path);
    let entries: Vec<AuditEntry> = {
        let store_entries = read_all(&conn);
        assert_eq!(store_entries.len() as u64, N);
        store_entries
    };
    let mut prev = entries[1].hash;
    for e in entries.into_iter().skip(2) {
        let mut draft = e.draft.clone();
        if e.seq == 3 {
            draft.reason = "forged".into();
        }
        let sealed = draft.seal(e.seq, prev);
        conn.execute(
            "UPDATE audit SET reason = ?2, prev_hash = ?3, hash = ?4 WHERE seq = ?1",
            params![
                e.seq as i64,
                sealed.draft.reason,
                sealed.prev_hash.0,
                sealed.hash.0
            ],
        )
        .unwrap();
        prev = sealed.hash;
    }
    conn.execute("UPDATE audit_head SET hash = ?1", [prev.0])
        .unwrap();
    drop(conn);
    assert_eq!(verify(&path).unwrap().verified.seq, N);
    let err = verify_audit(&url(&path), Some(anchor)).unwrap_err();
    assert!(
        matches!(err, VerifyError::AnchorMismatch { seq: N }),
        "{err:?}"
    );
    // An anchor on an earlier, untouched entry still verifies; one on the
    // forged entry does not.
    let early = HeadAnchor {
        seq: 2,
        hash: read_all(&Connection::open(&path).unwrap())[1].hash,
    };
    assert!(verify_audit(&url(&path), Some(early)).is_ok());
}

#[tokio::test]
async fn entries_past_the_head_are_named() {
    let (_dir, path, _) = fresh().await;
    let conn = attacker(&path);
    let last = read_all(&conn).pop().unwrap();
    let extra = note(11).seal(11, last.hash);
    conn.execute(
        "INSERT INTO audit SELECT 11, time, subject, operation, resource, verdict, reason, policy_version, details, ?1, ?2 FROM audit WHERE seq = 10",
        params![extra.prev_hash.0, Digest::of(b"whatever").0],
    )
    .unwrap();
    drop(conn);
    let err = verify(&path).unwrap_err();
    // Entry 11 is bad either way: its hash is wrong, and it lies past the head.
    assert_eq!(err.seq(), Some(11));
    let (_dir, path, _) = fresh().await;
    let conn = attacker(&path);
    let last = read_all(&conn).pop().unwrap();
    let extra = note(11).seal(11, last.hash);
    conn.execute(
        "INSERT INTO audit VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            11i64,
            extra.draft.time.0,
            extra.draft.subject,
            extra.draft.operation,
            extra.draft.resource,
            extra.draft.verdict.as_str(),
            extra.draft.reason,
            extra.draft.policy_version,
            serde_json::to_string(&extra.draft.details).unwrap(),
            extra.prev_hash.0,
            extra.hash.0
        ],
    )
    .unwrap();
    drop(conn);
    assert_eq!(
        verify(&path).unwrap_err(),
        VerifyError::PastHead {
            seq: 11,
            head_seq: 10
        }
    );
}

#[tokio::test]
async fn a_missing_head_is_reported() {
    let (_dir, path, _) = fresh().await;
    tamper(&path, "DELETE FROM audit_head");
    assert!(matches!(
        verify(&path).unwrap_err(),
        VerifyError::HeadMissing(_)
    ));
}

fn read_all(conn: &Connection) -> Vec<AuditEntry> {
    let mut stmt = conn
        .prepare("SELECT seq, time, subject, operation, resource, verdict, reason, policy_version, details, prev_hash, hash FROM audit ORDER BY seq")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            let details: String = r.get(8)?;
            let prev: Vec<u8> = r.get(9)?;
            let hash: Vec<u8> = r.get(10)?;
            let verdict: String = r.get(5)?;
            Ok(AuditEntry {
                seq: r.get::<_, i64>(0)? as u64,
                draft: warden_core::audit::AuditDraft {
                    time: warden_core::time::Timestamp(r.get(1)?),
                    subject: r.get(2)?,
                    operation: r.get(3)?,
                    resource: r.get(4)?,
                    verdict: serde_json::from_value(serde_json::Value::String(verdict)).unwrap(),
                    reason: r.get(6)?,
                    policy_version: r.get(7)?,
                    details: serde_json::from_str(&details).unwrap(),
                },
                prev_hash: Digest(prev.try_into().unwrap()),
                hash: Digest(hash.try_into().unwrap()),
            })
        })
        .unwrap();
    rows.map(|r| r.unwrap()).collect()
}
