//! Delegation lockdown over HTTP: the near-miss corpus run through
//! `POST /v1/agents/self/children` as pre-built children (with `tools`).

use serde_json::json;
use warden_core::lockdown::parse_corpus;
use warden_store::Store;

use crate::support::*;

const CORPUS: &str = include_str!("../../../warden-core/tests/data/lockdown-corpus.tsv");

#[tokio::test]
async fn corpus_through_http_child_registration() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    let corpus = parse_corpus(CORPUS).unwrap();
    assert!(corpus.len() >= 60);
    let mut mismatches = Vec::new();
    for (i, (tool, is_write)) in corpus.iter().enumerate() {
        let child = format!("http-corpus-{i}");
        let agents_before = s.store().load_agents().await.unwrap().len();
        let r = s
            .post(
                "/v1/agents/self/children",
                &researcher,
                json!({"agent_id": child, "capabilities": ["memory.read"], "tools": [tool]}),
            )
            .await;
        let refused = r.status == 403 && r.code() == "child_write_surface_tool";
        let created = r.status == 201;
        if *is_write && !refused {
            mismatches.push(format!(
                "{tool:?}: expected refusal, got {} {}",
                r.status,
                r.text()
            ));
        }
        if !*is_write && !created {
            mismatches.push(format!(
                "{tool:?}: expected 201, got {} {}",
                r.status,
                r.text()
            ));
        }
        if refused {
            // No agent, no token; the refusal is in the log.
            assert_eq!(s.store().load_agents().await.unwrap().len(), agents_before);
            let last = s.last_audit().await;
            assert_eq!(last.draft.reason, "child_write_surface_tool");
            assert_eq!(last.draft.resource, child);
            s.get(&format!("/v1/agents/{child}"), OP)
                .await
                .expect_error(404, "not_found");
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
