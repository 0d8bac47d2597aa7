use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;

use super::*;
use crate::envelope::tests::{customer_policy, ls, root};
use crate::envelope::{Envelope, EnvelopeId};
use crate::ids::AgentId;

macro_rules! vector {
    ($name:literal) => {
        include_str!(concat!("../../../tests/data/envelope/", $name))
    };
}

fn key(seed_hex: &str) -> SigningKey {
    let seed: [u8; 32] = hex::decode(seed_hex.trim()).unwrap().try_into().unwrap();
    SigningKey::from_bytes(&seed)
}

fn issuer() -> IssuerId {
    IssuerId::parse("warden.test-1").unwrap()
}

/// The vector envelope: a delegated child of the customer example, one
/// step after delegation.
fn vector_envelope() -> Envelope {
    let p = customer_policy();
    let parent = crate::envelope::tests::run(
        &p,
        &root(&p, "env-vec-1"),
        &[&["name", "pii"], &["behavioral", "financial"]],
    );
    let (child, _) = parent
        .delegate(
            &p,
            AgentId::parse("researcher").unwrap(),
            EnvelopeId::parse("env-vec-1:c1").unwrap(),
            &ls(&["no_memory_write"]),
            false,
        )
        .unwrap();
    child.fold(&p, &ls(&["renewal"]), &[]).unwrap().0
}

fn verifier() -> Verifier {
    let mut v = Verifier::new();
    v.trust(issuer(), key(vector!("seed.hex")).verifying_key());
    v
}

fn token(json: &str) -> SignedEnvelope {
    SignedEnvelope::from_json(json).unwrap()
}

fn regen_hint(name: &str, actual: &str) -> String {
    format!(
        "tests/data/envelope/{name} drifted; if the change is intended, the new content is:\n{actual}"
    )
}

#[test]
fn fixed_vectors_match_byte_for_byte() {
    let k = key(vector!("seed.hex"));
    assert_eq!(
        hex::encode(k.verifying_key().to_bytes()),
        vector!("public_key.hex")
    );
    let rec = vector_envelope().to_record();

    let canonical = to_canonical(&rec).unwrap();
    assert_eq!(
        canonical,
        vector!("envelope.json"),
        "{}",
        regen_hint("envelope.json", &canonical)
    );
    let input = signing_input(&rec, &issuer()).unwrap();
    assert_eq!(input, vector!("signing_input.txt").as_bytes());
    let signed = sign(&rec, &issuer(), &k).unwrap();
    assert_eq!(signed.signature, vector!("signature.b64"));
    let json = signed.to_canonical_json().unwrap();
    assert_eq!(
        json,
        vector!("token.json"),
        "{}",
        regen_hint("token.json", &json)
    );
    // Parsing and re-encoding is the identity on canonical tokens.
    assert_eq!(
        token(vector!("token.json")).to_canonical_json().unwrap(),
        vector!("token.json")
    );
    // The committed record restores under the policy that made it.
    let env =
        Envelope::restore(&token(vector!("token.json")).envelope, &customer_policy()).unwrap();
    assert_eq!(env, vector_envelope());

    let receipt = Receipt::issue(&rec, &issuer(), Timestamp(1_767_225_600_000));
    assert_eq!(to_canonical(&receipt).unwrap(), vector!("receipt.json"));
    let parsed: Receipt = serde_json::from_str(vector!("receipt.json")).unwrap();
    assert_eq!(parsed, receipt);
}

#[test]
fn valid_token_verifies_once() {
    let mut v = verifier();
    let ok = v.verify_json(vector!("token.json")).unwrap();
    assert_eq!(ok.issuer, issuer());
    assert_eq!(ok.envelope, vector_envelope().to_record());
    assert_eq!(v.highest_accepted(&ok.envelope.envelope_id), Some(1));
    // Pretty-printed JSON is the same token.
    let pretty = serde_json::to_string_pretty(&token(vector!("next_version.json"))).unwrap();
    assert!(v.verify_json(&pretty).is_ok());
}

