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
//! [`run_all`] runs every check in one test instead. The calling crate needs
//! `tokio` (with `macros` and `rt-multi-thread`) among its dev-dependencies.
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
    AuditFn, CreateRun, Delete, DeleteOutcome, Entity, PutOutcome, QuotaKind, RecordStep,
    RunRecord, RunStep, RunsInFlight, StepOutcome, StepStatus, StorageQuota, Store, StoreError,
    StoredAgent, TokenRecord, TokenSubject, Usage,
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
            get_records_by_owner,
            delete_semantics,
            owner_usage_counts,
            audit_append_and_head,
            audit_paging,
            audit_round_trip_and_hashes,
            audit_concurrent_appends,
            audit_verify_and_anchor,
            runs_create_existing_get,
            record_step_exactly_once,
            record_step_unknown,
            mixed_concurrent_writers,
            quota_max_records,
            quota_max_bytes,
            quota_concurrent_creates,
            runs_in_flight_limit,
            runs_in_flight_concurrent,
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
    get_records_by_owner(factory().await).await;
    delete_semantics(factory().await).await;
    owner_usage_counts(factory().await).await;
    audit_append_and_head(factory().await).await;
    audit_paging(factory().await).await;
    audit_round_trip_and_hashes(factory().await).await;
    audit_concurrent_appends(factory().await).await;
    audit_verify_and_anchor(factory().await).await;
    runs_create_existing_get(factory().await).await;
    record_step_exactly_once(factory().await).await;
    record_step_unknown(factory().await).await;
    mixed_concurrent_writers(factory().await).await;
    quota_max_records(factory().await).await;
    quota_max_bytes(factory().await).await;
    quota_concurrent_creates(factory().await).await;
    runs_in_flight_limit(factory().await).await;
    runs_in_flight_concurrent(factory().await).await;
}

// ----- helpers -----

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
pub fn put_audit(subject: &str, resource: &str, tag: u64) -> AuditFn<PutOutcome> {
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

// ----- agents -----

/// Agents round-trip every field and load in registration order; each
/// insert appends its audit entries.
pub async fn agents_insert_and_load<S: Store>(store: S) {
    assert!(store.load_agents().await.unwrap().is_empty());
    let mut expected = Vec::new();
    for (name, parent) in [
        ("root", None),
        ("mid", Some("root")),
        ("leaf", Some("mid")),
        ("alpha", Some("root")),
    ] {
        let mut a = agent(name, parent);
        if name == "leaf" {
            a.config = None;
            a.tools = Vec::new();
            a.capabilities = BTreeSet::new();
        }
        store.insert_agent(a.clone(), register(name)).await.unwrap();
        expected.push(a);
    }
    assert_eq!(store.load_agents().await.unwrap(), expected);
    let entries = audit_all(&store).await;
    let resources: Vec<&str> = entries.iter().map(|e| e.draft.resource.as_str()).collect();
    assert_eq!(resources, ["root", "mid", "leaf", "alpha"]);
    assert_chain(&store).await;
}

/// A duplicate agent id is `Duplicate` and changes nothing.
pub async fn agents_duplicate_is_rejected<S: Store>(store: S) {
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    let mut other = agent("root", None);
    other.tools = vec!["other".into()];
    let err = store
        .insert_agent(other, register("root"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Agent, ref id } if id == "root"),
        "{err:?}"
    );
    assert_eq!(
        store.load_agents().await.unwrap(),
        vec![agent("root", None)]
    );
    assert_eq!(
        head_count(&store).await,
        1,
        "a failed insert appended audit entries"
    );
}

/// Status changes apply to every listed agent and append their entries.
pub async fn agents_status_update<S: Store>(store: S) {
    for (n, p) in [("root", None), ("mid", Some("root")), ("leaf", Some("mid"))] {
        store.insert_agent(agent(n, p), register(n)).await.unwrap();
    }
    store
        .set_agent_status(
            vec![id("mid"), id("leaf")],
            AgentStatus::Revoked,
            vec![draft(
                "@operator",
                "agent.revoke",
                "mid",
                Verdict::Allow,
                "revoked",
            )],
        )
        .await
        .unwrap();
    let statuses: Vec<(String, AgentStatus)> = store
        .load_agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.id.to_string(), a.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("root".to_string(), AgentStatus::Active),
            ("mid".to_string(), AgentStatus::Revoked),
            ("leaf".to_string(), AgentStatus::Revoked)
        ]
    );
    assert_eq!(head_count(&store).await, 4);
    store
        .set_agent_status(vec![id("leaf")], AgentStatus::Active, vec![])
        .await
        .unwrap();
    let leaf = store.load_agents().await.unwrap().pop().unwrap();
    assert_eq!(leaf.status, AgentStatus::Active);
    assert_eq!(head_count(&store).await, 4);
    assert_chain(&store).await;
}

/// A status change naming an unknown agent is `NotFound` and changes
/// nothing, not even the known agents listed with it.
pub async fn agents_status_unknown_changes_nothing<S: Store>(store: S) {
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    let err = store
        .set_agent_status(
            vec![id("root"), id("ghost")],
            AgentStatus::Revoked,
            vec![draft(
                "@operator",
                "agent.revoke",
                "root",
                Verdict::Allow,
                "revoked",
            )],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Agent, ref id } if id == "ghost"),
        "{err:?}"
    );
    assert_eq!(
        store.load_agents().await.unwrap()[0].status,
        AgentStatus::Active
    );
    assert_eq!(head_count(&store).await, 1);
}

/// Capabilities are replaced; an unknown agent is `NotFound` and appends
/// nothing.
pub async fn agents_capabilities_update<S: Store>(store: S) {
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    store
        .insert_agent(agent("kid", Some("root")), register("kid"))
        .await
        .unwrap();
    let caps: BTreeSet<ActionName> = ["artifact.save", "memory.read"]
        .into_iter()
        .map(action)
        .collect();
    store
        .set_agent_capabilities(
            id("kid"),
            caps.clone(),
            vec![draft(
                "@operator",
                "agent.capabilities",
                "kid",
                Verdict::Allow,
                "updated",
            )],
        )
        .await
        .unwrap();
    let agents = store.load_agents().await.unwrap();
    assert_eq!(agents[1].capabilities, caps);
    assert_eq!(agents[0].capabilities, agent("root", None).capabilities);
    assert_eq!(head_count(&store).await, 3);
    let err = store
        .set_agent_capabilities(
            id("ghost"),
            caps,
            vec![draft(
                "@operator",
                "agent.capabilities",
                "ghost",
                Verdict::Allow,
                "updated",
            )],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Agent, ref id } if id == "ghost"),
        "{err:?}"
    );
    assert_eq!(head_count(&store).await, 3);
    assert_chain(&store).await;
}

