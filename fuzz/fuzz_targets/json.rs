//! The strict JSON body reader: never panics; what it accepts re-encodes to
//! a document it accepts again as the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_core::json::parse_slice;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the depth limit (1 to 128), the rest is the body.
    let Some((&depth, body)) = data.split_first() else {
        return;
    };
    let depth = usize::from(depth % 128) + 1;
    if let Ok(value) = parse_slice(body, depth) {
        let encoded = serde_json::to_vec(&value).expect("a parsed value encodes");
        let again = parse_slice(&encoded, depth).expect("a re-encoded value parses");
        assert_eq!(again, value, "round trip changed the value");
    }
});
