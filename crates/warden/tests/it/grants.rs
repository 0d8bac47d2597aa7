//! A secret is granted only to an agent that exists: a grant to an id
//! nobody holds yet would go to whoever registers that id first (any agent
//! may register it as its own child).

use serde_json::json;
use warden::{RegisterAgent, WriteStatus};
use warden_core::memory::RecordClass;
use warden_store::Store;

use super::support::{audit, id, key, lab, ns, write_req};

#[tokio::test]
async fn a_grant_to_an_agent_that_does_not_exist_is_refused_and_stores_nothing() {
    let e = lab().await;
    let before = e.store().audit_page(0, usize::MAX).await.unwrap().len();
    let mut req = write_req("vault", "api_key", json!("s3cr3t"));
    req.class = Some(RecordClass::Secret {
        grants: vec![id("researcher"), id("ghost")],
    });
    let out = e.write(&id("report_manager"), req).await.unwrap();
    assert_eq!(out.status, WriteStatus::InvalidRecord);
    assert_eq!(
        out.decision.reason.as_str(),
        "invalid_record:unknown_grantee"
    );
    assert!(out.record.is_none());
    // Nothing stored; the refusal recorded.
    let stored = e
        .store()
        .get_records(ns("vault"), key("api_key"), vec![id("report_manager")])
        .await
        .unwrap();
    assert!(stored.is_empty(), "{stored:?}");
    let log = audit(&e).await;
    assert_eq!(log.len(), before + 1);
    assert_eq!(
        log.last().unwrap().draft.reason,
        "invalid_record:unknown_grantee"
    );

    // Registering `ghost` afterwards gives it nothing to read.
    e.delegate(
        &id("researcher"),
        RegisterAgent {
            id: id("ghost"),
            parent: Some(id("researcher")),
            capabilities: ["memory.read"]
                .iter()
                .map(|a| warden_core::ids::ActionName::parse(a).unwrap())
                .collect(),
            tools: None,
            config: None,
        },
    )
    .await
    .unwrap();
    let read = e
        .read(&id("ghost"), &ns("vault"), &key("api_key"))
        .await
        .unwrap();
    assert!(read.value.is_none());

    // A grant to agents that exist is stored, and the grantee reads it.
    let mut ok = write_req("vault", "api_key", json!("s3cr3t"));
    ok.class = Some(RecordClass::Secret {
        grants: vec![id("researcher")],
    });
    let out = e.write(&id("report_manager"), ok).await.unwrap();
    assert_eq!(out.status, WriteStatus::Done);
}