// ----- tokens -----

fn token(token_id: &str, secret: &str, subject: TokenSubject) -> TokenRecord {
    TokenRecord {
        token_id: token_id.to_string(),
        hash: Digest::of(secret.as_bytes()),
        subject,
        created_at: Timestamp(5),
        revoked: false,
    }
}

/// Tokens are found by hash; revocation is reported once and audited once.
pub async fn tokens_insert_find_revoke<S: Store>(store: S) {
    let op = token("tok-op", "operator-secret", TokenSubject::Operator);
    let ag = token(
        "tok-a",
        "agent-secret",
        TokenSubject::Agent(id("researcher")),
    );
    for t in [&op, &ag] {
        store
            .insert_token(
                t.clone(),
                vec![draft(
                    "@operator",
                    "token.issue",
                    &t.token_id,
                    Verdict::Allow,
                    "issued",
                )],
            )
            .await
            .unwrap();
    }
    assert_eq!(store.find_token(op.hash).await.unwrap(), Some(op.clone()));
    assert_eq!(store.find_token(ag.hash).await.unwrap(), Some(ag.clone()));
    assert_eq!(store.find_token(Digest::of(b"nope")).await.unwrap(), None);
    assert_eq!(head_count(&store).await, 2);

    let revoke = || {
        vec![draft(
            "@operator",
            "token.revoke",
            "tok-a",
            Verdict::Allow,
            "revoked",
        )]
    };
    assert!(store.revoke_token("tok-a".into(), revoke()).await.unwrap());
    assert_eq!(head_count(&store).await, 3);
    let found = store.find_token(ag.hash).await.unwrap().unwrap();
    assert!(found.revoked);
    assert_eq!(found.subject, ag.subject);
    assert!(!store.find_token(op.hash).await.unwrap().unwrap().revoked);
    // Revoking again, or an unknown token, reports false and appends nothing.
    assert!(!store.revoke_token("tok-a".into(), revoke()).await.unwrap());
    assert!(
        !store
            .revoke_token("tok-ghost".into(), revoke())
            .await
            .unwrap()
    );
    assert_eq!(head_count(&store).await, 3);
    assert_chain(&store).await;
}

/// A token whose id or hash exists is `Duplicate` and changes nothing.
pub async fn tokens_duplicate_is_rejected<S: Store>(store: S) {
    let t = token("tok-1", "s1", TokenSubject::Operator);
    store.insert_token(t.clone(), vec![]).await.unwrap();
    let audit = || {
        vec![draft(
            "@operator",
            "token.issue",
            "x",
            Verdict::Allow,
            "issued",
        )]
    };
    let same_hash = token("tok-2", "s1", TokenSubject::Agent(id("a")));
    let err = store.insert_token(same_hash, audit()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Token, ref id } if id == "tok-2"),
        "{err:?}"
    );
    let same_id = token("tok-1", "s2", TokenSubject::Operator);
    let err = store.insert_token(same_id, audit()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Token, ref id } if id == "tok-1"),
        "{err:?}"
    );
    assert_eq!(store.find_token(Digest::of(b"s2")).await.unwrap(), None);
    assert_eq!(store.find_token(t.hash).await.unwrap(), Some(t));
    assert_eq!(head_count(&store).await, 0);
}

// ----- memory -----

/// Every record class and visibility round-trips, with its JSON value.
pub async fn put_create_and_get_every_class<S: Store>(store: S) {
    let value = json!({
        "text": "héllo \"wörld\"\n\u{1F600}",
        "big": u64::MAX,
        "neg": i64::MIN,
        "float": 0.1,
        "list": [1, 2.5, null, true, {"k": []}],
    });
    let classes = [
        (
            "pref",
            Visibility::Descendants,
            RecordClass::Preference,
            value.clone(),
        ),
        (
            "pol",
            Visibility::Children,
            RecordClass::Policy {
                combine: Combinator::All,
            },
            json!(false),
        ),
        (
            "min",
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::Min,
            },
            json!(30),
        ),
        (
            "set",
            Visibility::Descendants,
            RecordClass::Policy {
                combine: Combinator::Intersection,
            },
            json!(["a", "b"]),
        ),
        (
            "sec",
            Visibility::Private,
            RecordClass::Secret {
                grants: vec![id("b"), id("c")],
            },
            json!("s3cr3t"),
        ),
        (
            "task",
            Visibility::Private,
            RecordClass::Task {
                expires_at: Some(Timestamp(5_000)),
            },
            json!(1),
        ),
        (
            "task2",
            Visibility::Private,
            RecordClass::Task { expires_at: None },
            json!(null),
        ),
    ];
    for (i, (k, vis, class, v)) in classes.iter().enumerate() {
        let p = Put {
            visibility: Some(*vis),
            class: Some(class.clone()),
            ..put("owner", "ns", k, v.clone(), None)
        };
        let outcome = store
            .put_record(
                p,
                Timestamp(100 + i as i64),
                crate::StorageQuota::default(),
                put_audit("owner", k, i as u64),
            )
            .await
            .unwrap();
        let PutOutcome::Written { record, created } = outcome else {
            panic!("{k}: {outcome:?}");
        };
        assert!(created);
        let expected = MemoryRecord {
            namespace: ns("ns"),
            key: key(k),
            value: v.clone(),
            owner: id("owner"),
            visibility: *vis,
            class: class.clone(),
            revision: 1,
            created_at: Timestamp(100 + i as i64),
            updated_at: Timestamp(100 + i as i64),
        };
        assert_eq!(record, expected);
        assert_eq!(get_one(&store, "owner", "ns", k).await, Some(expected));
    }
    // Defaults on create: private preference.
    store
        .put_record(
            put("owner", "ns", "plain", json!(1), None),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("owner", "plain", 99),
        )
        .await
        .unwrap();
    let plain = get_one(&store, "owner", "ns", "plain").await.unwrap();
    assert_eq!(
        (plain.visibility, plain.class),
        (Visibility::Private, RecordClass::Preference)
    );
    let entries = audit_all(&store).await;
    assert_eq!(entries.len(), classes.len() + 1);
    assert!(entries.iter().all(|e| e.draft.verdict == Verdict::Allow));
    assert_chain(&store).await;
}

