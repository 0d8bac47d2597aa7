//! Tokens, authentication, route refusals, visibility and the audit log
//! through the engine alone (no server): every decision checked in the
//! decision log.

use std::sync::Arc;

use warden::{
    AgentRead, AgentVisibility, Authentication, Caller, Engine, EngineError, ManualClock, Missing,
    OperatorTokenError, OperatorTokenSource, Revocation, RouteRefusal, TokenIssue, TokenRevocation,
    hash_token,
};
use warden_core::audit::AuditEntry;
use warden_core::decision::Verdict;
use warden_core::time::Timestamp;
use warden_store::{MemoryStore, Store, TokenSubject};

use crate::support::*;

const ROUTE: &str = "GET /v1/agents/{id}";
const ENV_TOKEN: &str = "an-operator-token-of-enough-length-0123456789";

async fn throttled_lab() -> (Engine<MemoryStore>, Arc<ManualClock>) {
    let policy = warden_core::bundle::compile(&format!(
        "{LAB_POLICY}\nquotas:\n  agents:\n    formatter: {{requests_per_second: 2}}\n"
    ))
    .unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let engine = Engine::open(policy, MemoryStore::new(), clock.clone())
        .await
        .unwrap();
    (engine, clock)
}

async fn count(engine: &Engine<MemoryStore>) -> u64 {
    engine.audit_head().await.unwrap().count
}

async fn last(engine: &Engine<MemoryStore>) -> AuditEntry {
    audit(engine).await.pop().unwrap()
}

async fn issue(engine: &Engine<MemoryStore>, agent: &str) -> warden::IssuedToken {
    match engine
        .issue_token(&Caller::Operator, TokenSubject::Agent(id(agent)))
        .await
        .unwrap()
    {
        TokenIssue::Issued { token, .. } => token,
        other => panic!("expected a token, got {other:?}"),
    }
}

#[tokio::test]
async fn issued_tokens_are_recorded_stored_hashed_and_authenticate_their_agent() {
    let engine = lab().await;
    let before = count(&engine).await;
    let out = engine
        .issue_token(&Caller::Operator, TokenSubject::Agent(id("researcher")))
        .await
        .unwrap();
    let TokenIssue::Issued { token, decision } = out else {
        panic!("expected a token");
    };
    assert_eq!(decision.verdict, Verdict::Allow);
    assert_eq!(decision.reason.as_str(), "token_issued");
    assert!(token.secret.starts_with("wdn_") && token.secret.len() == 68);
    assert_eq!(count(&engine).await, before + 1);
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "token.issue");
    assert_eq!(entry.draft.resource, "researcher");
    assert_eq!(entry.draft.subject, Caller::OPERATOR);
    assert_eq!(entry.draft.reason, "token_issued");
    assert_eq!(entry.draft.details["token_id"], token.token_id.as_str());
    assert!(!entry.draft.details.to_string().contains(&token.secret));
    let stored = engine
        .store()
        .find_token(hash_token(&token.secret))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.token_id, token.token_id);
    assert_eq!(stored.subject, TokenSubject::Agent(id("researcher")));
    assert!(!format!("{stored:?}").contains(&token.secret[4..]));

    assert_eq!(
        engine.authenticate(&token.secret, ROUTE).await.unwrap(),
        Authentication::Agent(id("researcher"))
    );
    // Authenticating records nothing.
    assert_eq!(count(&engine).await, before + 1);
}

#[tokio::test]
async fn a_revoked_token_is_refused_and_its_revocation_recorded_once() {
    let engine = lab().await;
    let token = issue(&engine, "researcher").await;
    let before = count(&engine).await;
    let out = engine
        .revoke_token(&Caller::Operator, &token.token_id)
        .await
        .unwrap();
    let TokenRevocation::Revoked { decision } = out else {
        panic!("expected a revocation, got {out:?}");
    };
    assert_eq!(decision.reason.as_str(), "token_revoked");
    assert_eq!(count(&engine).await, before + 1);
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "token.revoke");
    assert_eq!(entry.draft.resource, token.token_id);
    assert_eq!(entry.draft.verdict, Verdict::Allow);

    assert_eq!(
        engine.authenticate(&token.secret, ROUTE).await.unwrap(),
        Authentication::TokenRevoked
    );
    // Revoking again, an unknown id, or a malformed one: a value, nothing
    // recorded, nothing changed.
    for unknown in [token.token_id.as_str(), "tok_nope", "not an id"] {
        let out = engine
            .revoke_token(&Caller::Operator, unknown)
            .await
            .unwrap();
        assert!(
            matches!(&out, TokenRevocation::Unknown { token_id } if token_id == unknown),
            "{out:?}"
        );
    }
    assert_eq!(count(&engine).await, before + 1);
    // The agent itself stays active: a new token works.
    let fresh = issue(&engine, "researcher").await;
    assert_eq!(
        engine.authenticate(&fresh.secret, ROUTE).await.unwrap(),
        Authentication::Agent(id("researcher"))
    );
}

