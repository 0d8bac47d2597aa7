//! The storage conformance suite: every backend runs it with one line.
//!
//! Each check is a `pub async fn NAME<S: Store>(store: S)` that takes a
//! fresh, empty store and panics on the first violation. A backend runs the
//! whole suite as one `#[tokio::test]` per check with
//! [`conformance_tests!`](crate::conformance_tests):
//!
//! ```no_run
//! mod conformance {
//!     use warden_store::MemoryStore;
//!
//!     warden_store::conformance_tests!(|| async { MemoryStore::new() });
//! }
//! ```
//!
//! or, for a backend that is only available sometimes (a database URL in the
//! environment), with the `optional:` form whose factory returns an
//! `Option<S>` (`None` skips the check):
//!
//! ```text
//! warden_store::conformance_tests!(optional: || async { MyStore::from_env().await });
//! ```
//!
//! [`run_all`] runs every check in one test instead. The suite is compiled
//! only with this crate's `conformance` feature: a backend enables it from
//! its `[dev-dependencies]`
//! (`warden-store = { workspace = true, features = ["conformance"] }`), so
//! production builds never compile it. The calling crate needs `tokio`
//! (with `macros` and `rt-multi-thread`) among its dev-dependencies.
//!
//! The checks live in one module per area: [`agents`], [`tokens`],
//! [`memory`], [`audit`], [`runs`], [`quotas`], [`envelopes`],
//! [`escalations`], [`sessions`] and [`rates`] (request-rate buckets and
//! envelope signing keys).
//!
//! What the suite pins down, for every backend alike:
//!
//! - every [`Store`] method, including the round trip of every field (record
//!   classes, JSON values, audit details, run outcomes);
//! - compare-and-set: create-only (`Some(0)`), stale revision, unconditional
//!   writes, class rejection, and a race of [`RACE_WRITERS`] writers with the
//!   same expected revision (exactly one wins, every attempt is audited);
//! - the audit chain: append order, the head, paging, the exact hashes the
//!   core computes, verification with [`verify_store`] and an anchor;
//! - exactly-once runs and steps;
//! - storage quotas and runs in flight, exact under concurrency;
//! - envelope versions (compare-and-set on the latest) and the escalation
//!   lifecycle (one open per target, resolved once, consumed once);
//! - tool-call sessions: creation with the first envelope version and the
//!   import check (replay, downgrade) in one transaction, compare-and-set
//!   updates with calls upserted by id, the head read (without the index
//!   bytes when the caller holds that revision), a create refused when its
//!   envelope is not the session's, a call's `seq` unique in its session,
//!   listing in creation order, the index appended to (a result's delta)
//!   and replaced, and races of creators, updaters and
//!   importers (exactly one wins each);
//! - failed operations (errors, not outcomes) change nothing and append
//!   nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "the conformance suite is test code: a failed check panics"
)]

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use serde_json::{Value, json};
use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, ChainVerifier, Digest};
use warden_core::decision::Verdict;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::memory::{Combinator, INVALID_RECORD, MemoryRecord, Put, RecordClass, Visibility};
use warden_core::time::Timestamp;

use crate::verify::{HeadAnchor, VerifyError, verify_store};
use crate::{
    AuditFn, CreateRun, Delete, DeleteOutcome, Entity, LeaseStep, PutAuditFn, PutOutcome,
    QuotaKind, RecordStep, RunRecord, RunStep, RunsInFlight, StepLease, StepOutcome, StepStatus,
    StorageQuota, Store, StoreError, StoredAgent, TokenRecord, TokenSubject, Usage,
};

/// How many writers race for the same revision in [`put_race_one_winner`].
pub const RACE_WRITERS: usize = 16;

/// Runs one check per `#[tokio::test]`; see the [module docs](crate::conformance).
///
/// `conformance_tests!(factory)` takes an expression evaluating to a closure
/// that returns a future of a fresh store; `conformance_tests!(optional:
/// factory)` takes one whose future yields `Option<store>`, `None` skipping.
#[macro_export]
macro_rules! conformance_tests {
    (optional: $factory:expr) => {
        $crate::__conformance_tests!(@optional ($factory));
    };
    ($factory:expr) => {
        $crate::__conformance_tests!(@required ($factory));
    };
}

