//! Integration tests of warden-postgres against a real PostgreSQL server.
//!
//! Every test that needs the database reads `WARDEN_TEST_DATABASE_URL`
//! (CI sets it, e.g. `postgres://postgres@127.0.0.1:5432/test`); without it
//! the test prints `skipped: WARDEN_TEST_DATABASE_URL is not set` and
//! passes. Each test works in its own fresh schema (`wtest_...`), dropped
//! when the test ends, so runs never collide.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[macro_use]
mod support;

mod agents;
mod audit;
mod batch;
mod changes;
mod concurrency;
mod context;
mod crash;
mod migrations;
mod pool;
mod quotas;
mod rates;
mod record_reads;
mod runs;
mod sealed;
mod sessions;

/// The shared storage suite (`warden_store::conformance`), one test per
/// check, each on a fresh schema; skipped without the database URL.
mod conformance {
    warden_store::conformance_tests!(optional: || async { crate::support::ScratchStore::fresh().await });
}