#[tokio::test]
async fn unknown_and_malformed_tokens_are_invalid_and_not_recorded() {
    let engine = lab().await;
    let before = count(&engine).await;
    let long = "a".repeat(warden::MAX_TOKEN_LEN + 1);
    for secret in ["", "wdn_unknown", "has space", long.as_str()] {
        assert_eq!(
            engine.authenticate(secret, ROUTE).await.unwrap(),
            Authentication::Invalid,
            "{secret}"
        );
    }
    assert_eq!(count(&engine).await, before);
}

#[tokio::test]
async fn a_revoked_agents_token_is_refused_and_the_refusal_recorded() {
    let engine = lab().await;
    let token = issue(&engine, "formatter").await;
    let out = engine
        .revoke_agent(&Caller::Operator, &id("formatter"))
        .await
        .unwrap();
    assert!(matches!(out, Revocation::Revoked { .. }), "{out:?}");
    let before = count(&engine).await;
    let auth = engine.authenticate(&token.secret, ROUTE).await.unwrap();
    let Authentication::AgentRevoked { decision } = &auth else {
        panic!("expected agent_revoked, got {auth:?}");
    };
    assert_eq!(auth.caller(), None);
    assert_eq!(decision.reason.as_str(), "agent_revoked");
    assert_eq!(count(&engine).await, before + 1);
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "auth.request");
    assert_eq!(entry.draft.resource, ROUTE);
    assert_eq!(entry.draft.subject, "formatter");
    assert_eq!(entry.draft.verdict, Verdict::Deny);
    assert_eq!(entry.draft.reason, "agent_revoked");

    // No token is issued for a revoked agent, none for an unknown one;
    // neither is recorded.
    let before = count(&engine).await;
    let out = engine
        .issue_token(&Caller::Operator, TokenSubject::Agent(id("formatter")))
        .await
        .unwrap();
    assert!(
        matches!(&out, TokenIssue::AgentRevoked { agent } if *agent == id("formatter")),
        "{out:?}"
    );
    let err = engine
        .issue_token(&Caller::Operator, TokenSubject::Agent(id("ghost")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::NotFound {
                what: Missing::Agent,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(count(&engine).await, before);
}

#[tokio::test]
async fn the_request_rate_is_throttled_per_agent_recorded_and_refilled_by_the_clock() {
    let (engine, clock) = throttled_lab().await;
    let formatter = issue(&engine, "formatter").await;
    let researcher = issue(&engine, "researcher").await;
    let before = count(&engine).await;
    for _ in 0..2 {
        assert_eq!(
            engine.authenticate(&formatter.secret, ROUTE).await.unwrap(),
            Authentication::Agent(id("formatter"))
        );
    }
    let auth = engine.authenticate(&formatter.secret, ROUTE).await.unwrap();
    let Authentication::Throttled {
        decision,
        requests_per_second,
        retry_after_ms,
        ..
    } = &auth
    else {
        panic!("expected a throttle, got {auth:?}");
    };
    assert_eq!(*requests_per_second, 2);
    assert_eq!(*retry_after_ms, 500);
    assert_eq!(decision.reason.as_str(), "quota_requests_per_second");
    assert_eq!(count(&engine).await, before + 1);
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "auth.request");
    assert_eq!(entry.draft.subject, "formatter");
    assert_eq!(entry.draft.verdict, Verdict::Deny);
    assert_eq!(entry.draft.reason, "quota_requests_per_second");
    // Another agent has its own (here: no) limit.
    for _ in 0..5 {
        assert_eq!(
            engine
                .authenticate(&researcher.secret, ROUTE)
                .await
                .unwrap(),
            Authentication::Agent(id("researcher"))
        );
    }
    clock.advance(500);
    assert_eq!(
        engine.authenticate(&formatter.secret, ROUTE).await.unwrap(),
        Authentication::Agent(id("formatter"))
    );
    assert_eq!(count(&engine).await, before + 1);
}

#[tokio::test]
async fn route_refusals_are_recorded_with_the_route() {
    let engine = lab().await;
    let long_route = format!("GET /{}", "x".repeat(400));
    let decision = engine
        .refuse_route(
            &Caller::Agent(id("researcher")),
            &long_route,
            RouteRefusal::OperatorOnly,
        )
        .await
        .unwrap();
    assert_eq!(decision.reason.as_str(), "operator_only");
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "auth.request");
    assert_eq!(entry.draft.reason, "operator_only");
    assert_eq!(entry.draft.resource.len(), 256);
    assert!(long_route.starts_with(&entry.draft.resource));
    engine
        .refuse_route(&Caller::Operator, ROUTE, RouteRefusal::AgentTokenRequired)
        .await
        .unwrap();
    let entry = last(&engine).await;
    assert_eq!(entry.draft.subject, Caller::OPERATOR);
    assert_eq!(entry.draft.reason, "agent_token_required");
    assert_eq!(entry.draft.resource, ROUTE);
    assert_eq!(entry.draft.verdict, Verdict::Deny);
}