/// The list of checks behind [`conformance_tests!`]. Keep it in step with
/// [`run_all`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (@$mode:ident ($factory:expr)) => {
        $crate::__conformance_tests!(@$mode ($factory);
            agents_insert_and_load,
            agents_duplicate_is_rejected,
            agents_status_update,
            agents_status_unknown_changes_nothing,
            agents_capabilities_update,
            tokens_insert_find_revoke,
            tokens_duplicate_is_rejected,
            put_create_and_get_every_class,
            put_create_only,
            put_stale_revision_conflicts,
            put_unconditional,
            put_class_rejection,
            put_race_one_winner,
            put_race_create_only,
            put_audit_fn_may_append_nothing,
            get_records_by_owner,
            delete_semantics,
            owner_usage_counts,
            audit_append_and_head,
            audit_paging,
            audit_round_trip_and_hashes,
            audit_concurrent_appends,
            audit_verify_and_anchor,
            audit_round_trip_exotic_text,
            runs_create_existing_get,
            record_step_exactly_once,
            record_step_unknown,
            step_leases,
            mixed_concurrent_writers,
            quota_max_records,
            quota_max_bytes,
            quota_concurrent_creates,
            runs_in_flight_limit,
            runs_in_flight_concurrent,
            envelope_versions,
            escalation_lifecycle,
            escalation_bound_requests,
            sessions_create_and_get,
            sessions_existing_and_duplicate_envelope,
            sessions_update_compare_and_set,
            sessions_call_upsert,
            sessions_head,
            sessions_audit_follows_outcome,
            sessions_import_rules,
            sessions_race_create,
            sessions_race_update,
            sessions_race_import,
            sessions_race_import_versions,
            sessions_list,
            sessions_create_refuses_inconsistent,
            sessions_call_seq_unique,
            sessions_list_in_creation_order,
            sessions_index_appends,
            rates_follow_shared_rule,
            rates_all_or_none,
            rates_concurrent_takers_exact,
            rates_refuse_bad_charges,
            signing_keys_create_only,
            signing_keys_race,
        );
    };
    (@required ($factory:expr); $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let factory = $factory;
                let store = factory().await;
                $crate::conformance::$check(store).await;
            }
        )*
    };
    (@optional ($factory:expr); $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let factory = $factory;
                let Some(store) = factory().await else {
                    eprintln!("conformance check `{}` skipped: no store", stringify!($check));
                    return;
                };
                $crate::conformance::$check(store).await;
            }
        )*
    };
}

/// Run every check, each on a fresh store from `factory`. Keep it in step
/// with [`conformance_tests!`](crate::conformance_tests).
pub async fn run_all<S, F, Fut>(factory: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    agents_insert_and_load(factory().await).await;
    agents_duplicate_is_rejected(factory().await).await;
    agents_status_update(factory().await).await;
    agents_status_unknown_changes_nothing(factory().await).await;
    agents_capabilities_update(factory().await).await;
    tokens_insert_find_revoke(factory().await).await;
    tokens_duplicate_is_rejected(factory().await).await;
    put_create_and_get_every_class(factory().await).await;
    put_create_only(factory().await).await;
    put_stale_revision_conflicts(factory().await).await;
    put_unconditional(factory().await).await;
    put_class_rejection(factory().await).await;
    put_race_one_winner(factory().await).await;
    put_race_create_only(factory().await).await;
    put_audit_fn_may_append_nothing(factory().await).await;
    get_records_by_owner(factory().await).await;
    delete_semantics(factory().await).await;
    owner_usage_counts(factory().await).await;
    audit_append_and_head(factory().await).await;
    audit_paging(factory().await).await;
    audit_round_trip_and_hashes(factory().await).await;
    audit_concurrent_appends(factory().await).await;
    audit_verify_and_anchor(factory().await).await;
    audit_round_trip_exotic_text(factory().await).await;
    runs_create_existing_get(factory().await).await;
    record_step_exactly_once(factory().await).await;
    record_step_unknown(factory().await).await;
    step_leases(factory().await).await;
    mixed_concurrent_writers(factory().await).await;
    quota_max_records(factory().await).await;
    quota_max_bytes(factory().await).await;
    quota_concurrent_creates(factory().await).await;
    runs_in_flight_limit(factory().await).await;
    runs_in_flight_concurrent(factory().await).await;
    envelope_versions(factory().await).await;
    escalation_lifecycle(factory().await).await;
    escalation_bound_requests(factory().await).await;
    sessions_create_and_get(factory().await).await;
    sessions_existing_and_duplicate_envelope(factory().await).await;
    sessions_update_compare_and_set(factory().await).await;
    sessions_call_upsert(factory().await).await;
    sessions_head(factory().await).await;
    sessions_audit_follows_outcome(factory().await).await;
    sessions_import_rules(factory().await).await;
    sessions_race_create(factory().await).await;
    sessions_race_update(factory().await).await;
    sessions_race_import(factory().await).await;
    sessions_race_import_versions(factory().await).await;
    sessions_list(factory().await).await;
    sessions_create_refuses_inconsistent(factory().await).await;
    sessions_call_seq_unique(factory().await).await;
    sessions_list_in_creation_order(factory().await).await;
    sessions_index_appends(factory().await).await;
    rates_follow_shared_rule(factory().await).await;
    rates_all_or_none(factory().await).await;
    rates_concurrent_takers_exact(factory().await).await;
    rates_refuse_bad_charges(factory().await).await;
    signing_keys_create_only(factory().await).await;
    signing_keys_race(factory().await).await;
}

