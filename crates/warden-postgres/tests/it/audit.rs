//! The audit log: appends, the head, paging, exact hashes, snapshot
//! verification with anchors, tamper detection and export.

use warden_core::audit::{AuditDraft, AuditEntry, ChainBreak, Digest};
use warden_postgres::{HeadAnchor, VerifyError};
use warden_store::Store;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_checks_the_recorded_head_and_anchors() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    let genesis = HeadAnchor {
        seq: 0,
        hash: Digest::GENESIS,
    };
    assert_eq!(
        store
            .verify_audit(Some(genesis))
            .await
            .unwrap()
            .verified
            .count,
        0
    );
    store
        .append_audit((1..=4).map(numbered).collect())
        .await
        .unwrap();
    let head = store.audit_head().await.unwrap();
    let anchor = HeadAnchor::of(&head);
    let report = store.verify_audit(Some(anchor)).await.unwrap();
    assert_eq!((report.verified, report.anchor), (head, Some(anchor)));
    store
        .append_audit((5..=6).map(numbered).collect())
        .await
        .unwrap();
    assert_eq!(
        store.verify_audit(Some(anchor)).await.unwrap().verified.seq,
        6
    );
    let wrong = HeadAnchor {
        seq: 2,
        hash: Digest::of(b"elsewhere"),
    };
    assert_eq!(
        store.verify_audit(Some(wrong)).await,
        Err(VerifyError::AnchorMismatch { seq: 2 })
    );
    let beyond = HeadAnchor {
        seq: 9,
        hash: head.hash,
    };
    let err = store.verify_audit(Some(beyond)).await.unwrap_err();
    assert_eq!(
        err,
        VerifyError::AnchorNotReached {
            last_seq: 6,
            anchor_seq: 9
        }
    );
    assert_eq!(err.seq(), Some(7));
    // Pages longer than one verification page.
    let many: Vec<AuditDraft> = (7..=warden_postgres::VERIFY_PAGE as u64 + 100)
        .map(numbered)
        .collect();
    store.append_audit(many).await.unwrap();
    let report = store.verify_audit(Some(anchor)).await.unwrap();
    assert_eq!(report.verified, store.audit_head().await.unwrap());
}

/// The log refuses updates and deletes; someone who can bypass that (the
/// database owner, disabling the trigger) is caught by verification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_refused_or_detected() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store
        .append_audit((1..=5).map(numbered).collect())
        .await
        .unwrap();
    let sql = scratch.client().await;
    let err = sql
        .execute("UPDATE audit_log SET reason = 'x' WHERE seq = 2", &[])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("append-only") || format!("{err:?}").contains("append-only"),
        "{err:?}"
    );
    assert!(
        sql.execute("DELETE FROM audit_log WHERE seq = 5", &[])
            .await
            .is_err()
    );
    assert!(sql.batch_execute("TRUNCATE audit_log").await.is_err());
    assert_chain(&store).await;

    sql.batch_execute("ALTER TABLE audit_log DISABLE TRIGGER USER")
        .await
        .unwrap();
    // An edited field.
    sql.batch_execute("UPDATE audit_log SET reason = 'owner_write' WHERE seq = 3")
        .await
        .unwrap();
    let err = store.verify_audit(None).await.unwrap_err();
    assert!(
        matches!(err, VerifyError::Broken(ChainBreak::Altered { seq: 3 })),
        "{err:?}"
    );
    assert_eq!(err.seq(), Some(3));
    sql.batch_execute("UPDATE audit_log SET reason = 'visible_from:report_manager' WHERE seq = 3")
        .await
        .unwrap();
    store.verify_audit(None).await.unwrap();
    // A field edited to a value Warden never writes.
    sql.batch_execute("UPDATE audit_log SET verdict = 'maybe' WHERE seq = 4")
        .await
        .unwrap();
    assert!(matches!(
        store.verify_audit(None).await,
        Err(VerifyError::Undecodable { seq: 4, .. })
    ));
    sql.batch_execute("UPDATE audit_log SET verdict = 'allow' WHERE seq = 4")
        .await
        .unwrap();
    // A deleted middle entry.
    sql.batch_execute("CREATE TABLE saved AS SELECT * FROM audit_log WHERE seq IN (2, 5)")
        .await
        .unwrap();
    sql.batch_execute("DELETE FROM audit_log WHERE seq = 2")
        .await
        .unwrap();
    assert_eq!(store.verify_audit(None).await.unwrap_err().seq(), Some(3));
    sql.batch_execute("INSERT INTO audit_log SELECT * FROM saved WHERE seq = 2")
        .await
        .unwrap();
    store.verify_audit(None).await.unwrap();
    // A truncated tail, with the recorded head left alone.
    sql.batch_execute("DELETE FROM audit_log WHERE seq = 5")
        .await
        .unwrap();
    assert_eq!(
        store.verify_audit(None).await,
        Err(VerifyError::Broken(ChainBreak::Truncated {
            last_seq: 4,
            head_seq: 5
        }))
    );
    // ... and with the head rewound too: only an anchor catches it.
    let anchor = HeadAnchor {
        seq: 5,
        hash: audit_hash(&sql, "saved", 5).await,
    };
    let h4 = audit_hash(&sql, "audit_log", 4).await;
    sql.execute(
        "UPDATE audit_head SET seq = 4, hash = $1",
        &[&h4.0.as_slice()],
    )
    .await
    .unwrap();
    store.verify_audit(None).await.unwrap();
    assert_eq!(
        store.verify_audit(Some(anchor)).await,
        Err(VerifyError::AnchorNotReached {
            last_seq: 4,
            anchor_seq: 5
        })
    );
    // Entries past a rewound head.
    sql.batch_execute("INSERT INTO audit_log SELECT * FROM saved WHERE seq = 5")
        .await
        .unwrap();
    assert_eq!(
        store.verify_audit(None).await,
        Err(VerifyError::PastHead {
            seq: 5,
            head_seq: 4
        })
    );
    // A missing head row.
    sql.batch_execute("DELETE FROM audit_head").await.unwrap();
    assert!(matches!(
        store.verify_audit(None).await,
        Err(VerifyError::HeadMissing(_))
    ));
}