#[tokio::test]
async fn agents_are_visible_to_the_operator_themselves_and_ancestors_only() {
    let engine = lab().await;
    let agent = |s: &str| Caller::Agent(id(s));
    let cases = [
        (Caller::Operator, "formatter", true, "operator"),
        (agent("formatter"), "formatter", true, "self"),
        (agent("report_manager"), "formatter", true, "ancestor"),
        (agent("formatter"), "researcher", false, "not_an_ancestor"),
        (Caller::Operator, "ghost", false, "unknown_agent"),
        (agent("researcher"), "ghost", false, "unknown_agent"),
    ];
    for (caller, target, visible, reason) in cases {
        let before = count(&engine).await;
        let out = engine.read_agent(&caller, &id(target)).await.unwrap();
        let decision = match &out {
            AgentRead::Visible { agent, decision } => {
                assert!(visible, "{caller} saw {target}");
                assert_eq!(agent.agent_id, id(target));
                decision
            }
            AgentRead::Hidden { decision } => {
                assert!(!visible, "{caller} did not see {target}");
                decision
            }
        };
        assert_eq!(decision.reason.as_str(), reason);
        assert_eq!(count(&engine).await, before + 1);
        let entry = last(&engine).await;
        assert_eq!(entry.draft.operation, "agent.read");
        assert_eq!(entry.draft.resource, target);
        assert_eq!(entry.draft.reason, reason);
        let verdict = if visible {
            Verdict::Allow
        } else {
            Verdict::Deny
        };
        assert_eq!(entry.draft.verdict, verdict);

        // Before another operation, only a hidden agent is recorded.
        let before = count(&engine).await;
        let out = engine
            .agent_visibility(&caller, &id(target), "agent.revoke")
            .await
            .unwrap();
        match out {
            AgentVisibility::Visible { reason: r } => {
                assert!(visible);
                assert_eq!(r.as_str(), reason);
                assert_eq!(count(&engine).await, before);
            }
            AgentVisibility::Hidden { decision } => {
                assert!(!visible);
                assert_eq!(decision.reason.as_str(), reason);
                assert_eq!(count(&engine).await, before + 1);
                let entry = last(&engine).await;
                assert_eq!(entry.draft.operation, "agent.revoke");
                assert_eq!(entry.draft.verdict, Verdict::Deny);
            }
        }
    }
    assert_eq!(verify(&engine).await, count(&engine).await);
}

#[tokio::test]
async fn a_missing_run_is_not_found_and_not_recorded() {
    let engine = lab().await;
    let before = count(&engine).await;
    let run = warden_core::ids::RunId::parse("no-such-run").unwrap();
    let err = engine
        .run_visibility(
            &Caller::Agent(id("researcher")),
            &run,
            "context.export",
            warden::RunAccess::Owner,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::NotFound {
                what: Missing::Run,
                ..
            }
        ),
        "{err}"
    );
    let err = engine
        .read_envelope(&Caller::Operator, &run)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::NotFound { .. }), "{err}");
    assert_eq!(count(&engine).await, before);
}