/// `Some(0)` creates only: a second create-only put conflicts, is audited
/// as a conflict, and leaves the record unchanged.
pub async fn put_create_only<S: Store>(store: S) {
    let first = store
        .put_record(
            put("a", "ns", "k", json!("first"), Some(0)),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 1),
        )
        .await
        .unwrap();
    assert!(
        matches!(first, PutOutcome::Written { created: true, ref record } if record.revision == 1)
    );
    let second = store
        .put_record(
            put("a", "ns", "k", json!("second"), Some(0)),
            Timestamp(2),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 2),
        )
        .await
        .unwrap();
    assert_eq!(second, PutOutcome::Conflict { current: Some(1) });
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision, stored.updated_at),
        (json!("first"), 1, Timestamp(1))
    );
    let entries = audit_all(&store).await;
    let verdicts: Vec<(Verdict, &str)> = entries
        .iter()
        .map(|e| (e.draft.verdict, e.draft.reason.as_str()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (Verdict::Allow, "owner_write"),
            (Verdict::Deny, "revision_conflict")
        ]
    );
    assert_eq!(entries[1].draft.details, json!({"tag": 2, "current": 1}));
    assert_chain(&store).await;
}

/// A stale expected revision conflicts and reports the current one; an
/// expected revision on a missing record conflicts with `None`.
pub async fn put_stale_revision_conflicts<S: Store>(store: S) {
    let w = |v, e, t, tag| {
        store.put_record(
            put("a", "ns", "k", v, e),
            Timestamp(t),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", tag),
        )
    };
    assert!(matches!(
        w(json!(1), Some(0), 1, 1).await.unwrap(),
        PutOutcome::Written { .. }
    ));
    match w(json!(2), Some(1), 2, 2).await.unwrap() {
        PutOutcome::Written { record, created } => {
            assert!(!created);
            assert_eq!(
                (record.revision, record.created_at, record.updated_at),
                (2, Timestamp(1), Timestamp(2))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        w(json!(3), Some(1), 3, 3).await.unwrap(),
        PutOutcome::Conflict { current: Some(2) }
    );
    assert_eq!(
        w(json!(4), Some(3), 4, 4).await.unwrap(),
        PutOutcome::Conflict { current: Some(2) }
    );
    let missing = store
        .put_record(
            put("a", "ns", "other", json!(0), Some(7)),
            Timestamp(5),
            crate::StorageQuota::default(),
            put_audit("a", "ns.other", 5),
        )
        .await
        .unwrap();
    assert_eq!(missing, PutOutcome::Conflict { current: None });
    assert_eq!(get_one(&store, "a", "ns", "other").await, None);
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!((stored.value, stored.revision), (json!(2), 2));
    let verdicts: Vec<Verdict> = audit_all(&store)
        .await
        .iter()
        .map(|e| e.draft.verdict)
        .collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Allow,
            Verdict::Allow,
            Verdict::Deny,
            Verdict::Deny,
            Verdict::Deny
        ]
    );
    assert_chain(&store).await;
}

/// `None` writes unconditionally, keeps class, visibility and creation time
/// unless given, and counts revisions up.
pub async fn put_unconditional<S: Store>(store: S) {
    let p = Put {
        visibility: Some(Visibility::Descendants),
        class: Some(RecordClass::Policy {
            combine: Combinator::Max,
        }),
        ..put("a", "ns", "k", json!(1), None)
    };
    store
        .put_record(
            p,
            Timestamp(10),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 1),
        )
        .await
        .unwrap();
    for i in 2..=4 {
        let outcome = store
            .put_record(
                put("a", "ns", "k", json!(i), None),
                Timestamp(10 * i),
                crate::StorageQuota::default(),
                put_audit("a", "ns.k", i as u64),
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, PutOutcome::Written { created: false, ref record } if record.revision == i as u64)
        );
    }
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!(stored.value, json!(4));
    assert_eq!(stored.revision, 4);
    assert_eq!(stored.visibility, Visibility::Descendants);
    assert_eq!(
        stored.class,
        RecordClass::Policy {
            combine: Combinator::Max
        }
    );
    assert_eq!(
        (stored.created_at, stored.updated_at),
        (Timestamp(10), Timestamp(40))
    );
    let p = Put {
        visibility: Some(Visibility::Private),
        class: Some(RecordClass::Preference),
        ..put("a", "ns", "k", json!("x"), Some(4))
    };
    store
        .put_record(
            p,
            Timestamp(50),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 5),
        )
        .await
        .unwrap();
    let stored = get_one(&store, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.visibility, stored.class, stored.revision),
        (Visibility::Private, RecordClass::Preference, 5)
    );
    assert_eq!(head_count(&store).await, 5);
    assert_chain(&store).await;
}

/// A put whose result is invalid for its class is `Rejected` with the
/// core's reason, audited through the `AuditFn`, and changes nothing.
pub async fn put_class_rejection<S: Store>(store: S) {
    let p = Put {
        visibility: Some(Visibility::Descendants),
        class: Some(RecordClass::Policy {
            combine: Combinator::All,
        }),
        ..put("a", "policy", "upload", json!(false), Some(0))
    };
    store
        .put_record(
            p,
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("a", "policy.upload", 1),
        )
        .await
        .unwrap();
    // Keeping the class, the new value must still fit the combinator.
    let outcome = store
        .put_record(
            put("a", "policy", "upload", json!(5), Some(1)),
            Timestamp(2),
            crate::StorageQuota::default(),
            put_audit("a", "policy.upload", 2),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        PutOutcome::Rejected {
            reason: format!("{INVALID_RECORD}:policy_value_does_not_fit_combinator")
        }
    );
    let stored = get_one(&store, "a", "policy", "upload").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision, stored.updated_at),
        (json!(false), 1, Timestamp(1))
    );
    // A secret may not be created visible to others.
    let p = Put {
        visibility: Some(Visibility::Children),
        class: Some(RecordClass::Secret { grants: vec![] }),
        ..put("a", "credentials", "token", json!("x"), None)
    };
    let outcome = store
        .put_record(
            p,
            Timestamp(3),
            crate::StorageQuota::default(),
            put_audit("a", "credentials.token", 3),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        PutOutcome::Rejected {
            reason: format!("{INVALID_RECORD}:class_is_private_only")
        }
    );
    assert_eq!(get_one(&store, "a", "credentials", "token").await, None);
    let entries = audit_all(&store).await;
    let reasons: Vec<(Verdict, &str)> = entries
        .iter()
        .map(|e| (e.draft.verdict, e.draft.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            (Verdict::Allow, "owner_write"),
            (
                Verdict::Deny,
                "invalid_record:policy_value_does_not_fit_combinator"
            ),
            (Verdict::Deny, "invalid_record:class_is_private_only"),
        ]
    );
    assert_chain(&store).await;
}

