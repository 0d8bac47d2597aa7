//! The provenance invariants as property tests.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::tests::{action, key, rule, rule_with, sid};
use super::*;
use crate::decision::Verdict;

const UT: &[Origin] = &[Origin::User, Origin::Trusted];

fn trusted() -> OutputTrust {
    OutputTrust::compile(&OutputSpec {
        trust: Trust::Trusted,
        ..OutputSpec::default()
    })
    .unwrap()
}

/// Words from `a-m` (what trusted sources say) and values from `n-z` and
/// digits (what only the attacker says): disjoint, so a value can occur in
/// a trusted source only if the matcher is wrong.
fn trusted_text() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-m]{1,8}|[0-4]{1,3}", 0..30).prop_map(|w| w.join(" "))
}

fn attacker_value() -> impl Strategy<Value = String> {
    "[n-z5-9]{3,12}([.@/-][n-z5-9]{1,8}){0,3}"
}

/// Untrusted text that contains `value` among other words.
fn embed(prefix: &str, value: &str, suffix: &str) -> String {
    format!("{prefix} {value}, {suffix}")
}

#[derive(Debug, Clone, Copy)]
enum Variant {
    Cyrillic,
    Fullwidth,
    ZeroWidth,
    Bidi,
    SoftHyphen,
    Combining,
}

fn variant() -> impl Strategy<Value = Variant> {
    prop_oneof![
        Just(Variant::Cyrillic),
        Just(Variant::Fullwidth),
        Just(Variant::ZeroWidth),
        Just(Variant::Bidi),
        Just(Variant::SoftHyphen),
        Just(Variant::Combining),
    ]
}

