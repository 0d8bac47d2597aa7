//! Request rates per agent and per subtree, on a fixed clock: delegation
//! does not multiply a tree's rate, and a throttled agent cannot flood the
//! decision log (the refusals are counted, not lost).

use std::sync::Arc;

use warden::{Authentication, Caller, Engine, ManualClock, TokenIssue};
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, TokenSubject};

use crate::support::*;

const ROUTE: &str = "GET /v1/agents/{id}";

/// A parent with ten children; the parent's subtree may make `tree` requests
/// per second together, each child `own` alone.
fn family(tree: u32, own: u32) -> String {
    let mut s = String::from(
        "policy_version: rates\nenvironment_capabilities: [memory.read]\nagents:\n  - {id: parent, capabilities: [memory.read]}\n",
    );
    for i in 0..10 {
        s.push_str(&format!(
            "  - {{id: child{i}, parent: parent, capabilities: [memory.read]}}\n"
        ));
    }
    s.push_str(&format!(
        "quotas:\n  default: {{requests_per_second: {own}}}\n  agents:\n    parent: {{tree_requests_per_second: {tree}}}\n"
    ));
    s
}

async fn engine(policy: &str) -> (Engine<MemoryStore>, Arc<ManualClock>) {
    let policy = warden_core::bundle::compile(policy).unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let engine = Engine::open(policy, MemoryStore::new(), clock.clone())
        .await
        .unwrap();
    (engine, clock)
}

async fn secret(engine: &Engine<MemoryStore>, agent: &str) -> String {
    match engine
        .issue_token(&Caller::Operator, TokenSubject::Agent(id(agent)))
        .await
        .unwrap()
    {
        TokenIssue::Issued { token, .. } => token.secret,
        other => panic!("expected a token, got {other:?}"),
    }
}

#[tokio::test]
async fn ten_children_share_their_parents_tree_rate() {
    let (engine, clock) = engine(&family(5, 3)).await;
    let mut secrets = Vec::new();
    for i in 0..10 {
        secrets.push(secret(&engine, &format!("child{i}")).await);
    }
    let parent = secret(&engine, "parent").await;
    // Over 10 seconds, every child asks 20 times per second (200 per second
    // in all, each child over its own 3): together they get the tree's 5
    // per second (a burst of 5, then 5 per second), not ten times 3.
    let mut accepted = 0u32;
    let mut tree_refusals = 0u32;
    for tick in 0..200 {
        if tick > 0 {
            clock.advance(50);
        }
        for s in &secrets {
            match engine.authenticate(s, ROUTE).await.unwrap() {
                Authentication::Agent(_) => accepted += 1,
                Authentication::Throttled { tree, .. } => {
                    if tree == Some(id("parent")) {
                        tree_refusals += 1;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // The burst of 5, then 0.25 tokens per 50 ms tick over 9.95 s: 49 more.
    assert_eq!(accepted, 5 + 49, "accepted {accepted}");
    assert!(tree_refusals > 0);
    // The parent itself is in its tree: the tree is empty now.
    let auth = engine.authenticate(&parent, ROUTE).await.unwrap();
    assert!(
        matches!(&auth, Authentication::Throttled { tree: Some(t), .. } if *t == id("parent")),
        "{auth:?}"
    );
    assert_eq!(
        verify(&engine).await,
        engine.audit_head().await.unwrap().count
    );
}

#[tokio::test]
async fn a_child_never_gets_more_than_its_parents_tree_allows() {
    // The child's own quota (100/s) is higher than the parent's tree (2/s).
    let (engine, _clock) = engine(&family(2, 100)).await;
    let child = secret(&engine, "child0").await;
    let mut accepted = 0;
    for _ in 0..50 {
        if matches!(
            engine.authenticate(&child, ROUTE).await.unwrap(),
            Authentication::Agent(_)
        ) {
            accepted += 1;
        }
    }
    assert_eq!(accepted, 2);
}

#[tokio::test]
async fn ten_thousand_refusals_add_a_bounded_number_of_entries_that_count_them_all() {
    let (engine, clock) = engine(&family(1_000, 1)).await;
    let child = secret(&engine, "child0").await;
    let other = secret(&engine, "child1").await;
    // The one request of the burst.
    assert!(matches!(
        engine.authenticate(&child, ROUTE).await.unwrap(),
        Authentication::Agent(_)
    ));
    let before = engine.audit_head().await.unwrap().seq;
    let mut recorded = 0u64;
    for i in 0..10_000u32 {
        match engine.authenticate(&child, ROUTE).await.unwrap() {
            Authentication::Throttled { recorded: r, .. } => recorded += u64::from(r),
            other => panic!("request {i}: expected a throttle, got {other:?}"),
        }
        // 10,000 refusals over 0.9 s: the bucket (1/s) never refills.
        if i % 100 == 99 {
            clock.advance(9);
        }
    }
    assert_eq!(recorded, 1);
    assert_eq!(engine.audit_head().await.unwrap().seq, before + 1);
    // The window closes; another agent's request records the count.
    clock.advance(200);
    assert!(matches!(
        engine.authenticate(&other, ROUTE).await.unwrap(),
        Authentication::Agent(_)
    ));
    let entries: Vec<_> = audit(&engine)
        .await
        .into_iter()
        .filter(|e| e.seq > before)
        .collect();
    assert_eq!(entries.len(), 2, "{entries:#?}");
    let refused: u64 = entries
        .iter()
        .map(|e| {
            assert_eq!(
                (e.draft.subject.as_str(), e.draft.reason.as_str()),
                ("child0", "quota_requests_per_second")
            );
            e.draft.details["suppressed"].as_u64().unwrap_or(1)
        })
        .sum();
    assert_eq!(refused, 10_000);
    assert_eq!(entries[1].draft.details["suppressed"], 9_999);
    assert_eq!(
        entries[1].draft.details["window_start"],
        entries[0].draft.time.0
    );
    assert_eq!(entries[0].draft.details["limit"], "agent");
    assert_eq!(
        verify(&engine).await,
        engine.audit_head().await.unwrap().count
    );
}

#[tokio::test]
async fn a_throttled_agent_over_many_windows_adds_a_few_entries_per_window() {
    let (engine, clock) = engine(&family(1_000, 1)).await;
    let child = secret(&engine, "child0").await;
    let before = engine.audit_head().await.unwrap().seq;
    let (mut accepted, mut refused) = (0u64, 0u64);
    // 10 s at 1,000 requests per second (one per millisecond).
    for _ in 0..10_000 {
        match engine.authenticate(&child, ROUTE).await.unwrap() {
            Authentication::Agent(_) => accepted += 1,
            Authentication::Throttled { .. } => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
        clock.advance(1);
    }
    engine.flush_refusal_counts().await.unwrap();
    clock.advance(1_000);
    engine.flush_refusal_counts().await.unwrap();
    let entries: Vec<_> = audit(&engine)
        .await
        .into_iter()
        .filter(|e| e.seq > before)
        .collect();
    assert!(entries.len() <= 2 * 11, "{} entries", entries.len());
    let counted: u64 = entries
        .iter()
        .map(|e| e.draft.details["suppressed"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(counted, refused);
    assert_eq!(accepted + refused, 10_000);
    assert_eq!(accepted, 1 + 9);
}
