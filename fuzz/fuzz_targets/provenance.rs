//! The provenance matcher: a small source index built from the first part
//! of the input, the rest matched against it. Never panics; a value is
//! always found in a source that holds it as a whole field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use warden_core::provenance::{FingerprintKey, MatchMode, SourceId, SourceIndex};

fuzz_target!(|data: &[u8]| {
    // `source 0xFF needle`; the source is a JSON value if it parses, else a
    // string; the needle is a string.
    let split = data.iter().position(|&b| b == 0xFF).unwrap_or(data.len());
    let (source, needle) = data.split_at(split);
    let needle = needle.get(1..).unwrap_or_default();
    let source: Value = serde_json::from_slice(source)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(source).into_owned()));
    let needle = Value::String(String::from_utf8_lossy(needle).into_owned());

    let key = FingerprintKey::new(b"fuzzing key, 32 bytes long......").expect("key");
    let mut index = SourceIndex::new(key);
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
    let holder = serde_json::json!({ "f": needle.clone() });
    if index.record_user(s2.clone(), &holder).is_err() || index.has_unsearchable() {
        return;
    }
    for mode in [MatchMode::Text, MatchMode::Caseless] {
        if needle.as_str().is_some_and(|s| s.chars().any(char::is_alphanumeric)) {
            assert!(index.occurs_in(&s2, &needle, mode), "own field not found ({mode:?})");
        }
    }
});
