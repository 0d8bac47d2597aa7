//! The lab document's eight acceptance criteria, each checked against stored
//! state, handler effects and decision records.

use serde_json::json;
use warden_core::decision::Verdict;
use warden_store::Store;

use crate::support::*;

#[tokio::test]
async fn criterion_1_child_reads_visible_parent_memory_with_provenance() {
    let e = lab().await;
    let out = e
        .read(&id("researcher"), &ns("project"), &key("client_region"))
        .await
        .unwrap();
    let v = out.value.unwrap();
    assert_eq!(v.value, json!("EU"));
    assert_eq!(v.owner_agent_id, id("report_manager"));
    assert_eq!(v.revision, 1);
    let last = audit(&e).await.pop().unwrap();
    assert_eq!(last.draft.verdict, Verdict::Allow);
    assert_eq!(last.draft.reason, "visible_from:report_manager");
    assert_eq!(last.draft.subject, "researcher");
}

#[tokio::test]
async fn criterion_2_formatter_reads_descendant_memory_but_cannot_write() {
    let e = lab().await;
    let out = e
        .read(&id("formatter"), &ns("report"), &key("retention_days"))
        .await
        .unwrap();
    assert_eq!(out.value.unwrap().value, json!(30));
    let w = e
        .write(&id("formatter"), write_req("notes", "x", json!(1)))
        .await
        .unwrap();
    assert_eq!(w.decision.reason.as_str(), "capability_not_inherited");
    assert!(w.record.is_none());
    let stored = e
        .store()
        .get_records(ns("notes"), key("x"), vec![id("formatter")])
        .await
        .unwrap();
    assert!(stored.is_empty());
    let view = e.agent(&id("formatter")).unwrap();
    assert!(
        !view
            .effective_capabilities
            .iter()
            .any(|c| c.as_str() == "memory.write")
    );
    let last = audit(&e).await.pop().unwrap();
    assert_eq!(
        (last.draft.verdict, last.draft.reason.as_str()),
        (Verdict::Deny, "capability_not_inherited")
    );
}

#[tokio::test]
async fn criterion_3_private_token_is_not_returned_to_descendants() {
    let e = lab().await;
    for agent in ["researcher", "formatter"] {
        let out = e
            .read(&id(agent), &ns("credentials"), &key("storage_token"))
            .await
            .unwrap();
        assert!(out.value.is_none());
        assert_eq!(out.decision.verdict, Verdict::Deny);
        assert_eq!(
            out.decision.reason.as_str(),
            "not_visible_from:report_manager"
        );
    }
    // The owner can read it; the secret never enters the log.
    let own = e
        .read(
            &id("report_manager"),
            &ns("credentials"),
            &key("storage_token"),
        )
        .await
        .unwrap();
    assert_eq!(own.value.unwrap().value, json!("test-only-placeholder"));
    let log = serde_json::to_string(&audit(&e).await).unwrap();
    assert!(!log.contains("test-only-placeholder"));
}

#[tokio::test]
async fn criterion_4_researcher_writes_its_own_note() {
    let e = lab().await;
    let mut req = write_req("notes", "summary", json!("Draft is ready"));
    req.visibility = Some(warden_core::memory::Visibility::Children);
    let w = e.write(&id("researcher"), req).await.unwrap();
    assert_eq!(w.decision.reason.as_str(), "owner_write");
    let stored = e
        .store()
        .get_records(ns("notes"), key("summary"), vec![id("researcher")])
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].revision, &stored[0].owner),
        (1, &id("researcher"))
    );
    let seen = e
        .read(&id("formatter"), &ns("notes"), &key("summary"))
        .await
        .unwrap();
    assert_eq!(seen.value.unwrap().owner_agent_id, id("researcher"));
}

