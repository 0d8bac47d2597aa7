//! The bundle parser (YAML, and JSON when the text starts with `{`): never
//! panics; an accepted spec re-encoded as JSON parses back to the same spec;
//! compiling it never panics, and compiles the same both times.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_core::bundle::{Policy, parse_spec};
use warden_core::audit::Digest;

fuzz_target!(|text: &str| {
    let Ok(spec) = parse_spec(text) else {
        return;
    };
    let encoded = serde_json::to_string(&spec).expect("a spec encodes");
    let again = parse_spec(&encoded).expect("a re-encoded spec parses");
    assert_eq!(again, spec, "round trip changed the spec");
    let digest = Digest::of(text.as_bytes());
    let first = Policy::compile(spec, digest).map(|p| p.spec);
    let second = Policy::compile(again, digest).map(|p| p.spec);
    assert_eq!(first.is_ok(), second.is_ok(), "compile differs on equal specs");
});
