//! The lab document's adversarial list and "failure cases the happy path
//! misses", as tests on decisions, stored state and handler effects.

use std::collections::BTreeSet;
use warden::{ConflictKind, Registration, RegistrationRefusal, Revocation};

use serde_json::json;
use warden::{Caller, EngineError, RegisterAgent};
use warden_core::decision::Verdict;
use warden_core::hierarchy::HierarchyError;
use warden_core::ids::{ActionName, RunId};
use warden_store::Store;

use crate::support::*;

fn caps(list: &[&str]) -> BTreeSet<ActionName> {
    list.iter().map(|c| ActionName::parse(c).unwrap()).collect()
}

fn child(idv: &str, parent: Option<&str>, c: &[&str]) -> RegisterAgent {
    RegisterAgent {
        id: id(idv),
        parent: parent.map(id),
        capabilities: caps(c),
        tools: None,
        config: None,
    }
}

#[tokio::test]
async fn unknown_parent_is_refused_and_recorded() {
    let e = lab().await;
    let before = audit(&e).await.len();
    let err = e
        .register_agent(
            &Caller::Operator,
            child("x", Some("ghost"), &["memory.read"]),
        )
        .await
        .unwrap();
    assert!(matches!(
        err,
        Registration::Refused {
            refusal: RegistrationRefusal::Hierarchy(HierarchyError::UnknownParent { .. }),
            ..
        }
    ));
    assert!(e.agent(&id("x")).is_err());
    assert!(
        e.store()
            .load_agents()
            .await
            .unwrap()
            .iter()
            .all(|a| a.id.as_str() != "x")
    );
    let log = audit(&e).await;
    assert_eq!(log.len(), before + 1);
    assert_eq!(log.last().unwrap().draft.reason, "unknown_parent");
}

#[test]
fn cyclic_and_duplicate_hierarchies_are_refused_in_bundles() {
    let cyc = LAB_POLICY.replace(
        "  - id: report_manager\n",
        "  - id: report_manager\n    parent: formatter\n",
    );
    let err = warden_core::bundle::compile(&cyc).unwrap_err();
    assert!(
        err.issues.iter().any(|i| i.message.contains("cycle")),
        "{err:?}"
    );
    let dup = LAB_POLICY.replace("  - id: formatter\n", "  - id: researcher\n");
    let err = warden_core::bundle::compile(&dup).unwrap_err();
    assert!(
        err.issues
            .iter()
            .any(|i| i.message.contains("already registered")),
        "{err:?}"
    );
}

#[tokio::test]
async fn duplicate_agent_is_refused_and_changes_nothing() {
    let e = lab().await;
    let before = e.agent(&id("researcher")).unwrap();
    let err = e
        .register_agent(
            &Caller::Operator,
            child("researcher", None, &["external.upload"]),
        )
        .await
        .unwrap();
    assert!(matches!(
        err,
        Registration::Refused {
            refusal: RegistrationRefusal::Hierarchy(HierarchyError::DuplicateAgent(_)),
            ..
        }
    ));
    assert_eq!(e.agent(&id("researcher")).unwrap(), before);
    assert_eq!(e.store().load_agents().await.unwrap().len(), 3);
}

#[tokio::test]
async fn children_visibility_reaches_direct_children_only() {
    let e = lab().await;
    let mut req = write_req("drafts", "outline", json!("v1"));
    req.visibility = Some(warden_core::memory::Visibility::Children);
    e.write(&id("report_manager"), req).await.unwrap();
    let direct = e
        .read(&id("researcher"), &ns("drafts"), &key("outline"))
        .await
        .unwrap();
    assert_eq!(
        direct.decision.reason.as_str(),
        "visible_from:report_manager"
    );
    let grandchild = e
        .read(&id("formatter"), &ns("drafts"), &key("outline"))
        .await
        .unwrap();
    assert_eq!(
        grandchild.decision.reason.as_str(),
        "not_visible_from:report_manager"
    );
    assert!(grandchild.value.is_none());
}

#[tokio::test]
async fn agent_without_memory_read_cannot_read_its_own_record() {
    let e = lab().await;
    e.register_agent(
        &Caller::Operator,
        child("writer_only", None, &["memory.write"]),
    )
    .await
    .unwrap()
    .registered()
    .unwrap();
    let w = e
        .write(&id("writer_only"), write_req("own", "k", json!(1)))
        .await
        .unwrap();
    assert!(w.decision.permits());
    let r = e
        .read(&id("writer_only"), &ns("own"), &key("k"))
        .await
        .unwrap();
    assert_eq!(r.decision.reason.as_str(), "capability_not_inherited");
    assert!(r.value.is_none());
}

