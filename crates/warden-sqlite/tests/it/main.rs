//! Integration tests of the SQLite backend: the conformance suite, bad
//! input, crash safety, races, tampering and reopening.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod bad_input;
mod context;
mod crash;
mod durability;
mod lock;
mod sessions;
mod support;
mod tamper;

mod conformance {
    use warden_sqlite::SqliteStore;

    warden_store::conformance_tests!(|| async { SqliteStore::open_temp().await.unwrap() });
}