/// [`RACE_WRITERS`] concurrent writers with the same expected revision:
/// exactly one is written, the others conflict, the stored value is the
/// winner's and every attempt is audited with its own outcome.
pub async fn put_race_one_winner<S: Store>(store: S) {
    let store = Arc::new(store);
    store
        .put_record(
            put("a", "ns", "k", json!("start"), Some(0)),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 1000),
        )
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = store
                .put_record(
                    put("a", "ns", "k", json!({"writer": i}), Some(1)),
                    Timestamp(2),
                    crate::StorageQuota::default(),
                    put_audit("a", "ns.k", i as u64),
                )
                .await
                .unwrap();
            (i, outcome)
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            (i, PutOutcome::Written { record, created }) => {
                assert!(!created);
                assert_eq!(record.revision, 2);
                winners.push(i);
            }
            (_, PutOutcome::Conflict { current }) => {
                assert_eq!(current, Some(2));
                conflicts += 1;
            }
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(conflicts, RACE_WRITERS - 1);
    let winner = winners[0];
    let stored = get_one(&*store, "a", "ns", "k").await.unwrap();
    assert_eq!(
        (stored.value, stored.revision),
        (json!({"writer": winner}), 2)
    );
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len(), RACE_WRITERS + 1);
    let allowed: Vec<&AuditEntry> = entries
        .iter()
        .skip(1)
        .filter(|e| e.draft.verdict == Verdict::Allow)
        .collect();
    assert_eq!(allowed.len(), 1);
    assert_eq!(allowed[0].draft.details["tag"], json!(winner));
    let mut tags: Vec<u64> = entries
        .iter()
        .skip(1)
        .map(|e| e.draft.details["tag"].as_u64().unwrap())
        .collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..RACE_WRITERS as u64).collect::<Vec<_>>());
    assert_chain(&*store).await;
}

/// Records come back for the listed owners only, in their order, and only
/// at the exact namespace and key.
pub async fn get_records_by_owner<S: Store>(store: S) {
    for (owner, namespace, k) in [
        ("a", "ns", "k"),
        ("b", "ns", "k"),
        ("c", "ns", "other"),
        ("c", "other", "k"),
        ("d", "ns", "k"),
    ] {
        store
            .put_record(
                put(owner, namespace, k, json!(owner), None),
                Timestamp(1),
                crate::StorageQuota::default(),
                put_audit(owner, k, 0),
            )
            .await
            .unwrap();
    }
    let owners = |got: Vec<MemoryRecord>| {
        got.into_iter()
            .map(|r| r.owner.to_string())
            .collect::<Vec<_>>()
    };
    let got = store
        .get_records(
            ns("ns"),
            key("k"),
            vec![id("d"), id("c"), id("a"), id("zz")],
        )
        .await
        .unwrap();
    assert_eq!(owners(got), ["d", "a"]);
    let got = store
        .get_records(ns("ns"), key("k"), vec![id("a"), id("b"), id("d")])
        .await
        .unwrap();
    assert_eq!(owners(got), ["a", "b", "d"]);
    assert!(
        store
            .get_records(ns("ns"), key("k"), vec![])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .get_records(ns("nope"), key("k"), vec![id("a")])
            .await
            .unwrap()
            .is_empty()
    );
    let got = store
        .get_records(ns("ns"), key("k"), vec![id("a")])
        .await
        .unwrap();
    assert_eq!(got[0].value, json!("a"));
}