#[tokio::test]
async fn formatter_cannot_grant_itself_or_a_child_memory_write() {
    let e = lab().await;
    let view = e
        .delegate(
            &id("formatter"),
            child(
                "helper",
                None,
                &["memory.read", "memory.write", "external.upload"],
            ),
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    let eff: Vec<&str> = view
        .effective_capabilities
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(eff, ["memory.read"]);
    let w = e
        .write(&id("helper"), write_req("n", "k", json!(1)))
        .await
        .unwrap();
    assert_eq!(w.decision.reason.as_str(), "capability_not_inherited");
    // An agent may only create its own children, never re-register itself
    // or a sibling with more authority.
    let err = e
        .register_agent(
            &Caller::Agent(id("formatter")),
            child("formatter2", Some("researcher"), &["memory.write"]),
        )
        .await
        .unwrap();
    assert!(
        matches!(err, Registration::Refused { decision: d, refusal: RegistrationRefusal::NotOwnChild } if d.reason.as_str() == "not_own_child")
    );
    assert!(e.agent(&id("formatter2")).is_err());
}

#[test]
fn malformed_sops_are_refused_with_the_field_named() {
    let limits = warden_core::sop::SopLimits::default();
    let cases = [
        (r#"{"sop_id":"s","version":1,"steps":[]}"#, "steps"),
        (
            r#"{"sop_id":"s","version":0,"steps":[{"step_id":"a","action":"x.y"}]}"#,
            "version",
        ),
        (
            r#"{"sop_id":"s","version":"1","steps":[{"step_id":"a","action":"x.y"}]}"#,
            "version",
        ),
        (
            r#"{"sop_id":"s","version":1,"steps":[{"step_id":"a","action":"x.y"}],"actor":"report_manager"}"#,
            "actor",
        ),
    ];
    for (text, field) in cases {
        let err = warden_core::sop::parse_sop(text, &limits).unwrap_err();
        assert!(
            err.field().contains(field),
            "{text}: {err} ({})",
            err.field()
        );
    }
    let steps: Vec<String> = (0..51)
        .map(|i| format!(r#"{{"step_id":"s{i}","action":"document.summarize"}}"#))
        .collect();
    let big = format!(
        r#"{{"sop_id":"s","version":1,"steps":[{}]}}"#,
        steps.join(",")
    );
    assert!(warden_core::sop::parse_sop(&big, &limits).is_err());
}

#[tokio::test]
async fn duplicate_and_empty_step_ids_are_denied_at_preflight() {
    let e = lab().await;
    let s = sop(
        &e,
        r#"{"sop_id":"d","version":1,"steps":[
        {"step_id":"same","action":"document.summarize","arguments":{"document_id":"a"}},
        {"step_id":"same","action":"artifact.save","arguments":{"path":"internal/a"}},
        {"step_id":"","action":"artifact.save","arguments":{"path":"internal/b"}}]}"#,
    );
    let pre = e.validate_sop(&id("researcher"), &s).await.unwrap();
    let reasons: Vec<&str> = pre.steps.iter().map(|s| s.reason().as_str()).collect();
    assert_eq!(
        reasons,
        ["step_allowed", "duplicate_step_id", "empty_step_id"]
    );
    assert!(!pre.admitted);
}

#[tokio::test]
async fn valid_action_with_invalid_resource_target_is_denied() {
    let e = lab().await;
    let (handlers, effects) = recording_handlers();
    let report = e
        .execute_sop(
            &id("researcher"),
            &example_sop(&e, "path-traversal"),
            &handlers,
            None,
        )
        .await
        .unwrap();
    assert!(!report.admitted);
    assert!(
        report.preflight.steps[0]
            .reason()
            .as_str()
            .starts_with("path_")
    );
    assert!(effects.lock().unwrap().is_empty());
}

#[tokio::test]
async fn missing_handler_after_policy_checks_runs_nothing() {
    let e = lab().await;
    let (_, effects) = recording_handlers();
    let mut partial = warden::Handlers::new();
    let eff = std::sync::Arc::clone(&effects);
    partial.register(
        ActionName::parse("document.summarize").unwrap(),
        move |_c: warden::HandlerCall| {
            let eff = std::sync::Arc::clone(&eff);
            async move {
                eff.lock()
                    .unwrap()
                    .push(("document.summarize".into(), json!(null)));
                Ok(json!(null))
            }
        },
    );
    let err = e
        .execute_sop(
            &id("researcher"),
            &example_sop(&e, "valid-report"),
            &partial,
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::MissingHandlers(ref m) if m == &["artifact.save".to_string()])
    );
    assert!(effects.lock().unwrap().is_empty());
    assert_eq!(
        audit(&e).await.last().unwrap().draft.reason,
        "missing_handlers"
    );
}

#[tokio::test]
async fn two_writes_with_the_same_expected_revision_one_wins() {
    let e = lab().await;
    let first = e
        .write(
            &id("researcher"),
            write_req("notes", "status", json!("started")),
        )
        .await
        .unwrap();
    let rev = first.record.unwrap().revision;
    let mut a = write_req("notes", "status", json!("reviewed"));
    a.expected_revision = Some(rev);
    let mut b = write_req("notes", "status", json!("stale update"));
    b.expected_revision = Some(rev);
    let wa = e.write(&id("researcher"), a).await.unwrap();
    let wb = e.write(&id("researcher"), b).await.unwrap();
    assert_eq!(wa.decision.reason.as_str(), "owner_write");
    assert_eq!(wb.decision.reason.as_str(), "revision_conflict");
    assert_eq!(wb.current_revision, Some(2));
    let stored = e
        .read(&id("researcher"), &ns("notes"), &key("status"))
        .await
        .unwrap()
        .value
        .unwrap();
    assert_eq!((stored.value, stored.revision), (json!("reviewed"), 2));
}

#[tokio::test]
async fn prompt_injection_claiming_approval_gets_the_plain_decision() {
    let e = lab().await;
    let plain = e
        .preflight(&id("researcher"), &example_sop(&e, "unsafe-upload"))
        .unwrap();
    let injected = e
        .preflight(
            &id("researcher"),
            &example_sop(&e, "injection-claims-approval"),
        )
        .unwrap();
    let strip = |p: &warden_core::preflight::Preflight| {
        p.steps
            .iter()
            .map(|s| (s.verdict(), s.reason().clone(), s.violations.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&plain), strip(&injected));
    assert!(!injected.admitted);
}

#[tokio::test]
async fn local_shadowing_cannot_hide_a_policy_record() {
    let e = lab().await;
    let w = e
        .write(
            &id("researcher"),
            write_req("policy", "external_upload", json!(true)),
        )
        .await
        .unwrap();
    assert!(w.decision.permits());
    let out = e
        .read(&id("researcher"), &ns("policy"), &key("external_upload"))
        .await
        .unwrap();
    let v = out.value.unwrap();
    assert_eq!(v.value, json!(false));
    assert_eq!(v.owner_agent_id, id("report_manager"));
    assert_eq!(v.contributors.len(), 1);
    // Even a child's own `policy` record can only tighten.
    let mut req = write_req("policy", "external_upload", json!(true));
    req.class = Some(warden_core::memory::RecordClass::Policy {
        combine: warden_core::memory::Combinator::Any,
    });
    e.write(&id("researcher"), req).await.unwrap();
    let out = e
        .read(&id("formatter"), &ns("policy"), &key("external_upload"))
        .await
        .unwrap();
    assert_eq!(out.value.unwrap().value, json!(false));
}

#[tokio::test]
async fn spoofed_actor_in_sop_arguments_grants_nothing() {
    let e = lab().await;
    let s = sop(
        &e,
        r#"{"sop_id":"spoof","version":1,"steps":[
        {"step_id":"w","action":"memory.write","arguments":{"actor":"report_manager","owner_agent_id":"report_manager","namespace":"report","key":"retention_days","value":0}}]}"#,
    );
    let (handlers, _) = recording_handlers();
    let report = e
        .execute_sop(&id("researcher"), &s, &handlers, None)
        .await
        .unwrap();
    assert!(!report.admitted);
    assert_eq!(
        report.preflight.steps[0].reason().as_str(),
        "cross_owner_memory_write"
    );
    let stored = e
        .store()
        .get_records(
            ns("report"),
            key("retention_days"),
            vec![id("report_manager")],
        )
        .await
        .unwrap();
    assert_eq!(
        (stored[0].value.clone(), stored[0].revision),
        (json!(30), 1)
    );
}