#[tokio::test]
async fn the_operator_token_is_generated_once_or_taken_from_the_environment() {
    let engine = lab().await;
    let first = engine.ensure_operator_token(None).await.unwrap();
    let OperatorTokenSource::Generated(secret) = first else {
        panic!("expected a generated token, got {first:?}");
    };
    assert_eq!(
        engine.authenticate(&secret, ROUTE).await.unwrap(),
        Authentication::Operator
    );
    let before = count(&engine).await;
    assert_eq!(
        engine.ensure_operator_token(None).await.unwrap(),
        OperatorTokenSource::Existing
    );
    assert_eq!(count(&engine).await, before);

    assert!(matches!(
        engine.ensure_operator_token(Some("short")).await,
        Err(OperatorTokenError::TooShort(5))
    ));
    assert!(matches!(
        engine
            .ensure_operator_token(Some("has a space in it 0123456789abcdefgh"))
            .await,
        Err(OperatorTokenError::BadCharacters)
    ));
    assert_eq!(count(&engine).await, before);
    assert_eq!(
        engine.ensure_operator_token(Some(ENV_TOKEN)).await.unwrap(),
        OperatorTokenSource::Environment
    );
    assert_eq!(count(&engine).await, before + 1);
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "token.issue");
    assert_eq!(entry.draft.resource, Caller::OPERATOR);
    assert_eq!(
        engine.authenticate(ENV_TOKEN, ROUTE).await.unwrap(),
        Authentication::Operator
    );
    // The same token on the next start: nothing new.
    assert_eq!(
        engine.ensure_operator_token(Some(ENV_TOKEN)).await.unwrap(),
        OperatorTokenSource::Environment
    );
    assert_eq!(count(&engine).await, before + 1);

    // An agent's token cannot become the operator's; a revoked operator
    // token cannot come back.
    let agent = issue(&engine, "researcher").await;
    assert!(matches!(
        engine.ensure_operator_token(Some(&agent.secret)).await,
        Err(OperatorTokenError::NotOperator)
    ));
    let stored = engine
        .store()
        .find_token(hash_token(ENV_TOKEN))
        .await
        .unwrap()
        .unwrap();
    engine
        .revoke_token(&Caller::Operator, &stored.token_id)
        .await
        .unwrap();
    let before = count(&engine).await;
    assert!(matches!(
        engine.ensure_operator_token(Some(ENV_TOKEN)).await,
        Err(OperatorTokenError::Revoked)
    ));
    assert_eq!(count(&engine).await, before);
}

#[tokio::test]
async fn the_audit_log_pages_and_verifies_through_the_engine() {
    let engine = lab().await;
    issue(&engine, "researcher").await;
    let head = engine.audit_head().await.unwrap();
    assert!(head.count >= 2);
    let all = engine.audit_page(0, usize::MAX).await.unwrap();
    assert_eq!(all.len() as u64, head.count);
    let page = engine.audit_page(1, 1).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].seq, 2);
    let report = engine.verify_audit().await.unwrap();
    assert!(report.is_valid(), "{report:?}");
    assert_eq!(report.head, head);
}

#[tokio::test]
async fn runs_and_their_envelopes_are_visible_to_their_agent_the_operator_and_ancestors_where_allowed()
 {
    use warden::{Admission, EnvelopeRead, RunAccess, RunVisibility};
    let engine = lab().await;
    let s = sop(
        &engine,
        &serde_json::json!({"sop_id": "notes", "version": 1, "steps": [
            {"step_id": "save", "action": "artifact.save",
             "arguments": {"path": "internal/notes.txt"}}
        ]})
        .to_string(),
    );
    let run = warden_core::ids::RunId::parse("run-1").unwrap();
    let admitted = engine
        .admit_run(&id("researcher"), &s, Some(run.clone()))
        .await
        .unwrap();
    assert!(
        matches!(admitted, Admission::Admitted { .. }),
        "{admitted:?}"
    );

    let agent = |s: &str| Caller::Agent(id(s));
    for (caller, access, visible) in [
        (agent("researcher"), RunAccess::Owner, true),
        (Caller::Operator, RunAccess::Owner, true),
        (agent("report_manager"), RunAccess::OwnerOrAncestor, true),
        (agent("report_manager"), RunAccess::Owner, false),
        (agent("formatter"), RunAccess::OwnerOrAncestor, false),
    ] {
        let before = count(&engine).await;
        let out = engine
            .run_visibility(&caller, &run, "context.export", access)
            .await
            .unwrap();
        match out {
            RunVisibility::Visible(r) => {
                assert!(visible, "{caller} saw the run under {access:?}");
                assert_eq!(r.run_id, run);
                assert_eq!(count(&engine).await, before);
            }
            RunVisibility::Hidden { decision } => {
                assert!(!visible, "{caller} did not see the run under {access:?}");
                assert_eq!(decision.reason.as_str(), "not_run_agent");
                assert_eq!(count(&engine).await, before + 1);
                let entry = last(&engine).await;
                assert_eq!(entry.draft.operation, "context.export");
                assert_eq!(entry.draft.resource, "run-1");
                assert_eq!(entry.draft.verdict, Verdict::Deny);
                assert_eq!(entry.draft.subject, caller.to_string());
            }
        }
    }

    // Reading the envelope: recorded with the run, version and
    // classification; an ancestor may not read it.
    let before = count(&engine).await;
    let out = engine
        .read_envelope(&agent("researcher"), &run)
        .await
        .unwrap();
    let EnvelopeRead::Read { envelope, decision } = out else {
        panic!("expected the envelope");
    };
    assert_eq!(decision.reason.as_str(), "envelope_read");
    assert_eq!(count(&engine).await, before + 1);
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "context.read");
    assert_eq!(entry.draft.resource, envelope.envelope_id.to_string());
    assert_eq!(entry.draft.details["run_id"], "run-1");
    assert_eq!(entry.draft.details["envelope_version"], envelope.version);
    let out = engine
        .read_envelope(&agent("report_manager"), &run)
        .await
        .unwrap();
    let EnvelopeRead::Hidden { decision } = out else {
        panic!("an ancestor read the envelope");
    };
    assert_eq!(decision.reason.as_str(), "not_run_agent");
    let entry = last(&engine).await;
    assert_eq!(entry.draft.operation, "context.read");
    assert_eq!(entry.draft.verdict, Verdict::Deny);
    assert_eq!(count(&engine).await, before + 2);
}

