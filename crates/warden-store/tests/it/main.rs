//! Integration tests of warden-store: the in-memory store passes the
//! conformance suite, and the verifier detects tampering with it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod tamper;

mod conformance {
    use warden_store::MemoryStore;

    warden_store::conformance_tests!(|| async { MemoryStore::new() });

    #[tokio::test]
    async fn run_all_passes() {
        warden_store::conformance::run_all(|| async { MemoryStore::new() }).await;
    }
}
