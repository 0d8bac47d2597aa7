//! The provenance matcher. Never panics; a value is always found in a
//! source that holds it as a whole field.
//!
//! A fixed index (a user source, a plan source and an untrusted result with
//! look-alikes of the user's values) is built once per process; every input
//! is matched against it as a needle, in both modes (`provenance` over the
//! whole index, `occurs_in` against the one source its first byte picks).
//! One input in four also builds an index of its own: the part before the
//! first `0xFF` byte is recorded (as JSON if it parses, else as a string),
//! the rest is matched against it and then recorded as a field of its own,
//! where it must be found.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use warden_core::ids::ActionName;
use warden_core::provenance::{FingerprintKey, MatchMode, OutputTrust, SourceId, SourceIndex};

static KEY: LazyLock<FingerprintKey> =
    LazyLock::new(|| FingerprintKey::new(b"fuzzing key, 32 bytes long......").expect("key"));

/// Sources to match every input against, recorded once.
static FIXED: LazyLock<(SourceIndex, Vec<SourceId>)> = LazyLock::new(|| {
    let mut index = SourceIndex::new(KEY.clone());
    let ids: Vec<SourceId> = ["user", "plan", "result"]
        .iter()
        .map(|s| SourceId::parse(s).expect("id"))
        .collect();
    let user = json!({
        "to": ["alice@example.com", "Bob.Smith@Example.org"],
        "note": "Pay ACME Corp 98.70 EUR to IBAN DE89 3704 0044 0532 0130 00 by Friday",
        "path": "/srv/reports/q3 summary.pdf",
        "n": 4200, "ok": true, "none": null,
    });
    let plan = json!({"steps": [{"action": "mail.send", "subject": "Quarterly report, v2"}]});
    let result = json!({
        "from": "аlice@exаmple.com",
        "body": "paypal invoice 1234: send 98.70 EUR to DE89 3704 0044 0532 0130 01",
        "hidden": "ali\u{200b}ce@example.com",
    });
    index
        .record_user(ids[0].clone(), &user)
        .expect("user source");
    index
        .record_plan(ids[1].clone(), &plan)
        .expect("plan source");
    let action = ActionName::parse("web.fetch").expect("action");
    index
        .record_result(ids[2].clone(), action, &OutputTrust::untrusted(), &result)
        .expect("result source");
    (index, ids)
});

fuzz_target!(|data: &[u8]| {
    let (fixed, ids) = &*FIXED;
    let whole = Value::String(String::from_utf8_lossy(data).into_owned());
    // One source per input, picked by the first byte: each source is
    // searched by a third of the inputs, at half the cost per input of
    // searching all three.
    let id = &ids[data.first().map_or(0, |b| usize::from(b / 4) % ids.len())];
    for mode in [MatchMode::Text, MatchMode::Caseless] {
        let _ = fixed.provenance("p".to_owned(), &whole, mode);
        let _ = fixed.occurs_in(id, &whole, mode);
    }

    // One input in four: an index of its own.
    if data.first().is_none_or(|b| b % 4 != 0) {
        return;
    }
    // `source 0xFF needle`; the source is a JSON value if it parses, else a
    // string; the needle is a string.
    let split = data.iter().position(|&b| b == 0xFF).unwrap_or(data.len());
    let (source, needle) = data.split_at(split);
    let needle = needle.get(1..).unwrap_or_default();
    let source: Value = serde_json::from_slice(source)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(source).into_owned()));
    let needle = Value::String(String::from_utf8_lossy(needle).into_owned());

    let mut index = SourceIndex::new(KEY.clone());
    let s1 = SourceId::parse("s1").expect("id");
    let s2 = SourceId::parse("s2").expect("id");
    if index.record_user(s1.clone(), &source).is_err() {
        return;
    }
    for mode in [MatchMode::Text, MatchMode::Caseless] {
        let _ = index.provenance("p".to_owned(), &needle, mode);
        let _ = index.occurs_in(&s1, &needle, mode);
    }
    // The needle recorded as a field of its own is found there, in both
    // modes, unless the index went over its bounds.
    let holder = json!({ "f": needle.clone() });
    if index.record_user(s2.clone(), &holder).is_err() || index.has_unsearchable() {
        return;
    }
    for mode in [MatchMode::Text, MatchMode::Caseless] {
        if needle
            .as_str()
            .is_some_and(|s| s.chars().any(char::is_alphanumeric))
        {
            assert!(
                index.occurs_in(&s2, &needle, mode),
                "own field not found ({mode:?})"
            );
        }
    }
});
