//! Servers sharing one PostgreSQL database ("two servers" are two stores on
//! one schema, each with its own engine, as two `warden serve` processes
//! would have): request rates are shared, not multiplied; the envelope
//! signing key is one; a step begun on one completes on the other.
//! Skipped without `WARDEN_TEST_DATABASE_URL`.

use std::sync::Arc;

use warden::{Authentication, Caller, Completion, Engine, ManualClock, StepGate, TokenIssue};
use warden_core::time::Timestamp;
use warden_postgres::PgStore;
use warden_store::{Store, TokenSubject};

use crate::support::*;

const ROUTE: &str = "GET /v1/agents/{id}";

fn database_url() -> Option<String> {
    let url = std::env::var("WARDEN_TEST_DATABASE_URL")
        .ok()
        .filter(|s| !s.trim().is_empty());
    if url.is_none() {
        eprintln!("skipped: WARDEN_TEST_DATABASE_URL is not set");
    }
    url
}

/// Two engines ("servers") over two stores on one fresh schema, on one
/// fixed clock.
struct TwoServers {
    url: String,
    schema: String,
    a: Engine<PgStore>,
    b: Engine<PgStore>,
    clock: Arc<ManualClock>,
}

impl TwoServers {
    async fn start(url: &str, policy: &str) -> Self {
        let schema = super::model::fresh_schema();
        let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
        let open = || async {
            let store = PgStore::connect_in_schema(url, &schema).await.unwrap();
            let policy = warden_core::bundle::compile(policy).unwrap();
            Engine::open(policy, store, clock.clone()).await.unwrap()
        };
        let a = open().await;
        let b = open().await;
        Self {
            url: url.to_owned(),
            schema: schema.clone(),
            a,
            b,
            clock,
        }
    }

    async fn stop(self) {
        drop((self.a, self.b));
        super::model::drop_schema(&self.url, &self.schema).await;
    }
}

async fn secret<S: Store>(engine: &Engine<S>, agent: &str) -> String {
    match engine
        .issue_token(&Caller::Operator, TokenSubject::Agent(id(agent)))
        .await
        .unwrap()
    {
        TokenIssue::Issued { token, .. } => token.secret,
        other => panic!("expected a token, got {other:?}"),
    }
}

/// A parent with two children; the parent's subtree may make `tree`
/// requests a second together, each agent `own` alone.
fn family(tree: u32, own: u32) -> String {
    format!(
        "policy_version: rates\nenvironment_capabilities: [memory.read]\nagents:\n  - {{id: parent, capabilities: [memory.read]}}\n  - {{id: child0, parent: parent, capabilities: [memory.read]}}\n  - {{id: child1, parent: parent, capabilities: [memory.read]}}\nquotas:\n  default: {{requests_per_second: {own}}}\n  agents:\n    parent: {{tree_requests_per_second: {tree}}}\n"
    )
}

/// `n` concurrent requests with `secret` on each of the two engines: how
/// many were let through, and how many refusals named `tree`'s limit.
async fn burst(servers: &TwoServers, secrets: [&str; 2], n: usize) -> (usize, Vec<Authentication>) {
    let mut tasks = Vec::new();
    for _ in 0..n {
        for (engine, secret) in [(&servers.a, secrets[0]), (&servers.b, secrets[1])] {
            let (engine, secret) = (engine.clone(), secret.to_owned());
            tasks.push(tokio::spawn(async move {
                engine.authenticate(&secret, ROUTE).await.unwrap()
            }));
        }
    }
    let mut taken = 0;
    let mut refused = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Authentication::Agent(_) => taken += 1,
            other @ Authentication::Throttled { .. } => refused.push(other),
            other => panic!("unexpected {other:?}"),
        }
    }
    (taken, refused)
}

/// One agent charged concurrently on two servers gets its one bucket's
/// burst in all (not twice), then its rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_share_an_agents_request_rate() {
    let Some(url) = database_url() else { return };
    let servers = TwoServers::start(&url, &family(1_000, 4)).await;
    let s = secret(&servers.a, "child0").await;
    let (taken, refused) = burst(&servers, [&s, &s], 10).await;
    assert_eq!(taken, 4, "one bucket of 4 across both servers");
    assert_eq!(refused.len(), 16);
    assert!(refused.iter().all(|r| matches!(
        r,
        Authentication::Throttled {
            tree: None,
            requests_per_second: 4,
            ..
        }
    )));
    // Half a second later the bucket has refilled by two, on both servers.
    servers.clock.advance(500);
    let (taken, _) = burst(&servers, [&s, &s], 5).await;
    assert_eq!(taken, 2);
    servers.stop().await;
}

