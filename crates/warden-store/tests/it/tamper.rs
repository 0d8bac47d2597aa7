//! The backend-agnostic verifier against an in-memory store whose entries
//! are edited in place.

use serde_json::json;
use warden_core::audit::{ChainBreak, Digest};
use warden_core::decision::Verdict;
use warden_store::conformance::draft;
use warden_store::{HeadAnchor, MemoryStore, Store, VerifyError, verify_store};

async fn store_with(n: u64) -> MemoryStore {
    let store = MemoryStore::new();
    let drafts = (1..=n)
        .map(|i| warden_core::audit::AuditDraft {
            details: json!({ "i": i }),
            ..draft("a", "memory.read", "ns.k", Verdict::Allow, "ok")
        })
        .collect();
    store.append_audit(drafts).await.unwrap();
    store
}

#[tokio::test]
async fn edit_is_named() {
    let store = store_with(5).await;
    store.with_audit_mut(|a| a[2].draft.reason = "forged".into());
    let err = verify_store(&store, None).await.unwrap_err();
    assert!(
        matches!(err, VerifyError::Broken(ChainBreak::Altered { seq: 3 })),
        "{err:?}"
    );
    assert_eq!(err.seq(), Some(3));
}

#[tokio::test]
async fn deletion_is_named() {
    let store = store_with(5).await;
    store.with_audit_mut(|a| a.remove(1));
    let err = verify_store(&store, None).await.unwrap_err();
    assert_eq!(err.seq(), Some(3));
}

#[tokio::test]
async fn truncation_needs_an_anchor_in_memory() {
    // The in-memory store computes its head from its entries, so only an
    // external anchor shows a cut tail.
    let store = store_with(5).await;
    let anchor = HeadAnchor::of(&store.audit_head().await.unwrap());
    store.with_audit_mut(|a| a.truncate(3));
    assert!(verify_store(&store, None).await.is_ok());
    let err = verify_store(&store, Some(anchor)).await.unwrap_err();
    assert_eq!(
        err,
        VerifyError::AnchorNotReached {
            last_seq: 3,
            anchor_seq: 5
        }
    );
    assert_eq!(err.seq(), Some(4));
    let wrong = HeadAnchor {
        seq: 0,
        hash: Digest::of(b"x"),
    };
    assert_eq!(
        verify_store(&store, Some(wrong)).await,
        Err(VerifyError::AnchorMismatch { seq: 0 })
    );
}