/// A token found active is cached: a revocation made in the store behind
/// the engine's back (as another engine sharing the store would) is not
/// seen until the engine forgets the token (the change feed) or all
/// tokens (the reconcile); one made through the engine is refused at
/// once. The cache never holds a revoked token.
#[tokio::test]
async fn tokens_are_cached_until_revoked_here_or_forgotten() {
    let engine = lab().await;
    let [a, b, c] = [
        issue(&engine, "researcher").await,
        issue(&engine, "researcher").await,
        issue(&engine, "formatter").await,
    ];
    assert_eq!(engine.cached_tokens(), 0);
    for t in [&a, &b, &c] {
        assert!(matches!(
            engine.authenticate(&t.secret, ROUTE).await.unwrap(),
            Authentication::Agent(_)
        ));
    }
    assert_eq!(engine.cached_tokens(), 3);

    // Behind the engine's back: still cached, still accepted.
    for t in [&a, &b] {
        assert!(
            engine
                .store()
                .revoke_token(t.token_id.clone(), Vec::new())
                .await
                .unwrap()
        );
    }
    assert_eq!(
        engine.authenticate(&a.secret, ROUTE).await.unwrap(),
        Authentication::Agent(id("researcher"))
    );
    // Forgetting one token (and an unknown id) drops only that one.
    engine.forget_tokens(&[a.token_id.as_str(), "tok_unknown"]);
    assert_eq!(engine.cached_tokens(), 2);
    assert_eq!(
        engine.authenticate(&a.secret, ROUTE).await.unwrap(),
        Authentication::TokenRevoked
    );
    assert_eq!(
        engine.authenticate(&b.secret, ROUTE).await.unwrap(),
        Authentication::Agent(id("researcher"))
    );
    // Forgetting all: the other revocation is seen; the revoked tokens are
    // not cached, the active one is cached again on its next use.
    engine.forget_all_tokens();
    assert_eq!(engine.cached_tokens(), 0);
    assert_eq!(
        engine.authenticate(&b.secret, ROUTE).await.unwrap(),
        Authentication::TokenRevoked
    );
    assert_eq!(
        engine.authenticate(&c.secret, ROUTE).await.unwrap(),
        Authentication::Agent(id("formatter"))
    );
    assert_eq!(engine.cached_tokens(), 1);

    // Through the engine: refused at once, whatever was cached.
    let out = engine
        .revoke_token(&Caller::Operator, &c.token_id)
        .await
        .unwrap();
    assert!(matches!(out, TokenRevocation::Revoked { .. }), "{out:?}");
    assert_eq!(engine.cached_tokens(), 0);
    assert_eq!(
        engine.authenticate(&c.secret, ROUTE).await.unwrap(),
        Authentication::TokenRevoked
    );
    assert_eq!(engine.cached_tokens(), 0);
}
