//! The stored envelope signing key: servers sharing a store sign with one
//! key and each verifies what the other signed; a rotation keeps what the
//! old key signed verifying, and new exports use the new key. Real
//! signatures: exported envelopes checked with `verify_signature` against
//! the keys each server publishes.

use std::sync::Arc;

use serde_json::json;
use warden::{Admission, Caller, ManualClock};
use warden_core::envelope::sign::{SignedEnvelope, verify_signature};
use warden_core::ids::RunId;
use warden_core::time::Timestamp;
use warden_server::{AppState, EnvelopeKeySource, ServerConfig};
use warden_store::{MemoryStore, Store};

use crate::support::*;

/// One in-memory store shared by several servers, as one database is.
#[derive(Clone, Default)]
struct Shared {
    inner: Arc<MemoryStore>,
}

warden_store::forward_store!(impl Store for Shared => field inner);

async fn server(store: &Shared) -> AppState<Shared> {
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let policy = warden_core::bundle::compile(LAB_POLICY).unwrap();
    AppState::open(policy, store.clone(), clock, ServerConfig::default())
        .await
        .unwrap()
}

fn researcher() -> Caller {
    Caller::Agent(id("researcher"))
}

async fn admit(st: &AppState<Shared>, run: &str) {
    let sop = warden_core::sop::parse_sop(
        &json!({"sop_id": "look", "version": 1, "steps": [
            {"step_id": "crm", "action": "crm.lookup", "arguments": {"customer_id": "c-1"}},
        ]})
        .to_string(),
        &st.engine().policy().sop_limits,
    )
    .unwrap();
    let admitted = st
        .engine()
        .admit_run(&id("researcher"), &sop, Some(RunId::parse(run).unwrap()))
        .await
        .unwrap();
    assert!(
        matches!(admitted, Admission::Admitted { .. }),
        "{admitted:?}"
    );
}

async fn export(st: &AppState<Shared>, run: &str) -> SignedEnvelope {
    let signer = st.signer();
    st.engine()
        .export_envelope(
            &researcher(),
            &RunId::parse(run).unwrap(),
            signer.issuer(),
            signer.key(),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn servers_sharing_a_store_sign_with_one_stored_key_across_rotations() {
    let store = Shared::default();
    let a = server(&store).await;
    let b = server(&store).await;
    // One key, stored by the first server and loaded by the second.
    assert_eq!(
        a.signer().source(),
        EnvelopeKeySource::Stored { generation: 1 }
    );
    assert_eq!(a.signer().public_key_hex(), b.signer().public_key_hex());
    let keys = store.signing_keys().await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(hex::encode(keys[0].public_key), a.signer().public_key_hex());
    let created: Vec<_> = store
        .audit_page(0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.draft.operation == "envelope_key.create")
        .collect();
    assert_eq!(created.len(), 1, "the first key is recorded once");
    assert_eq!(
        created[0].draft.details["public_key"],
        json!(a.signer().public_key_hex())
    );
    // The seed is in no entry.
    let seed_hex = hex::encode(keys[0].seed);
    assert!(
        store.audit_page(0, 10_000).await.unwrap().iter().all(|e| !e
            .draft
            .details
            .to_string()
            .contains(&seed_hex))
    );

    // Signed on A, verified against what B publishes.
    admit(&a, "run-1").await;
    let old = export(&a, "run-1").await;
    verify_signature(&old, &b.envelope_keys().trusted()).unwrap();

    // A rotation (on B's engine, as `warden keys rotate` would): A still
    // signs with the old key until it reloads; after it, both sign with the
    // new key, and what the old key signed still verifies on both.
    b.engine().rotate_envelope_key([9; 32]).await.unwrap();
    assert_eq!(export(&a, "run-1").await.issuer, old.issuer);
    assert!(a.reload_envelope_keys().await.unwrap());
    assert!(b.reload_envelope_keys().await.unwrap());
    assert!(!b.reload_envelope_keys().await.unwrap(), "nothing new");
    let new = export(&a, "run-1").await;
    assert_ne!(new.issuer, old.issuer);
    assert_eq!(
        a.signer().source(),
        EnvelopeKeySource::Stored { generation: 2 }
    );
    for st in [&a, &b] {
        let trusted = st.envelope_keys().trusted();
        assert_eq!(trusted.len(), 2);
        verify_signature(&old, &trusted).unwrap();
        verify_signature(&new, &trusted).unwrap();
    }
    // A tampered token verifies under neither key.
    let mut forged = new.clone();
    forged.issuer = old.issuer.clone();
    assert!(verify_signature(&forged, &b.envelope_keys().trusted()).is_err());

    // A restart (a new server over the same store) loads both keys and
    // signs with the current one.
    drop(a);
    let restarted = server(&store).await;
    assert_eq!(restarted.signer().issuer(), &new.issuer);
    verify_signature(&old, &restarted.envelope_keys().trusted()).unwrap();
}

#[tokio::test]
async fn the_envelope_key_route_publishes_every_verifying_key() {
    let s = TestServer::start().await;
    let first = s.get("/v1/envelope-key", "x").await.expect(200).json();
    assert_eq!(first["key_source"], json!("stored"));
    assert_eq!(first["generation"], json!(1));
    assert_eq!(
        first["verifying_keys"],
        json!([{"issuer": first["issuer"], "public_key": first["public_key"], "generation": 1}])
    );
    s.state.engine().rotate_envelope_key([5; 32]).await.unwrap();
    assert!(s.state.reload_envelope_keys().await.unwrap());
    let second = s.get("/v1/envelope-key", "x").await.expect(200).json();
    assert_eq!(second["generation"], json!(2));
    assert_ne!(second["issuer"], first["issuer"]);
    let listed: Vec<_> = second["verifying_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["issuer"].clone())
        .collect();
    assert_eq!(
        listed,
        vec![first["issuer"].clone(), second["issuer"].clone()]
    );
}

#[tokio::test]
async fn a_configured_key_is_not_stored_and_not_reloaded() {
    let store = Shared::default();
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let config = ServerConfig {
        envelope_key: warden_server::EnvelopeKeyConfig::Seed([4; 32]),
        ..ServerConfig::default()
    };
    let st = AppState::open(
        warden_core::bundle::compile(LAB_POLICY).unwrap(),
        store.clone(),
        clock,
        config,
    )
    .await
    .unwrap();
    assert_eq!(st.signer().source(), EnvelopeKeySource::Configured);
    assert!(store.signing_keys().await.unwrap().is_empty());
    st.engine().rotate_envelope_key([6; 32]).await.unwrap();
    assert!(!st.reload_envelope_keys().await.unwrap());
    assert_eq!(st.signer().source(), EnvelopeKeySource::Configured);
}