/// Deletes: missing is `NotFound`, a wrong revision conflicts, the right or
/// no revision deletes; every attempt is audited; a re-created record starts
/// at revision 1.
pub async fn delete_semantics<S: Store>(store: S) {
    let del = |k: &str, expected| Delete {
        owner: id("a"),
        namespace: ns("ns"),
        key: key(k),
        expected_revision: expected,
    };
    assert_eq!(
        store
            .delete_record(del("k", None), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::NotFound
    );
    for v in 0..3 {
        store
            .put_record(
                put("a", "ns", "k", json!(v), None),
                Timestamp(1),
                crate::StorageQuota::default(),
                put_audit("a", "ns.k", v),
            )
            .await
            .unwrap();
    }
    store
        .put_record(
            put("b", "ns", "k", json!("b"), None),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("b", "ns.k", 9),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .delete_record(del("k", Some(2)), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Conflict { current: 3 }
    );
    assert_eq!(get_one(&store, "a", "ns", "k").await.unwrap().revision, 3);
    assert_eq!(
        store
            .delete_record(del("k", Some(3)), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Deleted { revision: 3 }
    );
    assert_eq!(get_one(&store, "a", "ns", "k").await, None);
    // Another owner's record at the same key is untouched.
    assert_eq!(
        get_one(&store, "b", "ns", "k").await.unwrap().value,
        json!("b")
    );
    assert_eq!(
        store
            .delete_record(del("k", Some(3)), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::NotFound
    );
    let outcome = store
        .put_record(
            put("a", "ns", "k", json!("again"), Some(0)),
            Timestamp(5),
            crate::StorageQuota::default(),
            put_audit("a", "ns.k", 10),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, PutOutcome::Written { created: true, ref record } if record.revision == 1)
    );
    assert_eq!(
        store
            .delete_record(del("k", None), delete_audit("a", "ns.k"))
            .await
            .unwrap(),
        DeleteOutcome::Deleted { revision: 1 }
    );
    let entries = audit_all(&store).await;
    let ops: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e.draft.operation == "memory.delete")
        .map(|e| (e.draft.verdict.as_str(), e.draft.reason.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("deny", "record_not_found"),
            ("deny", "revision_conflict"),
            ("allow", "owner_delete"),
            ("deny", "record_not_found"),
            ("allow", "owner_delete"),
        ]
    );
    assert_chain(&store).await;
}

/// Usage counts an owner's records and the bytes of their JSON values.
pub async fn owner_usage_counts<S: Store>(store: S) {
    let values = [json!({"x": 1}), json!("héllo"), json!([1, 2, 3])];
    for (i, v) in values.iter().enumerate() {
        store
            .put_record(
                put("a", "ns", &format!("k{i}"), v.clone(), None),
                Timestamp(1),
                crate::StorageQuota::default(),
                put_audit("a", "k", 0),
            )
            .await
            .unwrap();
    }
    store
        .put_record(
            put("b", "ns", "k0", json!(true), None),
            Timestamp(1),
            crate::StorageQuota::default(),
            put_audit("b", "k", 0),
        )
        .await
        .unwrap();
    let bytes: u64 = values
        .iter()
        .map(|v| serde_json::to_string(v).unwrap().len() as u64)
        .sum();
    assert_eq!(
        store.owner_usage(id("a")).await.unwrap(),
        Usage { records: 3, bytes }
    );
    assert_eq!(
        store.owner_usage(id("b")).await.unwrap(),
        Usage {
            records: 1,
            bytes: 4
        }
    );
    assert_eq!(
        store.owner_usage(id("nobody")).await.unwrap(),
        Usage::default()
    );
    let d = Delete {
        owner: id("a"),
        namespace: ns("ns"),
        key: key("k1"),
        expected_revision: None,
    };
    store
        .delete_record(d, delete_audit("a", "ns.k1"))
        .await
        .unwrap();
    let bytes = bytes - "\"héllo\"".len() as u64;
    assert_eq!(
        store.owner_usage(id("a")).await.unwrap(),
        Usage { records: 2, bytes }
    );
}

// ----- audit -----

fn numbered(i: u64) -> AuditDraft {
    AuditDraft {
        time: Timestamp(i as i64),
        details: json!({"i": i}),
        ..draft(
            "researcher",
            "memory.read",
            &format!("project.k{i}"),
            Verdict::Allow,
            "visible_from:report_manager",
        )
    }
}

/// The empty head, appends in order, the head after each append; an empty
/// append changes nothing.
pub async fn audit_append_and_head<S: Store>(store: S) {
    let empty = ChainHead {
        count: 0,
        seq: 0,
        hash: Digest::GENESIS,
    };
    assert_eq!(store.audit_head().await.unwrap(), empty);
    assert_eq!(store.append_audit(vec![]).await.unwrap(), empty);
    assert!(audit_all(&store).await.is_empty());
    let h3 = store
        .append_audit((1..=3).map(numbered).collect())
        .await
        .unwrap();
    assert_eq!((h3.count, h3.seq), (3, 3));
    assert_eq!(store.audit_head().await.unwrap(), h3);
    assert_eq!(store.append_audit(vec![]).await.unwrap(), h3);
    let h5 = store
        .append_audit((4..=5).map(numbered).collect())
        .await
        .unwrap();
    assert_eq!((h5.count, h5.seq), (5, 5));
    let entries = audit_all(&store).await;
    assert_eq!(
        entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(entries[2].hash, h3.hash);
    assert_eq!(entries[4].hash, h5.hash);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.draft, numbered(i as u64 + 1));
    }
    assert_eq!(assert_chain(&store).await, h5);
}

/// `audit_page` returns entries after a sequence number, ascending, at most
/// `limit` of them.
pub async fn audit_paging<S: Store>(store: S) {
    for batch in 0..5u64 {
        store
            .append_audit((1..=5).map(|i| numbered(batch * 5 + i)).collect())
            .await
            .unwrap();
    }
    let seqs = |p: Vec<AuditEntry>| p.into_iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(store.audit_page(0, 10).await.unwrap()),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(store.audit_page(10, 10).await.unwrap()),
        (11..=20).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(store.audit_page(20, 10).await.unwrap()),
        (21..=25).collect::<Vec<_>>()
    );
    assert_eq!(seqs(store.audit_page(7, 3).await.unwrap()), [8, 9, 10]);
    assert!(store.audit_page(25, 10).await.unwrap().is_empty());
    assert!(store.audit_page(1_000, 10).await.unwrap().is_empty());
    assert!(store.audit_page(0, 0).await.unwrap().is_empty());
    assert_eq!(seqs(store.audit_page(24, usize::MAX).await.unwrap()), [25]);
    assert_eq!(audit_all(&store).await.len(), 25);
}

/// Every field round-trips exactly and the stored hashes are the ones the
/// core computes (`AuditDraft::seal` from the genesis hash).
pub async fn audit_round_trip_and_hashes<S: Store>(store: S) {
    let details = [
        Value::Null,
        json!({"b": {"z": 1, "a": [true, false, null]}, "a": "x"}),
        json!([1, -1, 0.25, 1e300, u64::MAX, i64::MIN]),
        json!("quote \" backslash \\ newline \n tab \t unicode é ✓ \u{1F600}"),
        json!({"obligations": [{"kind": "label", "value": "pii"}]}),
    ];
    let verdicts = [
        Verdict::Allow,
        Verdict::Constrain,
        Verdict::Deny,
        Verdict::Escalate,
        Verdict::Allow,
    ];
    let drafts: Vec<AuditDraft> = details
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(i, (d, v))| AuditDraft {
            time: Timestamp(if i == 0 {
                -5
            } else {
                1_700_000_000_000 + i as i64
            }),
            subject: if i == 1 {
                "@operator".into()
            } else {
                format!("agent-{i}")
            },
            operation: "step.begin".into(),
            resource: format!("run-1/s{i}"),
            verdict: v,
            reason: if i == 2 {
                String::new()
            } else {
                format!("reason_{i}:param")
            },
            policy_version: "lab-1".into(),
            details: d.clone(),
        })
        .collect();
    store.append_audit(drafts[..2].to_vec()).await.unwrap();
    store.append_audit(drafts[2..].to_vec()).await.unwrap();
    let mut prev = Digest::GENESIS;
    let expected: Vec<AuditEntry> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let e = d.clone().seal(i as u64 + 1, prev);
            prev = e.hash;
            e
        })
        .collect();
    assert_eq!(audit_all(&store).await, expected);
    assert_chain(&store).await;
}