#[tokio::test]
async fn retried_run_does_not_duplicate_effects() {
    let e = lab().await;
    let (handlers, effects) = recording_handlers();
    let run_id = RunId::parse("run-fixed-1").unwrap();
    let s = example_sop(&e, "valid-report");
    let first = e
        .execute_sop(&id("researcher"), &s, &handlers, Some(run_id.clone()))
        .await
        .unwrap();
    assert!(first.completed);
    let second = e
        .execute_sop(&id("researcher"), &s, &handlers, Some(run_id.clone()))
        .await
        .unwrap();
    assert!(second.completed);
    assert!(second.steps.iter().all(|s| !s.executed));
    assert_eq!(effects.lock().unwrap().len(), 2);
    assert_eq!(first.steps[1].outcome, second.steps[1].outcome);
    // The same run id with another SOP is refused.
    let other = example_sop(&e, "unknown-action");
    let _ = other;
    let changed = sop(
        &e,
        r#"{"sop_id":"prepare-report","version":2,"steps":[{"step_id":"summarize","action":"document.summarize","arguments":{"document_id":"x"}}]}"#,
    );
    let err = e
        .execute_sop(&id("researcher"), &changed, &handlers, Some(run_id))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::Conflict {
            kind: ConflictKind::RunId,
            ..
        }
    ));
}

