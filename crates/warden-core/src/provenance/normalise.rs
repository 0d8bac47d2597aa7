//! Normalisation and tokenisation, the same on both sides of a match.
//!
//! A token is a maximal run of word characters (letters, digits, combining
//! marks), a decimal number (`98.70`: digits, a dot, digits), or any other
//! single non-whitespace character (`@`, `.`, `-`, `/`, `'`, ...).
//! Whitespace only separates. Three token forms are produced from one text
//! (see the module docs of [`super`] for why each exists):
//!
//! - *exact*: NFC, tokenised, numbers in canonical form. Case and invisible
//!   characters are kept (an invisible character is a token of its own).
//! - *caseless*: the exact form, lowercased (Unicode lowercase mapping).
//! - *skeleton*: NFKC, default-ignorable and bidi-control characters
//!   removed, the IDNA full stop `。` (and, through NFKC, `｡`) read as `.`,
//!   lowercased, tokenised, numbers canonical, then the Unicode TR39
//!   confusable skeleton of each token.

use std::borrow::Cow;
use std::sync::LazyLock;

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// Default_Ignorable_Code_Point (Unicode DerivedCoreProperties), which
/// includes every bidi control (U+061C, U+200E-U+200F, U+202A-U+202E,
/// U+2066-U+2069), zero-width characters, the soft hyphen, variation
/// selectors and tag characters. Sorted, inclusive ranges.
const DEFAULT_IGNORABLE: &[(char, char)] = &[
    ('\u{ad}', '\u{ad}'),
    ('\u{34f}', '\u{34f}'),
    ('\u{61c}', '\u{61c}'),
    ('\u{115f}', '\u{1160}'),
    ('\u{17b4}', '\u{17b5}'),
    ('\u{180b}', '\u{180f}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{206f}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{fe00}', '\u{fe0f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{ffa0}', '\u{ffa0}'),
    ('\u{fff0}', '\u{fff8}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0000}', '\u{e0fff}'),
];

/// Whether `c` is a default-ignorable code point (invisible when rendered;
/// bidi controls included).
pub fn is_invisible(c: char) -> bool {
    DEFAULT_IGNORABLE
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn is_word_char(c: char) -> bool {
    // No ASCII character is a combining mark.
    if c.is_ascii() {
        return c.is_ascii_alphanumeric();
    }
    c.is_alphanumeric() || is_combining_mark(c)
}

/// Split `text` into tokens (see the module docs), numbers canonical.
fn tokenise(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    each_token(text, |t| out.push(t.to_owned()));
    out
}

/// Call `f` with each token of `text` in order (see the module docs),
/// numbers in canonical form; nothing is allocated but a rewritten number.
pub(crate) fn each_token(text: &str, f: impl FnMut(&str)) {
    if text.is_ascii() {
        each_ascii_token(text, f);
    } else {
        each_unicode_token(text, f);
    }
}

/// [`each_token`] for ASCII text, byte by byte: the same tokens (an ASCII
/// word character is a letter or digit, ASCII whitespace is tab to carriage
/// return and space), without decoding characters.
fn each_ascii_token(text: &str, mut f: impl FnMut(&str)) {
    let bytes = text.as_bytes();
    let at = |i: usize| bytes.get(i).copied();
    let mut i = 0;
    while let Some(c) = at(i) {
        if matches!(c, b'\t'..=b'\r' | b' ') {
            i += 1;
            continue;
        }
        if !c.is_ascii_alphanumeric() {
            f(text.get(i..i + 1).unwrap_or(""));
            i += 1;
            continue;
        }
        let start = i;
        let mut digits = true;
        while let Some(n) = at(i).filter(u8::is_ascii_alphanumeric) {
            digits &= n.is_ascii_digit();
            i += 1;
        }
        // A run of digits followed by `.` and a digit is a decimal.
        let decimal =
            digits && at(i) == Some(b'.') && at(i + 1).is_some_and(|d| d.is_ascii_digit());
        if decimal {
            i += 1;
            while at(i).is_some_and(|d| d.is_ascii_digit()) {
                i += 1;
            }
        }
        emit_word(text.get(start..i).unwrap_or(""), decimal, &mut f);
    }
}

/// Pass a word token on, a decimal in its canonical form. Only a run of
/// digits with its decimals can be rewritten (a plain run of digits is
/// already canonical: no sign, no fraction, leading zeros kept), so only
/// such a token may allocate.
#[inline]
fn emit_word(token: &str, decimal: bool, f: &mut impl FnMut(&str)) {
    match decimal.then(|| canonical_number(token)).flatten() {
        Some(n) if n != token => f(&n),
        _ => f(token),
    }
}

/// [`each_token`] for any text, character by character.
fn each_unicode_token(text: &str, mut f: impl FnMut(&str)) {
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if !is_word_char(c) {
            f(text.get(start..start + c.len_utf8()).unwrap_or(""));
            continue;
        }
        let mut end = start + c.len_utf8();
        while let Some(&(i, n)) = chars.peek() {
            if !is_word_char(n) {
                break;
            }
            end = i + n.len_utf8();
            chars.next();
        }
        // A run of ASCII digits followed by `.` and a digit is a decimal.
        let run = text.get(start..end).unwrap_or("");
        let digits = run.bytes().all(|b| b.is_ascii_digit());
        let decimal = digits
            && text
                .get(end..)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|r| r.starts_with(|d: char| d.is_ascii_digit()));
        if decimal {
            chars.next(); // the dot
            end += 1;
            while let Some(&(i, n)) = chars.peek() {
                if !n.is_ascii_digit() {
                    break;
                }
                end = i + 1;
                chars.next();
            }
        }
        emit_word(text.get(start..end).unwrap_or(""), decimal, &mut f);
    }
}