#[test]
fn rejections_have_stable_codes_and_leave_no_trace() {
    let mut v = verifier();
    let id = EnvelopeId::parse("env-vec-1:c1").unwrap();
    let code = |v: &mut Verifier, json: &str| v.verify_json(json).unwrap_err().code();

    assert_eq!(code(&mut v, vector!("tampered.json")), "forged");
    assert_eq!(code(&mut v, vector!("wrong_key.json")), "forged");
    let e = v.verify_json(vector!("unknown_issuer.json")).unwrap_err();
    assert_eq!((e.code(), e.reason()), ("forged", reasons::ENVELOPE_FORGED));
    assert_eq!(
        e.to_string(),
        "envelope issuer `warden.unknown` is not trusted"
    );
    assert_eq!(v.highest_accepted(&id), None);

    v.verify_json(vector!("token.json")).unwrap();
    let e = v.verify_json(vector!("token.json")).unwrap_err();
    assert_eq!(
        (e.code(), e.reason()),
        ("replayed", reasons::ENVELOPE_REPLAYED)
    );
    let e = v
        .verify_json(vector!("downgraded_version.json"))
        .unwrap_err();
    assert_eq!(e.code(), "downgraded");
    assert_eq!(
        e.to_string(),
        "envelope `env-vec-1:c1` version 0 is a downgrade of accepted version 1"
    );
    let e = v
        .verify_json(vector!("downgraded_restrictions.json"))
        .unwrap_err();
    assert_eq!(
        e,
        VerifyError::Downgraded {
            envelope_id: id.clone(),
            presented: 2,
            accepted: 1,
            kind: Downgrade::Restrictions {
                missing: ls(&["no_memory_write"])
            },
        }
    );
    assert_eq!(
        e.to_string(),
        "envelope `env-vec-1:c1` version 2 is a downgrade of accepted version 1 (drops `no_memory_write`)"
    );
    assert_eq!(v.highest_accepted(&id), Some(1));
    // A higher version keeping every restriction is accepted, even with a
    // lower sensitivity (a declassification, signed by the issuer).
    let next = v.verify_json(vector!("next_version.json")).unwrap();
    assert_eq!(
        next.envelope.aggregate_sensitivity,
        Sensitivity::Confidential
    );
    assert_eq!(v.highest_accepted(&id), Some(2));
    assert_eq!(code(&mut v, vector!("token.json")), "downgraded");
}

#[test]
fn tampering_any_field_is_forged() {
    let mut v = verifier();
    let good = token(vector!("token.json"));
    let mut cases = Vec::new();
    let mut t = good.clone();
    t.envelope.version = 9;
    cases.push(t);
    let mut t = good.clone();
    t.envelope.aggregate_sensitivity = Sensitivity::Public;
    cases.push(t);
    let mut t = good.clone();
    t.envelope.labels.remove("pii");
    cases.push(t);
    let mut t = good.clone();
    t.envelope.agent_id = AgentId::parse("intruder").unwrap();
    cases.push(t);
    let mut t = good.clone();
    t.envelope.parent_envelope_id = None;
    cases.push(t);
    for t in cases {
        assert!(
            matches!(v.verify(&t), Err(VerifyError::BadSignature { .. })),
            "{t:?}"
        );
    }
    // Re-labelling the issuer breaks the signature too (the issuer is signed).
    let mut t = good.clone();
    t.issuer = IssuerId::parse("warden.test-2").unwrap();
    v.trust(t.issuer.clone(), key(vector!("seed.hex")).verifying_key());
    assert_eq!(v.verify(&t).unwrap_err().code(), "forged");
    assert!(v.verify(&good).is_ok());
}

#[test]
fn malformed_tokens() {
    let mut v = verifier();
    let good = token(vector!("token.json"));
    let mut t = good.clone();
    t.signature = "not base64!".into();
    assert_eq!(v.verify(&t).unwrap_err().code(), "malformed");
    let mut t = good.clone();
    t.signature = BASE64.encode([0u8; 32]);
    assert_eq!(v.verify(&t).unwrap_err().code(), "malformed");
    let extra = vector!("token.json").replacen('{', "{\"extra\":1,", 1);
    assert_eq!(v.verify_json(&extra).unwrap_err().code(), "malformed");
    assert_eq!(
        v.verify_json("{").unwrap_err().reason(),
        reasons::ENVELOPE_MALFORMED
    );
    let bad_issuer = vector!("token.json").replace("warden.test-1", "warden test");
    assert_eq!(v.verify_json(&bad_issuer).unwrap_err().code(), "malformed");
    assert_eq!(v.highest_accepted(&good.envelope.envelope_id), None);
}

#[test]
fn wrong_key_vector_is_signed_by_the_other_seed() {
    let t = token(vector!("wrong_key.json"));
    let mut v = Verifier::new();
    v.trust(issuer(), key(vector!("wrong_seed.hex")).verifying_key());
    assert!(v.verify(&t).is_ok());
}