/// A look-alike of `value` (ASCII lowercase letters, at least 3), changed
/// at char position `at`.
fn disguise(value: &str, v: Variant, at: usize) -> String {
    let chars: Vec<char> = value.chars().collect();
    let at = at % chars.len();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        match v {
            Variant::Cyrillic if i == at => out.push(match c {
                'a' => 'а',
                'c' => 'с',
                'e' => 'е',
                'o' => 'о',
                'p' => 'р',
                'x' => 'х',
                'y' => 'у',
                'i' => 'і',
                'j' => 'ј',
                's' => 'ѕ',
                other => *other,
            }),
            Variant::Fullwidth => {
                out.push(char::from_u32(*c as u32 - 0x21 + 0xff01).unwrap_or(*c));
            }
            _ => out.push(*c),
        }
        if i == at {
            match v {
                Variant::ZeroWidth => out.push('\u{200b}'),
                Variant::Bidi => out.push('\u{202e}'),
                Variant::SoftHyphen => out.push('\u{ad}'),
                Variant::Combining => out.push('\u{301}'),
                _ => {}
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A value that occurs only in untrusted results never satisfies
    /// `from: [user, trusted]`, whatever else the session holds.
    #[test]
    fn untrusted_only_values_are_never_vouched(
        prompt in trusted_text(),
        results in prop::collection::vec(trusted_text(), 0..4),
        value in attacker_value(),
        before in trusted_text(),
        after in trusted_text(),
        caseless in any::<bool>(),
    ) {
        let mut index = SourceIndex::new(key());
        index.record_user(sid("prompt"), &json!(prompt)).unwrap();
        for (i, r) in results.iter().enumerate() {
            index.record_result(sid(&format!("t{i}")), action("t"), &trusted(), &json!({"text": r, "list": r.split(' ').collect::<Vec<_>>()})).unwrap();
        }
        index.record_result(sid("evil"), action("read_file"), &OutputTrust::untrusted(), &json!(embed(&before, &value, &after))).unwrap();
        let mode = if caseless { MatchMode::Caseless } else { MatchMode::Text };
        let gate = rule_with("to", UT, Otherwise::Escalate, mode);
        let d = gate.decide(&json!({"to": value}), &index);
        prop_assert_ne!(d.verdict, Verdict::Allow);
        prop_assert_eq!(&d.arguments[0].values[0].origins, &vec![Origin::Untrusted]);
    }

    /// A value split across two sources, two fields, or two words of one
    /// field is never vouched for.
    #[test]
    fn split_values_are_never_vouched(
        value in "[n-z5-9]{4,16}",
        cut in 1usize..15,
        how in 0u8..3,
        noise in trusted_text(),
    ) {
        let cut = 1 + cut % (value.len() - 1);
        let (a, b) = value.split_at(cut);
        let mut index = SourceIndex::new(key());
        match how {
            0 => {
                index.record_user(sid("prompt"), &json!(format!("{noise} {a}"))).unwrap();
                index.record_result(sid("r"), action("t"), &trusted(), &json!(format!("{b} {noise}"))).unwrap();
            }
            1 => {
                index.record_result(sid("r"), action("t"), &trusted(), &json!({"x": a, "y": b, "z": [a, b]})).unwrap();
            }
            _ => {
                index.record_user(sid("prompt"), &json!(format!("{noise} {a} {b} {a}\u{200b}{b}"))).unwrap();
            }
        }
        for mode in [MatchMode::Text, MatchMode::Caseless] {
            let gate = rule_with("to", UT, Otherwise::Escalate, mode);
            let d = gate.decide(&json!({"to": value}), &index);
            prop_assert_ne!(d.verdict, Verdict::Allow);
            prop_assert!(!d.arguments[0].values[0].origins.iter().any(|o| o.vouches()));
        }
    }

    /// An untrusted look-alike (confusable letter, fullwidth, zero-width,
    /// bidi control, soft hyphen, combining mark) of a trusted value is
    /// never vouched for by it; every disguise except the combining mark
    /// (which makes a visibly different letter) is denied as a look-alike.
    #[test]
    fn look_alikes_never_borrow_a_trusted_values_provenance(
        genuine in "[acepxyijs][a-z]{2,10}",
        v in variant(),
        at in 0usize..16,
        noise in trusted_text(),
    ) {
        let fake = disguise(&genuine, v, at);
        prop_assume!(fake != genuine);
        let mut index = SourceIndex::new(key());
        index.record_result(sid("users"), action("list_users"), &trusted(), &json!([genuine.clone(), noise])).unwrap();
        index.record_result(sid("mail"), action("inbox"), &OutputTrust::untrusted(), &json!(format!("contact {fake} today"))).unwrap();
        for mode in [MatchMode::Text, MatchMode::Caseless] {
            let gate = rule_with("to", UT, Otherwise::Escalate, mode);
            let d = gate.decide(&json!({"to": fake}), &index);
            prop_assert_ne!(d.verdict, Verdict::Allow, "{:?} {:?}", fake, mode);
            if !matches!(v, Variant::Combining) {
                prop_assert_eq!(d.verdict, Verdict::Deny, "{:?}", fake);
                prop_assert_eq!(d.reason.kind(), "argument_confusable");
            }
            // The genuine value stays vouched.
            let d = gate.decide(&json!({"to": genuine}), &index);
            prop_assert_eq!(d.verdict, Verdict::Allow);
        }
    }

    /// A vouched value with an invisible character inserted is not the
    /// vouched value: it is denied as a look-alike.
    #[test]
    fn inserted_invisible_characters_are_denied(
        genuine in "[a-z]{3,12}",
        at in 0usize..12,
        invisible in prop::sample::select(vec!['\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{200e}', '\u{2066}', '\u{e0041}']),
    ) {
        let mut index = SourceIndex::new(key());
        index.record_user(sid("prompt"), &json!(format!("please write to {genuine} now"))).unwrap();
        let at = 1 + at % (genuine.len() - 1);
        let (a, b) = genuine.split_at(at);
        let fake = format!("{a}{invisible}{b}");
        let d = rule("to", UT, Otherwise::Escalate).decide(&json!({"to": fake}), &index);
        prop_assert_eq!(d.verdict, Verdict::Deny);
        prop_assert!(d.arguments[0].values[0].invisible);
        prop_assert_eq!(d.arguments[0].values[0].confusable_with.as_ref().map(|h| h.origin), Some(Origin::User));
    }

    /// Serialised and restored, an index gives identical answers (a
    /// restart never launders taint), and its bytes are stable.
    #[test]
    fn restored_indexes_answer_identically(
        prompt in trusted_text(),
        results in prop::collection::vec((trusted_text(), attacker_value(), any::<bool>()), 0..5),
        queries in prop::collection::vec(prop_oneof![attacker_value(), "[a-m]{1,8}( [a-m]{1,8}){0,2}", "[0-4]{1,3}"], 1..8),
        max_bytes in prop_oneof![Just(1u64 << 20), 0u64..200],
    ) {
        let limits = IndexLimits { max_bytes, ..IndexLimits::default() };
        let mut index = SourceIndex::with_limits(key(), limits);
        index.record_user(sid("prompt"), &json!(prompt)).unwrap();
        for (i, (text, value, is_trusted)) in results.iter().enumerate() {
            let trust = if *is_trusted { trusted() } else { OutputTrust::untrusted() };
            index.record_result(sid(&format!("r{i}")), action("t"), &trust, &json!({"body": text, "to": value, "n": i})).unwrap();
        }
        let bytes = index.to_bytes();
        let restored = SourceIndex::from_bytes(&bytes, key()).unwrap();
        prop_assert_eq!(&restored, &index);
        prop_assert_eq!(restored.to_bytes(), bytes);
        for mode in [MatchMode::Text, MatchMode::Caseless] {
            for q in &queries {
                for value in [json!(q), q.parse::<u64>().map(Value::from).unwrap_or(Value::Null)] {
                    let a = index.provenance("to".into(), &value, mode);
                    let b = restored.provenance("to".into(), &value, mode);
                    prop_assert_eq!(a, b);
                }
            }
        }
    }

    /// Restoring arbitrary bytes never panics, and a flipped byte in a
    /// real index is either refused or restores to a consistent index.
    #[test]
    fn corrupt_bytes_never_panic(
        junk in prop::collection::vec(any::<u8>(), 0..200),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let _ = SourceIndex::from_bytes(&junk, key());
        let mut index = SourceIndex::new(key());
        index.record_user(sid("prompt"), &json!("pay GB29NWBK60161331926819 today")).unwrap();
        index.record_result(sid("r"), action("t"), &trusted(), &json!([{"id": 7, "to": "CH9300762011623852957"}])).unwrap();
        let mut bytes = index.to_bytes();
        let i = at.index(bytes.len());
        if let Some(b) = bytes.get_mut(i) {
            *b ^= flip;
        }
        if let Ok(restored) = SourceIndex::from_bytes(&bytes, key()) {
            let _ = rule("to", UT, Otherwise::Deny).decide(&json!({"to": "GB29NWBK60161331926819"}), &restored);
        }
    }

    /// Matching never panics on arbitrary text, on either side.
    #[test]
    fn arbitrary_text_never_panics(recorded in "\\PC{0,80}", value in "\\PC{0,40}") {
        let mut index = SourceIndex::new(key());
        index.record_user(sid("prompt"), &json!(recorded)).unwrap();
        let _ = rule("to", UT, Otherwise::Deny).decide(&json!({"to": value}), &index);
    }

    /// A link only an untrusted source holds is never vouched for inside a
    /// body, whatever punctuation surrounds it and whatever trusted text
    /// the session holds.
    #[test]
    fn embedded_attacker_links_are_never_vouched(
        prompt in trusted_text(),
        results in prop::collection::vec(trusted_text(), 0..3),
        host in "[n-z5-9]{3,10}(\\.[n-z]{2,6}){1,2}",
        scheme in prop::sample::select(vec!["", "https://", "http://", "HTTPS://"]),
        path in prop::sample::select(vec!["", "/", "/x?y=z", "/a/b#c", ":8080/p"]),
        before in prop::sample::select(vec!["", "(", "<", "'", "\"", "[", "see:", "\n", "\u{200b}"]),
        after in prop::sample::select(vec!["", ")", ">", ".", ",", "!", "'", "\"", "]", "?", ";", "\t"]),
        words in trusted_text(),
    ) {
        let link = format!("{scheme}{host}{path}");
        let mut index = SourceIndex::new(key());
        index.record_user(sid("prompt"), &json!(prompt)).unwrap();
        for (i, r) in results.iter().enumerate() {
            index.record_result(sid(&format!("t{i}")), action("t"), &trusted(), &json!({"text": r})).unwrap();
        }
        index.record_result(sid("page"), action("get_webpage"), &OutputTrust::untrusted(), &json!(format!("visit {link} now"))).unwrap();
        let body = format!("{words} {before}{link}{after} {words}");
        // The link is found whole.
        let urls: Vec<String> = embedded_targets(&body, Within::Urls).into_iter().map(|t| t.text).collect();
        prop_assert!(urls.contains(&link), "{:?} in {:?}", urls, body);
        for w in [Within::Urls, Within::Hosts] {
            for mode in [MatchMode::Text, MatchMode::Caseless] {
                let gate = ActionProvenance::compile(
                    &[ProvenanceRuleSpec { argument: "body".into(), from: UT.to_vec(), otherwise: Otherwise::Escalate, matching: mode, within: Some(w) }],
                    &OutputSpec::default(), false).unwrap();
                let d = gate.decide(&json!({"body": body}), &index);
                prop_assert_ne!(d.verdict, Verdict::Allow, "{:?} {:?} {:?}", w, mode, body);
            }
        }
    }

    /// A vouched link in disguise (a confusable letter, fullwidth forms, a
    /// zero-width, bidi or soft-hyphen character) inside a body is denied
    /// as a look-alike; the genuine link passes.
    #[test]
    fn disguised_embedded_links_are_denied(
        genuine in "[acepxyijs][a-z]{2,8}",
        tld in "[a-m]{2,3}",
        v in prop_oneof![
            Just(Variant::Cyrillic),
            Just(Variant::Fullwidth),
            Just(Variant::ZeroWidth),
            Just(Variant::Bidi),
            Just(Variant::SoftHyphen),
        ],
        at in 0usize..16,
        words in trusted_text(),
    ) {
        let host = format!("{genuine}.{tld}");
        // The first letter always has a Cyrillic twin; an invisible
        // character after the last one is outside the link (it changes
        // nothing a linkifier would follow), so it goes inside.
        let at = if matches!(v, Variant::Cyrillic) { 0 } else { at % (host.len() - 1) };
        let fake = disguise(&host, v, at);
        prop_assert_ne!(&fake, &host);
        let mut index = SourceIndex::new(key());
        index.record_result(sid("dir"), action("directory"), &trusted(), &json!([{"site": format!("www.{host}")}])).unwrap();
        let gate = ActionProvenance::compile(
            &[ProvenanceRuleSpec { argument: "body".into(), from: UT.to_vec(), otherwise: Otherwise::Escalate, matching: MatchMode::Caseless, within: Some(Within::Urls) }],
            &OutputSpec::default(), false).unwrap();
        let d = gate.decide(&json!({"body": format!("{words} www.{fake} {words}")}), &index);
        prop_assert_eq!(d.verdict, Verdict::Deny, "{:?}", fake);
        prop_assert_eq!(d.reason.kind(), "argument_confusable");
        let d = gate.decide(&json!({"body": format!("{words} www.{host} {words}")}), &index);
        prop_assert_eq!(d.verdict, Verdict::Allow);
    }

    /// A link whose parts are vouched for separately (two sources, two
    /// fields) is not vouched for.
    #[test]
    fn split_embedded_links_are_never_vouched(
        a in "[n-z]{2,8}",
        b in "[n-z]{2,8}",
        path in "/[n-z]{1,8}",
        how in 0u8..3,
    ) {
        let host = format!("www.{a}.com");
        let link = format!("{host}.{b}.net{path}");
        let mut index = SourceIndex::new(key());
        match how {
            0 => {
                index.record_user(sid("prompt"), &json!(format!("see {host}"))).unwrap();
                index.record_result(sid("r"), action("t"), &trusted(), &json!(format!("{b}.net{path}"))).unwrap();
            }
            1 => {
                index.record_result(sid("r"), action("t"), &trusted(), &json!({"x": host, "y": format!(".{b}.net{path}")})).unwrap();
            }
            _ => {
                index.record_user(sid("prompt"), &json!(format!("{host} {b}.net{path} {host}\u{200b}.{b}.net{path}"))).unwrap();
            }
        }
        let gate = ActionProvenance::compile(
            &[ProvenanceRuleSpec { argument: "body".into(), from: UT.to_vec(), otherwise: Otherwise::Escalate, matching: MatchMode::Caseless, within: Some(Within::Urls) }],
            &OutputSpec::default(), false).unwrap();
        let d = gate.decide(&json!({"body": format!("go to {link} now")}), &index);
        prop_assert_ne!(d.verdict, Verdict::Allow);
    }

    /// Extraction never panics, its spans are the texts it returns, and
    /// ASCII text without `.`, `@` or `:` holds no target.
    #[test]
    fn extraction_is_total_and_exact(text in "\\PC{0,120}", plain in "[ -\\-/-9;-?A-~]{0,60}") {
        for w in [Within::Urls, Within::Emails, Within::Hosts] {
            let mut last = 0;
            for t in embedded_targets(&text, w) {
                prop_assert_eq!(text.get(t.start..t.end), Some(t.text.as_str()));
                prop_assert!(t.start < t.end);
                // URLs never overlap: a bare URL's path swallows what follows.
                if w == Within::Urls {
                    prop_assert!(t.start >= last);
                }
                last = t.end;
            }
            prop_assert!(embedded_targets(&plain, w).is_empty(), "{:?}", plain);
        }
    }
}