/// Concurrent appenders build one chain; each append's entries stay
/// adjacent and each appender's entries keep their order.
pub async fn audit_concurrent_appends<S: Store>(store: S) {
    const TASKS: u64 = 8;
    const APPENDS: u64 = 25;
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for i in 0..APPENDS {
                let d = |part: u64| AuditDraft {
                    details: json!({"task": t, "i": i, "part": part}),
                    ..draft(
                        &format!("agent-{t}"),
                        "memory.read",
                        "ns.k",
                        Verdict::Allow,
                        "ok",
                    )
                };
                store.append_audit(vec![d(0), d(1)]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len() as u64, TASKS * APPENDS * 2);
    let mut next = vec![0u64; TASKS as usize];
    for pair in entries.chunks(2) {
        let (a, b) = (&pair[0].draft.details, &pair[1].draft.details);
        assert_eq!(
            (a["task"].clone(), a["i"].clone()),
            (b["task"].clone(), b["i"].clone()),
            "an append was split"
        );
        assert_eq!((a["part"].as_u64(), b["part"].as_u64()), (Some(0), Some(1)));
        let t = a["task"].as_u64().unwrap() as usize;
        assert_eq!(
            a["i"].as_u64(),
            Some(next[t]),
            "task {t}'s appends out of order"
        );
        next[t] += 1;
    }
    assert_chain(&*store).await;
}

/// [`verify_store`] accepts the intact chain with its own head as anchor
/// and with an older anchor; it rejects an anchor whose hash differs and
/// one beyond the chain's end.
pub async fn audit_verify_and_anchor<S: Store>(store: S) {
    let empty = verify_store(
        &store,
        Some(HeadAnchor {
            seq: 0,
            hash: Digest::GENESIS,
        }),
    )
    .await
    .unwrap();
    assert_eq!(empty.verified.count, 0);
    store
        .append_audit((1..=4).map(numbered).collect())
        .await
        .unwrap();
    let head = store.audit_head().await.unwrap();
    let anchor = HeadAnchor::of(&head);
    let report = verify_store(&store, Some(anchor)).await.unwrap();
    assert_eq!((report.verified, report.anchor), (head, Some(anchor)));
    store
        .append_audit((5..=6).map(numbered).collect())
        .await
        .unwrap();
    let report = verify_store(&store, Some(anchor)).await.unwrap();
    assert_eq!(report.verified.seq, 6);
    let wrong = HeadAnchor {
        seq: 2,
        hash: Digest::of(b"elsewhere"),
    };
    let r = verify_store(&store, Some(wrong)).await;
    assert!(
        matches!(r, Err(VerifyError::AnchorMismatch { seq: 2 })),
        "{r:?}"
    );
    let beyond = HeadAnchor {
        seq: 9,
        hash: head.hash,
    };
    let err = verify_store(&store, Some(beyond)).await.unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::AnchorNotReached {
                last_seq: 6,
                anchor_seq: 9
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.seq(), Some(7));
}

// ----- runs -----

/// A new run is created and audited; the same id again returns the stored
/// run (whatever the new SOP hash) and appends nothing.
pub async fn runs_create_existing_get<S: Store>(store: S) {
    let run = sample_run("run-1", Digest::of(b"sop"));
    let audit = || {
        vec![draft(
            "researcher",
            "run.admit",
            "run-1",
            Verdict::Allow,
            "admitted",
        )]
    };
    assert_eq!(
        store
            .create_run(run.clone(), None, crate::audit_if_created(audit()))
            .await
            .unwrap(),
        CreateRun::Created
    );
    assert_eq!(head_count(&store).await, 1);
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(state.run, run);
    assert!(state.outcomes.is_empty());
    let reused = sample_run("run-1", Digest::of(b"another sop"));
    match store
        .create_run(reused, None, crate::audit_if_created(audit()))
        .await
        .unwrap()
    {
        CreateRun::Existing(existing) => {
            assert_eq!(existing.run, run);
            assert_eq!(existing.run.sop_hash, Digest::of(b"sop"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(head_count(&store).await, 1);
    assert_eq!(store.get_run(run_id("run-2")).await.unwrap(), None);
    let other = sample_run("run-2", Digest::of(b"sop"));
    assert_eq!(
        store
            .create_run(other.clone(), None, crate::audit_if_created(vec![]))
            .await
            .unwrap(),
        CreateRun::Created
    );
    assert_eq!(
        store.get_run(run_id("run-2")).await.unwrap().unwrap().run,
        other
    );
    assert_chain(&store).await;
}

/// A step outcome is recorded once: a second record returns the first
/// outcome unchanged and appends nothing.
pub async fn record_step_exactly_once<S: Store>(store: S) {
    let run = sample_run("run-1", Digest::of(b"sop"));
    store
        .create_run(run, None, crate::audit_if_created(vec![]))
        .await
        .unwrap();
    let audit = |s: &str| {
        vec![draft(
            "researcher",
            "step.complete",
            s,
            Verdict::Allow,
            "step_allowed",
        )]
    };
    let first = completed(json!({"summary": "ok", "n": 3}));
    assert_eq!(
        store
            .record_step(run_id("run-1"), step_id("s1"), first.clone(), audit("s1"))
            .await
            .unwrap(),
        RecordStep::Recorded
    );
    assert_eq!(head_count(&store).await, 1);
    let retry = StepOutcome {
        status: StepStatus::Failed,
        result: None,
        error: Some("timeout".into()),
        labels: vec![],
        recorded_at: Timestamp(99),
    };
    assert_eq!(
        store
            .record_step(run_id("run-1"), step_id("s1"), retry.clone(), audit("s1"))
            .await
            .unwrap(),
        RecordStep::AlreadyRecorded(first.clone())
    );
    assert_eq!(head_count(&store).await, 1);
    let failed = StepOutcome {
        status: StepStatus::Denied,
        error: Some("lockdown".into()),
        ..retry
    };
    assert_eq!(
        store
            .record_step(run_id("run-1"), step_id("s3"), failed.clone(), audit("s3"))
            .await
            .unwrap(),
        RecordStep::Recorded
    );
    let state = store.get_run(run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(state.outcomes.len(), 2);
    assert_eq!(state.outcomes.get(&step_id("s1")), Some(&first));
    assert_eq!(state.outcomes.get(&step_id("s3")), Some(&failed));
    match store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap()
    {
        CreateRun::Existing(existing) => assert_eq!(existing.outcomes, state.outcomes),
        other => panic!("{other:?}"),
    }
    assert_eq!(head_count(&store).await, 2);
    assert_chain(&store).await;
}

/// Recording a step of an unknown run, or an unknown step, is `NotFound`
/// and appends nothing.
pub async fn record_step_unknown<S: Store>(store: S) {
    store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    let audit = || {
        vec![draft(
            "researcher",
            "step.complete",
            "x",
            Verdict::Allow,
            "step_allowed",
        )]
    };
    let err = store
        .record_step(run_id("ghost"), step_id("s1"), completed(json!(1)), audit())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Run, ref id } if id == "ghost"),
        "{err:?}"
    );
    let err = store
        .record_step(run_id("run-1"), step_id("s9"), completed(json!(1)), audit())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { entity: Entity::Step, ref id } if id == "run-1/s9"),
        "{err:?}"
    );
    assert_eq!(head_count(&store).await, 0);
    assert!(
        store
            .get_run(run_id("run-1"))
            .await
            .unwrap()
            .unwrap()
            .outcomes
            .is_empty()
    );
    assert_eq!(store.get_run(run_id("ghost")).await.unwrap(), None);
}

/// Writers of every kind, some failing, run concurrently: each successful
/// operation's entries are in the chain, failed ones left none, and the
/// chain verifies.
pub async fn mixed_concurrent_writers<S: Store>(store: S) {
    let store = Arc::new(store);
    store
        .insert_agent(agent("root", None), register("root"))
        .await
        .unwrap();
    store
        .create_run(
            sample_run("run-1", Digest::of(b"sop")),
            None,
            crate::audit_if_created(vec![]),
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut expected = 0u64;
            for i in 0..10u64 {
                let k = format!("t{t}k{i}");
                let outcome = store
                    .put_record(
                        put("root", "ns", &k, json!(i), Some(0)),
                        Timestamp(1),
                        crate::StorageQuota::default(),
                        put_audit("root", &k, i),
                    )
                    .await
                    .unwrap();
                assert!(matches!(outcome, PutOutcome::Written { .. }));
                expected += 1;
                // Always fails: duplicate agent.
                let dup = store
                    .insert_agent(agent("root", None), register("dup"))
                    .await;
                assert!(matches!(
                    dup,
                    Err(StoreError::Duplicate {
                        entity: Entity::Agent,
                        ..
                    })
                ));
                // Fails: unknown step.
                let bad = store
                    .record_step(
                        run_id("run-1"),
                        step_id("nope"),
                        completed(json!(0)),
                        register("bad-step"),
                    )
                    .await;
                assert!(matches!(
                    bad,
                    Err(StoreError::NotFound {
                        entity: Entity::Step,
                        ..
                    })
                ));
                store
                    .append_audit(vec![draft("root", "note", &k, Verdict::Allow, "ok")])
                    .await
                    .unwrap();
                expected += 1;
            }
            expected
        }));
    }
    let mut expected = 1;
    for t in tasks {
        expected += t.await.unwrap();
    }
    let entries = audit_all(&*store).await;
    assert_eq!(entries.len() as u64, expected);
    assert!(
        entries
            .iter()
            .all(|e| e.draft.resource != "dup" && e.draft.resource != "bad-step")
    );
    for t in 0..4 {
        for i in 0..10 {
            let k = format!("t{t}k{i}");
            assert_eq!(
                get_one(&*store, "root", "ns", &k).await.unwrap().value,
                json!(i)
            );
        }
    }
    assert_chain(&*store).await;
}

