//! Tool-name normalisation: the one spelling every name is matched in.
//!
//! [`canonical_name`] reads a name the way a person reads it on screen and
//! writes it back in a single canonical spelling:
//!
//! 1. **Compatibility forms.** NFKC, so fullwidth letters (`ｍｅｍｏｒｙ`),
//!    ligatures, the Kelvin sign and friends become their plain forms.
//! 2. **Invisible characters.** Default-ignorable and bidi-control code
//!    points (zero-width space and joiners, soft hyphen, variation
//!    selectors, tag characters, ...) are removed, so they join rather than
//!    split the letters around them: `memo\u{200b}ry` is `memory`.
//! 3. **Combining marks** are removed (after decomposition), so
//!    `me\u{301}mory` is `memory`.
//! 4. **Confusables.** Each letter or digit is lowercased, replaced by its
//!    Unicode TR39 confusable skeleton and lowercased again, so Cyrillic `е`,
//!    Greek `ο` and the digit `0` read as the Latin letters they look like.
//!    The skeleton is case-sensitive (capital `I` is `l`) and case is folded
//!    here, so `i`, `I`, `l` and `1` are one letter, written `l`; `m` is
//!    written `rn`, its skeleton. The canonical spelling is a matching form,
//!    not a display form.
//! 5. **Words.** A run of characters that are not letters or digits is one
//!    separator. `_`, `-` and whitespace separate *words* and are written
//!    `_`; anything else (`.`, `/`, `:`, `@`, ...) and a run of two or more
//!    `_` (`mcp__srv__tool`) separates *namespaces* (a client or server
//!    prefix) and is written `.`. A lowercase letter followed by an
//!    uppercase one (camelCase) also starts a word. Leading and trailing
//!    separators are dropped.
//!
//! The steps are repeated until nothing changes (a skeleton can itself be
//! lowercased into a letter with a skeleton of its own), so the result is a
//! fixed point: `canonical_name(canonical_name(x)) == canonical_name(x)`.
//! The output holds only letters and digits (ASCII for everything with a
//! Latin look-alike), `_` and `.`, with no separator at either end and no
//! two separators in a row.

use std::sync::LazyLock;

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use crate::provenance::normalise::is_invisible;

/// Passes after the first before giving up on a fixed point. Every pass only
/// maps letters to their skeletons, which converge in one or two steps; the
/// bound keeps a pathological input from looping.
const MAX_EXTRA_PASSES: usize = 4;

/// The soft word boundary of the matching form: a camelCase hump. It starts
/// a word but does not break one, so `memoryBlock` and `mEmOrYbLoCk` still
/// hold the unbroken word `memoryblock`.
pub(super) const SOFT: char = '\u{1}';

/// The canonical spelling of a tool name (or a config key): see the module
/// docs. Never fails; the empty string for a name with no letter or digit.
pub fn canonical_name(name: &str) -> String {
    matching_form(name).chars().filter(|&c| c != SOFT).collect()
}

/// The canonical spelling with camelCase humps kept as [`SOFT`] boundaries.
pub(super) fn matching_form(name: &str) -> String {
    let mut current = pass(name, true);
    for _ in 0..MAX_EXTRA_PASSES {
        let next = pass(&current, false);
        if next == current {
            break;
        }
        current = next;
    }
    current
}

/// The letters and digits of a canonical name, separators removed: the form
/// in which two words may be written joined or apart (`memory_block`,
/// `memoryblock` and `memoryBlock` all read `memoryblock`).
pub fn glued(canonical: &str) -> String {
    canonical.chars().filter(|c| !is_separator(*c)).collect()
}

/// Whether `c` is a separator of the matching form.
pub(super) fn is_separator(c: char) -> bool {
    c == '_' || c == '.' || c == SOFT
}

/// Which separator a pending run of non-word characters becomes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Sep {
    None,
    Soft,
    Word,
    Namespace,
}