pub mod agents;
pub mod audit;
pub mod envelopes;
pub mod escalations;
pub mod memory;
pub mod quotas;
pub mod rates;
pub mod runs;
pub mod sessions;
pub mod tokens;

pub use agents::*;
pub use audit::*;
pub use memory::*;
pub use quotas::*;
pub use rates::*;
pub use runs::*;
pub use sessions::*;
pub use tokens::*;

pub use envelopes::Failure;

/// Envelope versions (see [`envelopes::check_envelope_versions`]) as a
/// check of the suite.
pub async fn envelope_versions<S: Store>(store: S) {
    if let Err(f) = envelopes::check_envelope_versions(&store).await {
        panic!("envelope versions: {f}");
    }
    assert_chain(&store).await;
}

/// The escalation lifecycle (see
/// [`escalations::check_escalation_lifecycle`]) as a check of the suite.
pub async fn escalation_lifecycle<S: Store>(store: S) {
    if let Err(f) = escalations::check_escalation_lifecycle(&store).await {
        panic!("escalation lifecycle: {f}");
    }
    assert_chain(&store).await;
}

/// Escalations bound to their requests (see
/// [`escalations::check_bound_requests`]) as a check of the suite.
pub async fn escalation_bound_requests<S: Store>(store: S) {
    if let Err(f) = escalations::check_bound_requests(&store).await {
        panic!("escalation bound requests: {f}");
    }
    assert_chain(&store).await;
}

/// The envelope and escalation checks on a store that is not fresh (a
/// migrated database, say): they use their own ids, so they can share it.
pub async fn run_context_checks<S: Store>(store: &S) -> Result<(), Failure> {
    envelopes::check_envelope_versions(store).await?;
    escalations::check_escalation_lifecycle(store).await?;
    escalations::check_bound_requests(store).await
}

// ----- helpers shared by the checks -----

fn id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}

fn action(s: &str) -> ActionName {
    ActionName::parse(s).unwrap()
}

fn run_id(s: &str) -> RunId {
    RunId::parse(s).unwrap()
}

fn step_id(s: &str) -> StepId {
    StepId::parse(s).unwrap()
}

/// A draft with the given fields, at time 1000 under policy `conf-1`.
pub fn draft(
    subject: &str,
    operation: &str,
    resource: &str,
    verdict: Verdict,
    reason: &str,
) -> AuditDraft {
    AuditDraft {
        time: Timestamp(1_000),
        subject: subject.to_string(),
        operation: operation.to_string(),
        resource: resource.to_string(),
        verdict,
        reason: reason.to_string(),
        policy_version: "conf-1".to_string(),
        details: Value::Null,
    }
}

fn agent(name: &str, parent: Option<&str>) -> StoredAgent {
    StoredAgent {
        id: id(name),
        parent: parent.map(id),
        capabilities: ["memory.read", "memory.write"]
            .into_iter()
            .map(action)
            .collect(),
        tools: vec!["search".to_string(), "summarize".to_string()],
        config: Some(json!({"model": "small", "temperature": 0.5, "nested": {"k": [1, 2]}})),
        status: AgentStatus::Active,
        created_at: Timestamp(10),
        // Children carry an inherited envelope id: it must round-trip.
        envelope_id: parent
            .map(|p| warden_core::envelope::EnvelopeId::parse(&format!("env-of-{p}")).unwrap()),
    }
}

fn register(name: &str) -> Vec<AuditDraft> {
    vec![draft(
        "@operator",
        "agent.register",
        name,
        Verdict::Allow,
        "registered",
    )]
}

fn put(owner: &str, namespace: &str, k: &str, value: Value, expected: Option<u64>) -> Put {
    Put {
        owner: id(owner),
        namespace: ns(namespace),
        key: key(k),
        value,
        expected_revision: expected,
        visibility: None,
        class: None,
    }
}