// ----- quotas -----

fn records_quota(max: u64) -> StorageQuota {
    StorageQuota {
        max_records: Some(max),
        max_bytes: None,
    }
}

fn bytes_quota(max: u64) -> StorageQuota {
    StorageQuota {
        max_records: None,
        max_bytes: Some(max),
    }
}

/// Put with a quota and the engine-like audit function.
async fn put_q<S: Store>(
    store: &S,
    owner: &str,
    k: &str,
    value: Value,
    quota: StorageQuota,
) -> PutOutcome {
    store
        .put_record(
            put(owner, "ns", k, value, None),
            Timestamp(5),
            quota,
            put_audit(owner, k, 0),
        )
        .await
        .unwrap()
}

/// `max_records`: a create counts one more record; at the limit a create
/// is `OverQuota` (nothing stored, the refusal audited), an update is not
/// a create and is allowed, other owners are not affected.
pub async fn quota_max_records<S: Store>(store: S) {
    let q = records_quota(2);
    for k in ["a", "b"] {
        let o = put_q(&store, "o", k, json!(1), q).await;
        assert!(
            matches!(o, PutOutcome::Written { created: true, .. }),
            "{o:?}"
        );
    }
    let o = put_q(&store, "o", "c", json!(1), q).await;
    assert_eq!(
        o,
        PutOutcome::OverQuota {
            quota: QuotaKind::Records,
            limit: 2,
            used: 2
        }
    );
    assert_eq!(get_one(&store, "o", "ns", "c").await, None);
    let last = audit_all(&store).await.pop().unwrap();
    assert_eq!(
        (last.draft.verdict, last.draft.reason.as_str()),
        (Verdict::Deny, "quota_max_records")
    );
    assert_eq!(last.draft.details["limit"], json!(2));
    assert_eq!(last.draft.details["used"], json!(2));
    // An update at the limit is allowed, and so is another owner's create.
    let o = put_q(&store, "o", "a", json!({"bigger": [1, 2, 3]}), q).await;
    assert!(
        matches!(o, PutOutcome::Written { created: false, .. }),
        "{o:?}"
    );
    let o = put_q(&store, "p", "c", json!(1), q).await;
    assert!(
        matches!(o, PutOutcome::Written { created: true, .. }),
        "{o:?}"
    );
    // Without a quota the store does not limit.
    let o = put_q(&store, "o", "d", json!(1), StorageQuota::default()).await;
    assert!(
        matches!(o, PutOutcome::Written { created: true, .. }),
        "{o:?}"
    );
    assert_eq!(
        store.owner_usage(id("o")).await.unwrap().records,
        3,
        "a refused create stored nothing"
    );
    assert_eq!(head_count(&store).await, 6, "every attempt is audited");
    assert_chain(&store).await;
}

/// `max_bytes`: bytes are the owner's JSON-encoded value lengths; a write
/// that grows a value must keep `used - old + new <= max`; one that does
/// not grow is always allowed, even over the limit.
pub async fn quota_max_bytes<S: Store>(store: S) {
    // `"xxxx"` is 6 bytes of JSON.
    let six = json!("xxxx");
    assert_eq!(crate::encoded_len(&six), 6);
    let q = bytes_quota(12);
    assert!(matches!(
        put_q(&store, "o", "a", six.clone(), q).await,
        PutOutcome::Written { .. }
    ));
    assert!(matches!(
        put_q(&store, "o", "b", six.clone(), q).await,
        PutOutcome::Written { .. }
    ));
    assert_eq!(
        store.owner_usage(id("o")).await.unwrap(),
        Usage {
            records: 2,
            bytes: 12
        }
    );
    // A new record of any size is over; so is growing one.
    assert_eq!(
        put_q(&store, "o", "c", json!(1), q).await,
        PutOutcome::OverQuota {
            quota: QuotaKind::Bytes,
            limit: 12,
            used: 12
        }
    );
    assert_eq!(
        put_q(&store, "o", "a", json!("xxxxx"), q).await,
        PutOutcome::OverQuota {
            quota: QuotaKind::Bytes,
            limit: 12,
            used: 12
        }
    );
    let a = get_one(&store, "o", "ns", "a").await.unwrap();
    assert_eq!((a.value, a.revision), (six.clone(), 1), "nothing changed");
    // The same size and smaller are allowed, even under a lower limit.
    assert!(matches!(
        put_q(&store, "o", "a", json!("yyyy"), q).await,
        PutOutcome::Written { .. }
    ));
    assert!(matches!(
        put_q(&store, "o", "a", json!("y"), bytes_quota(1)).await,
        PutOutcome::Written { .. }
    ));
    // Freed bytes can be used again: 3 + 6 + 3 = 12.
    assert!(matches!(
        put_q(&store, "o", "c", json!("z"), q).await,
        PutOutcome::Written { created: true, .. }
    ));
    assert_eq!(
        store.owner_usage(id("o")).await.unwrap(),
        Usage {
            records: 3,
            bytes: 12
        }
    );
    assert_eq!(head_count(&store).await, 7);
    assert_chain(&store).await;
}

