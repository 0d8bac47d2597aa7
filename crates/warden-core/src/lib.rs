//! # warden-core
//!
//! The pure rules of Warden, a governance engine for hierarchical AI agents.
//!
//! This crate decides; it never acts. It does no I/O, spawns no threads, reads
//! no clock and no environment: time and randomness are passed in, policy is
//! parsed from `&str`, and storage lives behind the `warden-store` crate. That
//! keeps every rule testable as a plain function and every decision
//! reproducible from its inputs.
//!
//! Map of the modules:
//!
//! - [`ids`]: identifiers that can only be built valid.
//! - [`decision`]: verdicts, reason codes, obligations and decisions.
//! - [`audit`]: the canonical encoding and hash chain of the decision log.
//! - [`catalogue`]: the action catalogue and argument rules.
//! - [`json`]: the strict JSON reader (duplicate keys, nesting limit).
//! - [`sop`]: strict SOP parsing.
//! - [`plan`]: plans (SOPs with call-time bindings): parsing, matching a
//!   call to its planned step, admission.
//! - [`lockdown`]: the delegation write-surface predicate and config checks.
//! - [`mcp`]: the `mcp_servers:` section and the schema compatibility check.
//! - [`envelope`]: context envelopes, aggregation, delegation, signatures.
//! - [`provenance`]: value provenance: normalised matching against keyed
//!   fingerprints of recorded sources, and the per-argument gate.

pub mod audit;
pub mod bundle;
pub mod canonical;
pub mod capability;
pub mod catalogue;
pub mod decision;
pub mod envelope;
pub mod gate;
pub mod hierarchy;
pub mod ids;
pub mod json;
pub mod lockdown;
pub mod mcp;
pub mod memory;
pub mod plan;
pub mod preflight;
pub mod provenance;
pub mod sop;
pub mod time;

/// The hash map used on hot paths: foldhash (fast, seeded per map).
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