#[test]
fn canonical_json_rules() {
    let v = serde_json::json!({"b": [1, -2, true, null], "a": {"y": "\"\\\n\t\u{1}é", "x": {}}, "A": []});
    assert_eq!(
        canonical_json(&v).unwrap(),
        r#"{"A":[],"a":{"x":{},"y":"\"\\\n\t\u0001é"},"b":[1,-2,true,null]}"#
    );
    assert!(matches!(
        canonical_json(&serde_json::json!({"x": 1.5})),
        Err(CanonicalError::NonInteger { .. })
    ));
    let mut deep = serde_json::json!(0);
    for _ in 0..=MAX_CANONICAL_DEPTH {
        deep = serde_json::json!([deep]);
    }
    assert_eq!(canonical_json(&deep), Err(CanonicalError::TooDeep));
}

#[test]
fn receipts_resolve_expire_or_stay_unresolved() {
    let receipt: Receipt = serde_json::from_str(vector!("receipt.json")).unwrap();
    let mut store = BTreeMap::new();
    store.insert(receipt.envelope_ref.clone(), "governed context");
    let until = receipt.resolvable_until;
    let lookup = |r: &Receipt| store.get(&r.envelope_ref).copied();
    assert_eq!(
        resolve_receipt(&receipt, until, lookup),
        ReceiptOutcome::Resolved("governed context")
    );
    let expired = resolve_receipt(&receipt, until.plus_millis(1), |_| -> Option<()> {
        unreachable!("an expired receipt is not looked up")
    });
    assert_eq!(
        (expired.code(), &expired),
        ("expired", &ReceiptOutcome::Expired)
    );
    let mut other = receipt.clone();
    other.envelope_ref =
        EnvelopeRef::compute(&issuer(), &EnvelopeId::parse("env-gone").unwrap(), 1);
    assert_eq!(
        resolve_receipt(&other, until, lookup),
        ReceiptOutcome::Unresolved
    );
    // The reference depends on issuer, id and version, and carries no contents.
    let r1 = EnvelopeRef::compute(&issuer(), &EnvelopeId::parse("env-vec-1:c1").unwrap(), 1);
    assert_eq!(r1, receipt.envelope_ref);
    assert_ne!(
        r1,
        EnvelopeRef::compute(&issuer(), &EnvelopeId::parse("env-vec-1:c1").unwrap(), 2)
    );
    assert!(!vector!("receipt.json").contains("pii"));
    // A malformed reference is a malformed receipt; an expired one is not.
    let bad = vector!("receipt.json").replace(receipt.envelope_ref.as_str(), "zz");
    assert!(serde_json::from_str::<Receipt>(&bad).is_err());
    assert!(EnvelopeRef::parse(&"A".repeat(64)).is_err());
}

#[test]
fn the_stateless_check_verifies_signatures_only() {
    let issuers: BTreeMap<IssuerId, VerifyingKey> =
        [(issuer(), key(vector!("seed.hex")).verifying_key())].into();
    let t = token(vector!("token.json"));
    // It keeps nothing: the same token verifies again.
    let first = verify_signature(&t, &issuers).unwrap();
    assert_eq!(verify_signature(&t, &issuers).unwrap(), first);
    assert_eq!(first.issuer, issuer());
    assert_eq!(first.envelope, t.envelope);

    let forged = |t: &SignedEnvelope, issuers: &BTreeMap<IssuerId, VerifyingKey>| {
        verify_signature(t, issuers).unwrap_err()
    };
    let e = forged(&t, &BTreeMap::new());
    assert!(matches!(e, VerifyError::UnknownIssuer { .. }), "{e}");
    assert_eq!(e.code(), "forged");
    for json in [vector!("tampered.json"), vector!("wrong_key.json")] {
        let e = forged(&token(json), &issuers);
        assert!(matches!(e, VerifyError::BadSignature { .. }), "{e}");
        assert_eq!(e.reason(), reasons::ENVELOPE_FORGED);
    }
    let e = forged(&token(vector!("unknown_issuer.json")), &issuers);
    assert!(matches!(e, VerifyError::UnknownIssuer { .. }), "{e}");
    let mut bad = t.clone();
    bad.signature = "not base64!".into();
    assert_eq!(forged(&bad, &issuers).code(), "malformed");

    // The stateful verifier goes through it, then adds monotonicity.
    let mut v = Verifier::trusting(issuers.clone());
    assert_eq!(v.verify(&t).unwrap(), first);
    assert_eq!(v.verify(&t).unwrap_err().code(), "replayed");
    let mut other = Verifier::trusting(BTreeMap::new());
    assert_eq!(other.verify(&t).unwrap_err(), forged(&t, &BTreeMap::new()));
}