/// [`RACE_WRITERS`] concurrent creates of different keys by one owner under
/// `max_records`: exactly the limit is stored, however the writers
/// interleave; every attempt is audited.
pub async fn quota_concurrent_creates<S: Store>(store: S) {
    const MAX: u64 = 5;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            put_q(&*store, "o", &format!("k{i}"), json!(i), records_quota(MAX)).await
        }));
    }
    let mut written = 0;
    for t in tasks {
        match t.await.unwrap() {
            PutOutcome::Written { .. } => written += 1,
            PutOutcome::OverQuota {
                quota: QuotaKind::Records,
                limit: MAX,
                used: MAX,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(written, MAX);
    assert_eq!(store.owner_usage(id("o")).await.unwrap().records, MAX);
    assert_eq!(head_count(&*store).await, RACE_WRITERS as u64);
    assert_chain(&*store).await;
}

fn agent_run(name: &str, agent: &str, created_at: i64) -> RunRecord {
    RunRecord {
        agent: id(agent),
        created_at: Timestamp(created_at),
        ..sample_run(name, Digest::of(name.as_bytes()))
    }
}

fn run_audit(tag: &str) -> AuditFn<CreateRun> {
    let tag = tag.to_string();
    Box::new(move |outcome: &CreateRun| match outcome {
        CreateRun::Created => vec![draft("a", "run.admit", &tag, Verdict::Allow, "admitted")],
        CreateRun::OverQuota { limit, in_flight } => vec![AuditDraft {
            details: json!({"limit": limit, "in_flight": in_flight}),
            ..draft(
                "a",
                "run.admit",
                &tag,
                Verdict::Deny,
                "quota_max_runs_in_flight",
            )
        }],
        CreateRun::Existing(_) => Vec::new(),
    })
}

fn in_flight(max: u32, since: i64) -> Option<RunsInFlight> {
    Some(RunsInFlight {
        max,
        since: Timestamp(since),
    })
}

/// Runs in flight: unfinished runs of the same agent created at or after
/// `since`. At the limit a create is `OverQuota` (nothing stored, the
/// refusal audited); an existing id is returned whatever the quota; a run
/// stops counting once a step fails or is denied, once every step has an
/// outcome, or once it is older than `since`.
pub async fn runs_in_flight_limit<S: Store>(store: S) {
    for name in ["r1", "r2"] {
        let o = store
            .create_run(agent_run(name, "a", 10), in_flight(2, 0), run_audit(name))
            .await
            .unwrap();
        assert_eq!(o, CreateRun::Created);
    }
    let o = store
        .create_run(agent_run("r3", "a", 10), in_flight(2, 0), run_audit("r3"))
        .await
        .unwrap();
    assert_eq!(
        o,
        CreateRun::OverQuota {
            limit: 2,
            in_flight: 2
        }
    );
    assert_eq!(store.get_run(run_id("r3")).await.unwrap(), None);
    let last = audit_all(&store).await.pop().unwrap();
    assert_eq!(last.draft.reason, "quota_max_runs_in_flight");
    assert_eq!(last.draft.details, json!({"limit": 2, "in_flight": 2}));
    // An existing run comes back whatever the quota, appending nothing.
    let before = head_count(&store).await;
    let o = store
        .create_run(agent_run("r1", "a", 10), in_flight(0, 0), run_audit("r1"))
        .await
        .unwrap();
    assert!(
        matches!(o, CreateRun::Existing(ref s) if s.run.run_id == run_id("r1")),
        "{o:?}"
    );
    assert_eq!(head_count(&store).await, before);
    // Another agent has its own count.
    let o = store
        .create_run(agent_run("b1", "b", 10), in_flight(2, 0), run_audit("b1"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    // A failed step finishes r1.
    let failed = StepOutcome {
        status: StepStatus::Failed,
        result: None,
        error: Some("boom".into()),
        labels: Vec::new(),
        recorded_at: Timestamp(11),
    };
    store
        .record_step(run_id("r1"), step_id("s1"), failed, Vec::new())
        .await
        .unwrap();
    let o = store
        .create_run(agent_run("r3", "a", 12), in_flight(2, 0), run_audit("r3"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    // r2 completes every step: finished.
    for s in ["s1", "s2"] {
        store
            .record_step(run_id("r2"), step_id(s), completed(json!(1)), Vec::new())
            .await
            .unwrap();
    }
    let o = store
        .create_run(agent_run("r4", "a", 13), in_flight(2, 0), run_audit("r4"))
        .await
        .unwrap();
    assert_eq!(
        o,
        CreateRun::OverQuota {
            limit: 2,
            in_flight: 2
        },
        "two of three steps completed is not finished"
    );
    store
        .record_step(run_id("r2"), step_id("s3"), completed(json!(1)), Vec::new())
        .await
        .unwrap();
    let o = store
        .create_run(agent_run("r4", "a", 13), in_flight(2, 0), run_audit("r4"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    // r3 (created at 12) and r4 (13) are in flight; from `since` 13 on only
    // r4 counts, so an abandoned r3 no longer holds a slot.
    let o = store
        .create_run(agent_run("r5", "a", 14), in_flight(2, 0), run_audit("r5"))
        .await
        .unwrap();
    assert!(
        matches!(o, CreateRun::OverQuota { in_flight: 2, .. }),
        "{o:?}"
    );
    let o = store
        .create_run(agent_run("r5", "a", 14), in_flight(2, 13), run_audit("r5"))
        .await
        .unwrap();
    assert_eq!(o, CreateRun::Created);
    assert_chain(&store).await;
}

/// [`RACE_WRITERS`] concurrent creates of different runs by one agent
/// never exceed the limit.
pub async fn runs_in_flight_concurrent<S: Store>(store: S) {
    const MAX: u32 = 3;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WRITERS));
    let mut tasks = Vec::new();
    for i in 0..RACE_WRITERS {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let name = format!("run-{i}");
            store
                .create_run(
                    agent_run(&name, "a", 10),
                    in_flight(MAX, 0),
                    run_audit(&name),
                )
                .await
                .unwrap()
        }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            CreateRun::Created => created += 1,
            CreateRun::OverQuota {
                limit: MAX,
                in_flight: MAX,
            } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(created, MAX);
    assert_eq!(head_count(&*store).await, RACE_WRITERS as u64);
    assert_chain(&*store).await;
}