async fn audit_hash(sql: &tokio_postgres::Client, table: &str, seq: i64) -> Digest {
    let row = sql
        .query_one(&format!("SELECT hash FROM {table} WHERE seq = $1"), &[&seq])
        .await
        .unwrap();
    let bytes: Vec<u8> = row.get(0);
    Digest(bytes.try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_writes_json_lines_after_a_sequence_number() {
    let scratch = scratch_or_skip!();
    let store = scratch.store().await;
    store
        .append_audit((1..=9).map(numbered).collect())
        .await
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(store.export_audit(0, &mut out).await.unwrap(), 9);
    let text = String::from_utf8(out).unwrap();
    let parsed: Vec<AuditEntry> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(parsed, audit_all(&store).await);
    let mut tail = Vec::new();
    assert_eq!(store.export_audit(6, &mut tail).await.unwrap(), 3);
    let seqs: Vec<u64> = String::from_utf8(tail)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<AuditEntry>(l).unwrap().seq)
        .collect();
    assert_eq!(seqs, [7, 8, 9]);
    let mut none = Vec::new();
    assert_eq!(store.export_audit(9, &mut none).await.unwrap(), 0);
    assert!(none.is_empty());
}

/// The free functions the CLI calls read an existing database through its
/// URL (schema from `search_path`) and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_readers_verify_export_and_read_the_head() {
    let scratch = scratch_or_skip!();
    let url = format!("{}?options=-csearch_path%3D{}", scratch.url, scratch.schema);
    // Nothing there yet: refused, and nothing is created.
    let err = warden_postgres::verify_audit(&url, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Store(warden_store::StoreError::Backend { .. })
        ),
        "{err:?}"
    );
    raw_client(&scratch.url)
        .await
        .batch_execute(&format!("CREATE SCHEMA \"{}\"", scratch.schema))
        .await
        .unwrap();
    let err = warden_postgres::verify_audit(&url, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Store(warden_store::StoreError::Corrupt { .. })
        ),
        "{err:?}"
    );
    let sql = scratch.client().await;
    let tables: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1",
            &[&scratch.schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);

    let store = scratch.store().await;
    store
        .append_audit((1..=5).map(numbered).collect())
        .await
        .unwrap();
    let head = warden_postgres::read_audit_head(&url).await.unwrap();
    assert_eq!(head, HeadAnchor::of(&store.audit_head().await.unwrap()));
    let report = warden_postgres::verify_audit(&url, Some(head))
        .await
        .unwrap();
    assert_eq!(report.verified.seq, 5);
    let mut out = Vec::new();
    assert_eq!(
        warden_postgres::export_audit(&url, 2, &mut out)
            .await
            .unwrap(),
        3
    );
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 3);
    // A newer schema is refused.
    sql.execute(
        "UPDATE warden_meta SET schema_version = $1",
        &[&(warden_postgres::SCHEMA_VERSION + 1)],
    )
    .await
    .unwrap();
    assert!(matches!(
        warden_postgres::verify_audit(&url, None).await,
        Err(VerifyError::Store(
            warden_store::StoreError::SchemaTooNew { .. }
        ))
    ));
}
