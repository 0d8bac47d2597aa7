//! Properties of sessions through the engine: a value found only in
//! untrusted results never satisfies `from: [user, trusted]`; a restart or
//! a second engine on the same store decides every call the same; the
//! session's envelope only grows across calls and into a child delegated
//! from it.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};
use warden::{
    CallResult, Caller, DelegationOptions, Engine, ManualClock, OpenSession, ProposedCall,
    RegisterAgent,
};
use warden_core::decision::Verdict;
use warden_core::ids::{CallId, Label, SessionId};
use warden_core::time::Timestamp;
use warden_store::Store;

use super::sessions::{SESSION_POLICY, Shared};
use super::support::id;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

async fn engine(store: Shared, policy: &str) -> Engine<Shared> {
    let e = Engine::open(
        warden_core::bundle::compile(policy).unwrap(),
        store,
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap();
    e.set_provenance_secret(b"property tests secret, 32 bytes!")
        .unwrap();
    e
}

fn agent() -> Caller {
    Caller::Agent(id("agent"))
}

async fn open(e: &Engine<Shared>, s: &str, prompt: &str) -> SessionId {
    let sid = SessionId::parse(s).unwrap();
    e.open_session(
        &agent(),
        OpenSession {
            session_id: Some(sid.clone()),
            trusted_inputs: vec![json!(prompt)],
            ..OpenSession::default()
        },
    )
    .await
    .unwrap();
    sid
}

async fn gate(
    e: &Engine<Shared>,
    s: &SessionId,
    c: &str,
    action: &str,
    args: Value,
) -> warden::CallAnswer {
    e.session_call(
        &agent(),
        s,
        ProposedCall {
            call_id: Some(CallId::parse(c).unwrap()),
            action: action.into(),
            arguments: args,
        },
    )
    .await
    .unwrap()
}

async fn record(e: &Engine<Shared>, s: &SessionId, c: &str, result: Value, labels: Vec<Label>) {
    e.record_call_result(
        &agent(),
        s,
        &CallId::parse(c).unwrap(),
        CallResult {
            result,
            labels,
            ..CallResult::default()
        },
    )
    .await
    .unwrap();
}

/// An account-like value: letters then digits, at least 8 characters.
fn account() -> impl Strategy<Value = String> {
    ("[A-Z]{2}", "[0-9]{6,20}").prop_map(|(a, b)| format!("{a}{b}"))
}

/// Filler text that cannot contain an account (no digits).
fn filler() -> impl Strategy<Value = String> {
    "[a-z ,.]{0,60}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_value_only_in_untrusted_results_is_never_vouched(
        attacker in account(),
        before in filler(),
        after in filler(),
        trusted_other in account(),
        spaced in any::<bool>(),
    ) {
        prop_assume!(attacker != trusted_other);
        prop_assume!(!trusted_other.contains(&attacker));
        let rt = rt();
        let verdict = rt.block_on(async {
            let e = engine(Shared::default(), SESSION_POLICY).await;
            let s = open(&e, "p", "pay my bills").await;
            gate(&e, &s, "t", "get_balance", json!({})).await;
            record(&e, &s, "t", json!({"iban": trusted_other}), vec![]).await;
            gate(&e, &s, "u", "read_file", json!({"file_path": "x"})).await;
            let sep = if spaced { " " } else { "\n" };
            record(&e, &s, "u", json!(format!("{before}{sep}{attacker}{sep}{after}")), vec![]).await;
            let a = gate(&e, &s, "pay", "send_money", json!({"recipient": attacker, "amount": 1})).await;
            (a.call.verdict, a.call.detail["provenance"][0]["origins"].clone())
        });
        prop_assert_eq!(verdict.0, Verdict::Escalate);
        prop_assert_eq!(verdict.1, json!(["untrusted"]));
    }

    #[test]
    fn a_restart_and_a_second_engine_decide_every_call_the_same(
        results in proptest::collection::vec((any::<bool>(), account(), filler()), 1..6),
        probes in proptest::collection::vec(account(), 1..4),
    ) {
        let rt = rt();
        rt.block_on(async {
            let store = Shared::default();
            let first = engine(store.clone(), SESSION_POLICY).await;
            let s = open(&first, "p", "pay my bills").await;
            let mut candidates: Vec<String> = probes.clone();
            for (i, (trusted, value, text)) in results.iter().enumerate() {
                let c = format!("r{i}");
                let (action, result) = if *trusted {
                    ("get_balance", json!({"iban": value, "note": text}))
                } else {
                    ("read_file", json!(format!("{text} {value}")))
                };
                let args = if *trusted { json!({}) } else { json!({"file_path": "f"}) };
                gate(&first, &s, &c, action, args).await;
                record(&first, &s, &c, result, vec![]).await;
                candidates.push(value.clone());
            }
            let second = engine(store.clone(), SESSION_POLICY).await;
            for (i, value) in candidates.iter().enumerate() {
                let args = json!({"recipient": value, "amount": 1});
                let a = gate(&first, &s, &format!("a{i}"), "send_money", args.clone()).await;
                let b = gate(&second, &s, &format!("b{i}"), "send_money", args).await;
                assert_eq!(a.call.verdict, b.call.verdict, "{value}");
                assert_eq!(a.call.reason, b.call.reason, "{value}");
                assert_eq!(a.call.detail["provenance"], b.call.detail["provenance"], "{value}");
            }
        });
    }

    #[test]
    fn the_envelope_only_grows_across_calls_and_into_a_child(
        folds in proptest::collection::vec(proptest::collection::vec(0usize..3, 0..3), 1..6),
    ) {
        let policy = format!(
            "{SESSION_POLICY}\ncontext:\n  labels:\n    a: internal\n    b: confidential\n    c: internal\n  aggregation_rules:\n    - {{name: ab, all_labels: [a, b], sensitivity: restricted, restrict: [no_pay]}}\n  restrictions:\n    no_pay: {{denies_tags: [state_changing]}}\n"
        );
        let names = ["a", "b", "c"];
        let rt = rt();
        rt.block_on(async {
            let e = engine(Shared::default(), &policy).await;
            let s = open(&e, "p", "work").await;
            let mut labels: BTreeSet<Label> = BTreeSet::new();
            let mut restrictions: BTreeSet<Label> = BTreeSet::new();
            let mut version = 0;
            let mut sensitivity = warden_core::envelope::Sensitivity::Public;
            for (i, fold) in folds.iter().enumerate() {
                let c = format!("c{i}");
                gate(&e, &s, &c, "read_file", json!({"file_path": "f"})).await;
                let ls: Vec<Label> = fold.iter().map(|k| Label::parse(names[*k]).unwrap()).collect();
                record(&e, &s, &c, json!("text"), ls).await;
                let env = e.session(&agent(), &s).await.unwrap().envelope.unwrap();
                assert!(env.labels.is_superset(&labels));
                assert!(env.restrictions.is_superset(&restrictions));
                assert!(env.aggregate_sensitivity >= sensitivity);
                assert!(env.version >= version);
                labels = env.labels.clone();
                restrictions = env.restrictions.clone();
                sensitivity = env.aggregate_sensitivity;
                version = env.version;
            }
            // Once `no_pay` holds, payments are denied in the session.
            let pay = gate(&e, &s, "pay", "send_money", json!({"recipient": "x", "amount": 1})).await;
            if restrictions.iter().any(|r| r.as_str() == "no_pay") {
                assert_eq!(pay.call.verdict, Verdict::Deny);
            }
            // A child delegated from the session holds at least as much.
            let child = e
                .delegate_with(
                    &id("agent"),
                    RegisterAgent {
                        id: id("child"),
                        parent: Some(id("agent")),
                        capabilities: ["read_file"].iter().map(|a| warden_core::ids::ActionName::parse(a).unwrap()).collect(),
                        tools: None,
                        config: None,
                    },
                    DelegationOptions {
                        from_session: Some(s.clone()),
                        ..DelegationOptions::default()
                    },
                )
                .await
                .unwrap();
            let view = child.registered().expect("registered");
            let env_id = view.envelope_id.expect("child envelope");
            let env = e.store().get_envelope(env_id, None).await.unwrap().unwrap();
            assert!(env.restrictions.is_superset(&restrictions));
            assert!(env.aggregate_sensitivity >= sensitivity);
        });
    }
}