/// An [`AuditFn`] that records a put's outcome the way the engine does:
/// allow for a write, deny for a conflict or a rejection; `tag` goes into
/// the details so a test can tell attempts apart.
pub fn put_audit(subject: &str, resource: &str, tag: u64) -> PutAuditFn {
    let subject = subject.to_string();
    let resource = resource.to_string();
    Box::new(move |outcome: &PutOutcome| {
        let (verdict, reason, details) = match outcome {
            PutOutcome::Written { record, created } => (
                Verdict::Allow,
                "owner_write".to_string(),
                json!({"tag": tag, "revision": record.revision, "created": created}),
            ),
            PutOutcome::Conflict { current } => (
                Verdict::Deny,
                "revision_conflict".to_string(),
                json!({"tag": tag, "current": current}),
            ),
            PutOutcome::Rejected { reason } => (Verdict::Deny, reason.clone(), json!({"tag": tag})),
            PutOutcome::OverQuota { quota, limit, used } => (
                Verdict::Deny,
                format!("quota_max_{}", quota.as_str()),
                json!({"tag": tag, "limit": limit, "used": used}),
            ),
        };
        vec![AuditDraft {
            details,
            ..draft(&subject, "memory.write", &resource, verdict, &reason)
        }]
    })
}

fn delete_audit(subject: &str, resource: &str) -> AuditFn<DeleteOutcome> {
    let subject = subject.to_string();
    let resource = resource.to_string();
    Box::new(move |outcome: &DeleteOutcome| {
        let (verdict, reason) = match outcome {
            DeleteOutcome::Deleted { .. } => (Verdict::Allow, "owner_delete"),
            DeleteOutcome::NotFound => (Verdict::Deny, "record_not_found"),
            DeleteOutcome::Conflict { .. } => (Verdict::Deny, "revision_conflict"),
        };
        vec![draft(&subject, "memory.delete", &resource, verdict, reason)]
    })
}

/// Every audit entry, paged through `audit_page`.
pub async fn audit_all<S: Store>(store: &S) -> Vec<AuditEntry> {
    let mut out = Vec::new();
    loop {
        let after = out.last().map_or(0, |e: &AuditEntry| e.seq);
        let page = store.audit_page(after, 7).await.unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// Verify the chain with [`ChainVerifier`] and [`verify_store`]; both must
/// agree with `audit_head`. Returns the head.
pub async fn assert_chain<S: Store>(store: &S) -> ChainHead {
    let entries = audit_all(store).await;
    let mut verifier = ChainVerifier::new();
    for e in &entries {
        verifier.push(e).unwrap();
    }
    let verified = verifier.finish();
    let head = store.audit_head().await.unwrap();
    assert_eq!(verified, head, "verified chain differs from audit_head");
    assert_eq!(head.count, entries.len() as u64);
    let report = verify_store(store, None).await.unwrap();
    assert_eq!(report.verified, head);
    head
}

async fn head_count<S: Store>(store: &S) -> u64 {
    store.audit_head().await.unwrap().count
}

async fn get_one<S: Store>(
    store: &S,
    owner: &str,
    namespace: &str,
    k: &str,
) -> Option<MemoryRecord> {
    let mut got = store
        .get_records(ns(namespace), key(k), vec![id(owner)])
        .await
        .unwrap();
    assert!(got.len() <= 1);
    got.pop()
}

fn sample_run(name: &str, sop_hash: Digest) -> RunRecord {
    RunRecord {
        envelope_id: Some(
            warden_core::envelope::EnvelopeId::parse(&format!("env-{name}")).unwrap(),
        ),
        run_id: run_id(name),
        agent: id("researcher"),
        sop_hash,
        sop: json!({"sop_id": "report", "version": 1, "steps": [{"step_id": "s1"}, {"step_id": "s2"}, {"step_id": "s3"}]}),
        steps: ["s1", "s2", "s3"]
            .iter()
            .enumerate()
            .map(|(i, s)| RunStep {
                step_id: step_id(s),
                action: action(if i == 0 {
                    "document.summarize"
                } else {
                    "artifact.save"
                }),
                operation_id: format!("{name}:{s}"),
            })
            .collect(),
        policy_version: "conf-1".to_string(),
        created_at: Timestamp(77),
    }
}

fn completed(result: Value) -> StepOutcome {
    StepOutcome {
        status: StepStatus::Completed,
        result: Some(result),
        error: None,
        labels: vec![
            Label::parse("pii").unwrap(),
            Label::parse("financial").unwrap(),
        ],
        recorded_at: Timestamp(88),
    }
}
