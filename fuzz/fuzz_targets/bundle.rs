//! The bundle parser (YAML, and JSON when the text starts with `{`): never
//! panics; an accepted spec re-encoded as JSON parses back to the same spec;
//! compiling it never panics.
//!
//! Every accepted spec is compiled (the built-in actions' schemas are
//! compiled once per process by the catalogue itself, so a compile costs
//! what the bundle adds). One accepted spec in four is also compiled from
//! its re-encoded copy, which must give the same policy or the same issues.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_core::audit::Digest;
use warden_core::bundle::{Policy, parse_spec};

fuzz_target!(|text: &str| {
    let Ok(spec) = parse_spec(text) else {
        return;
    };
    let encoded = serde_json::to_string(&spec).expect("a spec encodes");
    let again = parse_spec(&encoded).expect("a re-encoded spec parses");
    assert_eq!(again, spec, "round trip changed the spec");
    let digest = Digest::of(text.as_bytes());
    let first = Policy::compile(spec, digest).map(|p| p.spec);
    if digest.0[0] % 4 != 0 {
        return;
    }
    let second = Policy::compile(again, digest).map(|p| p.spec);
    assert_eq!(first, second, "compile differs on equal specs");
});
