//! The SOP parser: never panics; an accepted SOP serialises to a document
//! that parses back to the same SOP.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_core::sop::{SopLimits, parse_sop};

fuzz_target!(|text: &str| {
    let limits = SopLimits::default();
    if let Ok(sop) = parse_sop(text, &limits) {
        let encoded = serde_json::to_string(&sop).expect("an SOP encodes");
        let again = parse_sop(&encoded, &limits).expect("a re-encoded SOP parses");
        assert_eq!(again, sop, "round trip changed the SOP");
    }
});
