//! Server integration tests: one binary, modules by topic. Every test
//! starts the real server on `127.0.0.1:0` and talks HTTP to it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod bad_input;
mod conformance;
mod console;
mod context;
mod edges;
mod envelope_keys;
mod identity;
mod lifecycle;
mod lockdown;
mod quotas;
mod round_trips;
mod routes;
mod scenario;
mod sessions;
mod support;
mod validate;