/// One pass. On the first, `SOFT` in the input is an ordinary (namespace)
/// separator; on later ones, input that is already a matching form, it is
/// kept.
fn pass(name: &str, first: bool) -> String {
    let mut out = String::with_capacity(name.len());
    let mut pending = Sep::None;
    let mut prev_sep: Option<char> = None;
    let mut prev_lower = false;
    let emit = |out: &mut String, pending: &mut Sep, f: char| {
        match *pending {
            _ if out.is_empty() => {}
            Sep::None => {}
            Sep::Soft => out.push(SOFT),
            Sep::Word => out.push('_'),
            Sep::Namespace => out.push('.'),
        }
        *pending = Sep::None;
        out.push(f);
    };
    for raw in name.chars() {
        if is_invisible(raw) || is_combining_mark(raw) {
            continue;
        }
        if !first && raw == SOFT {
            pending = pending.max(Sep::Soft);
            continue;
        }
        // A letter or digit is read through its skeleton before NFKC (NFKC
        // would turn some look-alikes, the lunate sigma `ϲ`, into letters
        // TR39 no longer maps); anything else through NFKC first, which
        // turns fullwidth and other compatibility forms into what they
        // stand for. NFKC leaves an ASCII character as it is.
        let one = [raw];
        let composed: Vec<char>;
        let parts: &[char] = if raw.is_ascii() || raw.is_alphanumeric() {
            &one
        } else {
            composed = raw.to_string().nfkc().collect();
            &composed
        };
        for &c in parts {
            if is_invisible(c) || is_combining_mark(c) {
                continue;
            }
            if c.is_alphanumeric() {
                if prev_lower && c.is_uppercase() {
                    pending = pending.max(Sep::Soft);
                }
                prev_lower = c.is_lowercase();
                prev_sep = None;
                let folded;
                let letters: &[char] = match ASCII_FOLDS.get(c as usize) {
                    Some(f) => f,
                    None => {
                        folded = fold(c);
                        &folded
                    }
                };
                for &f in letters {
                    if f.is_alphanumeric() {
                        emit(&mut out, &mut pending, f);
                    } else {
                        pending = pending.max(Sep::Word);
                    }
                }
                continue;
            }
            let sep = if c == '_' {
                if prev_sep == Some('_') {
                    Sep::Namespace
                } else {
                    Sep::Word
                }
            } else if c == '-' || c.is_whitespace() {
                Sep::Word
            } else {
                Sep::Namespace
            };
            pending = pending.max(sep);
            prev_lower = false;
            prev_sep = Some(c);
        }
    }
    out
}

/// [`fold`] of every ASCII character, computed once: names are mostly
/// ASCII, and folding a character through the skeleton tables costs more
/// than the rest of a pass.
static ASCII_FOLDS: LazyLock<Vec<Vec<char>>> =
    LazyLock::new(|| (0u8..128).map(|b| fold(char::from(b))).collect());

/// One letter or digit read as what it looks like: lowercased, its TR39
/// skeleton, combining marks removed, NFKC, lowercased again, and `i` read
/// as `l`.
///
/// The skeleton is case-sensitive (capital `I` is `l`, small `i` is `i`)
/// and case is folded here, so the two classes meet: `i`, `I`, `l` and `1`
/// are one letter, written `l`.
fn fold(c: char) -> Vec<char> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4];
    for lower in c.to_lowercase() {
        let skeleton: String = unicode_security::skeleton(lower.encode_utf8(&mut buf))
            .filter(|s| !is_combining_mark(*s) && !is_invisible(*s))
            .collect();
        for k in skeleton.nfkc() {
            if is_combining_mark(k) || is_invisible(k) {
                continue;
            }
            out.extend(k.to_lowercase().map(|l| if l == 'i' { 'l' } else { l }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ASCII shortcuts of a pass are what the general path computes:
    /// NFKC leaves every ASCII character as it is, and the fold table is
    /// [`fold`]'s.
    #[test]
    fn the_ascii_shortcuts_are_the_general_path() {
        for b in 0u8..128 {
            let c = char::from(b);
            assert_eq!(
                c.to_string().nfkc().collect::<String>(),
                c.to_string(),
                "{b}"
            );
            assert_eq!(ASCII_FOLDS[usize::from(b)], fold(c), "{b}");
        }
    }
}