#[tokio::test]
async fn criterion_5_write_to_manager_data_is_denied_and_changes_nothing() {
    let e = lab().await;
    let before = e
        .store()
        .get_records(
            ns("report"),
            key("retention_days"),
            vec![id("report_manager")],
        )
        .await
        .unwrap();
    let mut req = write_req("report", "retention_days", json!(0));
    req.owner_agent_id = Some(id("report_manager"));
    req.expected_revision = Some(1);
    let w = e.write(&id("researcher"), req).await.unwrap();
    assert_eq!(w.decision.reason.as_str(), "actor_is_not_owner");
    let after = e
        .store()
        .get_records(
            ns("report"),
            key("retention_days"),
            vec![id("report_manager")],
        )
        .await
        .unwrap();
    assert_eq!(before, after);
    assert_eq!((after[0].value.clone(), after[0].revision), (json!(30), 1));
    let denials = audit(&e)
        .await
        .into_iter()
        .filter(|a| a.draft.reason == "actor_is_not_owner")
        .count();
    assert_eq!(denials, 1);
}

#[tokio::test]
async fn criterion_6_unsafe_upload_sop_has_zero_effects() {
    let e = lab().await;
    let (handlers, effects) = recording_handlers();
    let report = e
        .execute_sop(
            &id("researcher"),
            &example_sop(&e, "unsafe-upload"),
            &handlers,
            None,
        )
        .await
        .unwrap();
    assert!(!report.admitted);
    assert!(effects.lock().unwrap().is_empty());
    let reasons: Vec<&str> = report
        .preflight
        .steps
        .iter()
        .map(|s| s.reason().as_str())
        .collect();
    assert_eq!(
        reasons,
        [
            "step_allowed",
            "step_allowed",
            "action_not_in_effective_capabilities"
        ]
    );
    // No run was created.
    let log = audit(&e).await;
    assert!(log.iter().any(|a| a.draft.reason == "run_rejected"));
    assert!(!log.iter().any(|a| a.draft.reason == "run_admitted"));
}

#[tokio::test]
async fn criterion_6b_valid_sop_executes_all_steps() {
    let e = lab().await;
    let (handlers, effects) = recording_handlers();
    let report = e
        .execute_sop(
            &id("researcher"),
            &example_sop(&e, "valid-report"),
            &handlers,
            None,
        )
        .await
        .unwrap();
    assert!(report.admitted && report.completed);
    let effects = effects.lock().unwrap();
    assert_eq!(effects.len(), 2);
    assert_eq!(effects[0].0, "document.summarize");
    assert_eq!(effects[0].1, json!({"document_id": "fixture-1"}));
    assert_eq!(effects[1].1, json!({"path": "internal/report.txt"}));
}

#[tokio::test]
async fn criterion_7_unknown_action_fails_closed() {
    let e = lab().await;
    let (handlers, effects) = recording_handlers();
    let report = e
        .execute_sop(
            &id("researcher"),
            &example_sop(&e, "unknown-action"),
            &handlers,
            None,
        )
        .await
        .unwrap();
    assert!(!report.admitted);
    assert_eq!(
        report.preflight.steps[0].reason().as_str(),
        "unknown_action"
    );
    assert!(effects.lock().unwrap().is_empty());
}

#[tokio::test]
async fn criterion_8_every_decision_has_subject_resource_reason_and_policy_version() {
    let e = lab().await;
    let _ = e
        .read(&id("researcher"), &ns("project"), &key("client_region"))
        .await
        .unwrap();
    let _ = e
        .read(&id("researcher"), &ns("credentials"), &key("storage_token"))
        .await
        .unwrap();
    let mut req = write_req("report", "retention_days", json!(0));
    req.owner_agent_id = Some(id("report_manager"));
    let _ = e.write(&id("researcher"), req).await.unwrap();
    let _ = e
        .validate_sop(&id("researcher"), &example_sop(&e, "unsafe-upload"))
        .await
        .unwrap();
    let log = audit(&e).await;
    assert!(log.len() >= 6);
    for entry in &log {
        assert!(!entry.draft.subject.is_empty());
        assert!(!entry.draft.operation.is_empty());
        assert!(!entry.draft.resource.is_empty());
        assert!(!entry.draft.reason.is_empty());
        assert_eq!(entry.draft.policy_version, "lab-1");
    }
    let read = log
        .iter()
        .rev()
        .find(|a| a.draft.operation == "memory.read")
        .unwrap();
    assert_eq!(read.draft.subject, "researcher");
    assert_eq!(verify(&e).await, log.len() as u64);
}
