//! Engine integration tests: one binary, modules by topic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod acceptance;
mod access;
mod adversarial;
mod envelopes;
mod grants;
mod leases;
mod lockdown;
mod model;
mod nodes;
mod properties;
mod quotas;
mod request_rates;
mod runs_as_plans;
mod session_index;
mod session_memory;
mod session_plans;
mod session_properties;
mod session_restrictions;
mod session_retries;
mod sessions;
mod shared_servers;
mod support;