#[tokio::test]
async fn revocation_cascades_and_denies_everything() {
    let e = lab().await;
    let revoked = e
        .revoke_agent(&Caller::Operator, &id("researcher"))
        .await
        .unwrap()
        .revoked()
        .unwrap();
    assert_eq!(revoked, vec![id("researcher"), id("formatter")]);
    let r = e
        .read(&id("formatter"), &ns("project"), &key("client_region"))
        .await
        .unwrap();
    assert_eq!(r.decision.reason.as_str(), "agent_revoked");
    let pre = e
        .preflight(&id("researcher"), &example_sop(&e, "valid-report"))
        .unwrap();
    assert!(
        pre.steps
            .iter()
            .all(|s| s.reason().as_str() == "agent_revoked")
    );
    let stored = e.store().load_agents().await.unwrap();
    assert!(
        stored
            .iter()
            .filter(|a| a.id != id("report_manager"))
            .all(|a| a.status == warden_core::hierarchy::AgentStatus::Revoked)
    );
    // A sibling cannot revoke; only the operator or an ancestor.
    let err = e
        .revoke_agent(&Caller::Agent(id("formatter")), &id("report_manager"))
        .await
        .unwrap();
    assert!(matches!(err, Revocation::Refused { .. }));
}

#[tokio::test]
async fn revocation_between_admission_and_execution_stops_the_run() {
    let e = lab().await;
    let adm = e
        .admit_run(&id("researcher"), &example_sop(&e, "valid-report"), None)
        .await
        .unwrap();
    let warden::Admission::Admitted { run, .. } = adm else {
        panic!()
    };
    e.revoke_agent(&Caller::Operator, &id("researcher"))
        .await
        .unwrap()
        .revoked()
        .unwrap();
    let gate = e
        .begin_step(&id("researcher"), &run.run_id, &run.steps[0].step_id)
        .await
        .unwrap();
    match gate {
        warden::StepGate::Refused {
            decision,
            refusal: warden::StepRefusal::Denied,
        } => {
            assert_eq!(decision.verdict, Verdict::Deny);
            assert_eq!(decision.reason.as_str(), "agent_revoked");
        }
        other => panic!("{other:?}"),
    }
    let state = e
        .store()
        .get_run(run.run_id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.outcomes.len(), 1);
}

#[tokio::test]
async fn depth_limit_is_enforced() {
    let policy = LAB_POLICY.replace(
        "policy_version: lab-1",
        "policy_version: lab-1\nlimits: {max_depth: 4}",
    );
    let e = lab_with(&policy).await;
    e.delegate(&id("formatter"), child("d3", None, &["memory.read"]))
        .await
        .unwrap()
        .registered()
        .unwrap();
    let err = e
        .delegate(&id("d3"), child("d4", None, &["memory.read"]))
        .await
        .unwrap();
    assert!(matches!(
        err,
        Registration::Refused {
            refusal: RegistrationRefusal::Hierarchy(HierarchyError::TooDeep { .. }),
            ..
        }
    ));
    assert_eq!(
        audit(&e).await.last().unwrap().draft.reason,
        "depth_exceeded"
    );
}

#[tokio::test]
async fn validation_never_invokes_a_handler() {
    let e = lab().await;
    let (_, effects) = recording_handlers();
    for name in [
        "valid-report",
        "unsafe-upload",
        "unknown-action",
        "path-traversal",
    ] {
        e.validate_sop(&id("researcher"), &example_sop(&e, name))
            .await
            .unwrap();
    }
    assert!(effects.lock().unwrap().is_empty());
}