/// The canonical decimal form of a plain decimal number token
/// (`[+-]?[0-9]+(\.[0-9]+)?`): no `+` sign, no trailing fractional zeros, no
/// bare `.`, `-0` is `0`. Leading zeros are kept (`007` is an identifier,
/// not seven). Anything else (exponents, thousands separators) is not a
/// number and is returned as is.
pub fn canonical_number(token: &str) -> Option<String> {
    let (negative, digits) = match token.as_bytes().first() {
        Some(b'+') => (false, token.get(1..)?),
        Some(b'-') => (true, token.get(1..)?),
        _ => (false, token),
    };
    let (int, frac) = match digits.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (digits, None),
    };
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if let Some(f) = frac
        && (f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let frac = frac.map(|f| f.trim_end_matches('0')).unwrap_or("");
    let zero = int.bytes().all(|b| b == b'0') && frac.is_empty();
    let mut out = String::with_capacity(token.len());
    if negative && !zero {
        out.push('-');
    }
    out.push_str(int);
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    Some(out)
}

/// `text` in NFC (borrowed when it already is: NFC leaves ASCII as it is).
pub(crate) fn nfc(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.nfc().collect())
    }
}

/// Exact tokens of `text` (NFC, canonical numbers).
pub fn exact_tokens(text: &str) -> Vec<String> {
    tokenise(&nfc(text))
}

/// Caseless tokens: the exact tokens, lowercased.
pub fn caseless_tokens(exact: &[String]) -> Vec<String> {
    exact.iter().map(|t| t.to_lowercase()).collect()
}

/// Skeleton tokens of `text`: NFKC, invisible characters removed, the IDNA
/// full stop `。` read as `.` (as host names read it), lowercased,
/// tokenised, canonical numbers, then the TR39 skeleton.
pub fn skeleton_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    each_skeleton_token(text, |t| out.push(t.to_owned()));
    out
}

/// Call `f` with each of [`skeleton_tokens`] in order, reusing one buffer.
pub(crate) fn each_skeleton_token(text: &str, mut f: impl FnMut(&str)) {
    // NFKC leaves ASCII as it is, and no ASCII character is invisible.
    let folded = if text.is_ascii() {
        text.to_ascii_lowercase()
    } else {
        text.nfkc()
            .filter(|c| !is_invisible(*c))
            .map(|c| if c == '\u{3002}' { '.' } else { c })
            .collect::<String>()
            .to_lowercase()
    };
    // A skeleton may be longer than its token (`m` is `rn`).
    let mut buf = String::with_capacity(2 * folded.len());
    each_token(&folded, |t| {
        skeleton_into(t, &mut buf);
        f(&buf);
    });
}

/// The TR39 skeleton of every ASCII character, computed once, where it is
/// ASCII too: the skeleton of an ASCII token is then the concatenation of
/// its characters' (the skeleton maps character by character, and ASCII
/// has no combining mark for its final normalisation to reorder).
static ASCII_SKELETONS: LazyLock<Vec<Option<String>>> = LazyLock::new(|| {
    (0u8..128)
        .map(|b| {
            let s: String =
                unicode_security::skeleton(char::from(b).encode_utf8(&mut [0; 4])).collect();
            s.is_ascii().then_some(s)
        })
        .collect()
});

/// The TR39 confusable skeleton of `token`.
#[cfg(test)]
fn skeleton(token: &str) -> String {
    let mut out = String::new();
    skeleton_into(token, &mut out);
    out
}

/// The TR39 confusable skeleton of `token`, in `out` (cleared first).
fn skeleton_into(token: &str, out: &mut String) {
    out.clear();
    if token.is_ascii() {
        for b in token.bytes() {
            match ASCII_SKELETONS
                .get(usize::from(b))
                .and_then(Option::as_deref)
            {
                Some(s) => out.push_str(s),
                None => {
                    out.clear();
                    out.extend(unicode_security::skeleton(token));
                    return;
                }
            }
        }
        return;
    }
    out.extend(unicode_security::skeleton(token));
}