/// Two children of one parent, each on its own server, share the parent's
/// tree rate: together they get the tree's burst, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_share_a_trees_request_rate() {
    let Some(url) = database_url() else { return };
    let servers = TwoServers::start(&url, &family(5, 100)).await;
    let c0 = secret(&servers.a, "child0").await;
    let c1 = secret(&servers.b, "child1").await;
    let (taken, refused) = burst(&servers, [&c0, &c1], 10).await;
    assert_eq!(taken, 5, "the parent's tree rate of 5 across both servers");
    assert_eq!(refused.len(), 15);
    assert!(refused.iter().all(|r| matches!(
        r,
        Authentication::Throttled { tree: Some(t), requests_per_second: 5, .. } if *t == id("parent")
    )));
    // Every refusal is accounted for in the one log: each server records
    // an agent's first refusal of a window and counts the rest, and the
    // counts are recorded once the windows close.
    servers.clock.advance(1_000);
    servers.a.flush_refusal_counts().await.unwrap();
    servers.b.flush_refusal_counts().await.unwrap();
    let entries = servers.a.store().audit_page(0, 10_000).await.unwrap();
    let refusals: u64 = entries
        .iter()
        .filter(|e| e.draft.reason == "quota_requests_per_second")
        .map(|e| e.draft.details["suppressed"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(refusals, 15);
    servers.stop().await;
}

/// Servers starting together store one envelope signing key (the first
/// writer's), and both read it; a rotation on one is read by the other,
/// with the old key kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_agree_on_the_stored_envelope_key() {
    let Some(url) = database_url() else { return };
    let servers = TwoServers::start(&url, LAB_POLICY).await;
    let (ka, kb) = tokio::join!(
        servers.a.envelope_keys_or_create([1; 32]),
        servers.b.envelope_keys_or_create([2; 32]),
    );
    let (ka, kb) = (ka.unwrap(), kb.unwrap());
    assert_eq!(ka, kb);
    assert_eq!(ka.len(), 1);
    assert!(ka[0].seed == [1; 32] || ka[0].seed == [2; 32]);
    let created = servers
        .a
        .store()
        .audit_page(0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.draft.operation == "envelope_key.create")
        .count();
    assert_eq!(created, 1, "only the stored key is recorded");
    let rotated = servers.b.rotate_envelope_key([3; 32]).await.unwrap();
    assert_eq!(rotated.generation, 2);
    let seen = servers.a.envelope_keys().await.unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], ka[0]);
    assert_eq!(seen[1], rotated);
    servers.stop().await;
}

/// A step begun on one server completes on the other: the lease is in the
/// database, and the holder presents its lease id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_begun_on_one_server_completes_on_the_other() {
    use super::leases::{admit, ok, policy, proceed, rid, sid};
    let Some(url) = database_url() else { return };
    let servers = TwoServers::start(&url, &policy()).await;
    let (a, b) = (&servers.a, &servers.b);
    admit(a, "run-two").await;
    let me = id("researcher");
    let (holder, _) = proceed(
        a.begin_step(&me, &rid("run-two"), &sid("save"))
            .await
            .unwrap(),
    );
    // The other server sees the lease: its begin runs nothing.
    assert!(matches!(
        b.begin_step(&me, &rid("run-two"), &sid("save"))
            .await
            .unwrap(),
        StepGate::InProgress { .. }
    ));
    let out = b
        .complete_begun_step_as(&me, &rid("run-two"), &sid("save"), None, ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::LeaseHeld { .. }), "{out:?}");
    let out = b
        .complete_begun_step_as(&me, &rid("run-two"), &sid("save"), Some(&holder), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::Recorded(_)), "{out:?}");
    // Recorded once, seen by both.
    let state = a.store().get_run(rid("run-two")).await.unwrap().unwrap();
    assert!(state.outcomes.contains_key(&sid("save")));
    assert!(matches!(
        a.begin_step(&me, &rid("run-two"), &sid("save"))
            .await
            .unwrap(),
        StepGate::Replay { .. }
    ));
    // The next step begins on the other server and completes on the first.
    let (holder, _) = proceed(
        b.begin_step(&me, &rid("run-two"), &sid("again"))
            .await
            .unwrap(),
    );
    let out = a
        .complete_begun_step_as(&me, &rid("run-two"), &sid("again"), Some(&holder), ok())
        .await
        .unwrap();
    assert!(matches!(out, Completion::Recorded(_)), "{out:?}");
    servers.stop().await;
}

/// Retries of one approved call race on both servers over PostgreSQL,
/// round after round: the call proceeds exactly once, and no round leaves
/// an escalation a reviewer could approve but no request could use (the
/// retries that lost the approval withdraw theirs, or the winner does).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_retries_of_one_approved_call_leave_nothing_pending() {
    let Some(url) = database_url() else { return };
    let servers = TwoServers::start(&url, super::sessions::SESSION_POLICY).await;
    for round in 0..8 {
        let (s, _esc, pay) =
            super::sessions::approved_call(&servers.a, &format!("s-race-{round}")).await;
        let mut tasks = Vec::new();
        for i in 0..6 {
            let engine = if i % 2 == 0 {
                servers.a.clone()
            } else {
                servers.b.clone()
            };
            let (s, pay) = (s.clone(), pay.clone());
            tasks.push(tokio::spawn(async move {
                super::sessions::call(&engine, &s, "c1", "send_money", pay).await
            }));
        }
        let mut fresh = 0;
        for t in tasks {
            let answer = t.await.unwrap();
            assert_eq!(
                answer.call.status,
                warden_store::CallStatus::Allowed,
                "{answer:?}"
            );
            if !answer.replayed {
                fresh += 1;
            }
        }
        assert_eq!(fresh, 1, "round {round}: the call proceeded once");
        let pending = servers
            .a
            .list_escalations(Some(warden_store::EscalationStatus::Pending))
            .await
            .unwrap();
        assert!(
            pending.is_empty(),
            "round {round}: left pending: {pending:?}"
        );
    }
    let v = servers.a.verify_audit().await.unwrap();
    assert!(v.is_valid(), "{v:?}");
    servers.stop().await;
}