/// Alphanumeric characters in the exact tokens: what makes a value long
/// enough to be vouched for by occurrence in free text.
#[cfg(test)]
pub fn significant_chars(exact: &[String]) -> usize {
    exact
        .iter()
        .map(|t| t.chars().filter(|c| c.is_alphanumeric()).count())
        .sum()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The ASCII path gives TR39's skeleton, token by token, and the
        /// whole text's skeleton tokens as the general path does.
        #[test]
        fn the_ascii_path_is_the_general_one(text in "[ -~]{0,40}") {
            prop_assert_eq!(skeleton(&text), unicode_security::skeleton(&text).collect::<String>());
            let general: Vec<String> = tokenise(
                &text
                    .nfkc()
                    .filter(|c| !is_invisible(*c))
                    .collect::<String>()
                    .to_lowercase(),
            )
            .into_iter()
            .map(|t| unicode_security::skeleton(&t).collect())
            .collect();
            prop_assert_eq!(skeleton_tokens(&text), general);
            prop_assert_eq!(exact_tokens(&text), tokenise(&text.nfc().collect::<String>()));
        }
    }

    proptest! {
        /// The byte-wise ASCII tokeniser gives the character-wise one's
        /// tokens, control characters and numbers included.
        #[test]
        fn ascii_tokens_are_the_general_tokens(text in "[\\x00-\\x7f]{0,40}|[0-9. a-z+-]{0,40}") {
            let mut fast = Vec::new();
            each_ascii_token(&text, |t| fast.push(t.to_owned()));
            let mut general = Vec::new();
            each_unicode_token(&text, |t| general.push(t.to_owned()));
            prop_assert_eq!(fast, general);
        }
    }

    #[test]
    fn every_ascii_character_skeleton_is_tr39s() {
        for b in 0u8..128 {
            let c = char::from(b).to_string();
            assert_eq!(
                skeleton(&c),
                unicode_security::skeleton(&c).collect::<String>(),
                "{b}"
            );
        }
    }

    #[test]
    fn numbers_have_one_canonical_form() {
        assert_eq!(canonical_number("100").as_deref(), Some("100"));
        assert_eq!(canonical_number("100.0").as_deref(), Some("100"));
        assert_eq!(canonical_number("100.00").as_deref(), Some("100"));
        assert_eq!(canonical_number("98.70").as_deref(), Some("98.7"));
        assert_eq!(canonical_number("+5").as_deref(), Some("5"));
        assert_eq!(canonical_number("-0.0").as_deref(), Some("0"));
        assert_eq!(canonical_number("-4.50").as_deref(), Some("-4.5"));
        assert_eq!(canonical_number("007").as_deref(), Some("007"));
        assert_eq!(canonical_number("1e2"), None);
        assert_eq!(canonical_number("1,000"), None);
        assert_eq!(canonical_number("1."), None);
        assert_eq!(canonical_number(".5"), None);
        assert_eq!(canonical_number("-"), None);
        assert_eq!(canonical_number(""), None);
    }

    #[test]
    fn tokens_are_word_runs_numbers_and_single_symbols() {
        assert_eq!(
            exact_tokens("(visit www.a-b.com). Amount:\t98.70!"),
            [
                "(", "visit", "www", ".", "a", "-", "b", ".", "com", ")", ".", "Amount", ":",
                "98.7", "!"
            ]
        );
        assert_eq!(exact_tokens("  \n "), Vec::<String>::new());
        assert_eq!(
            exact_tokens("1.2.3 100. 2022-01-01"),
            ["1.2", ".", "3", "100", ".", "2022", "-", "01", "-", "01"]
        );
        assert_eq!(exact_tokens("US12.5"), ["US12", ".", "5"]);
        // Combining marks stay inside their word (Devanagari vowel signs).
        assert_eq!(exact_tokens("नमस्ते दुनिया"), ["नमस्ते", "दुनिया"]);
        assert_eq!(exact_tokens("b\u{301}ob"), ["b\u{301}ob"]);
    }

    #[test]
    fn invisible_characters_stay_in_exact_tokens_and_leave_skeletons() {
        let zw = "pay\u{200b}pal";
        assert_eq!(exact_tokens(zw), ["pay", "\u{200b}", "pal"]);
        assert_eq!(skeleton_tokens(zw), skeleton_tokens("paypal"));
        assert!(is_invisible('\u{202e}'));
        assert!(is_invisible('\u{2066}'));
        assert!(is_invisible('\u{e0041}'));
        assert!(!is_invisible('a'));
        assert!(!is_invisible(' '));
    }

    #[test]
    fn confusables_share_a_skeleton_but_not_an_exact_form() {
        let cyrillic = "p\u{430}ypal"; // Cyrillic small a
        assert_ne!(exact_tokens(cyrillic), exact_tokens("paypal"));
        assert_eq!(skeleton_tokens(cyrillic), skeleton_tokens("paypal"));
        let fullwidth = "\u{ff50}\u{ff41}\u{ff59}\u{ff50}\u{ff41}\u{ff4c}";
        assert_ne!(exact_tokens(fullwidth), exact_tokens("paypal"));
        assert_eq!(skeleton_tokens(fullwidth), skeleton_tokens("PayPal"));
    }

    #[test]
    fn canonically_equivalent_text_has_one_exact_form() {
        assert_eq!(exact_tokens("cafe\u{301}"), exact_tokens("caf\u{e9}"));
    }
}
