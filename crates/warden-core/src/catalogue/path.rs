//! Lexical normalisation of relative paths for `path_within`.
//!
//! The policy is deliberately stricter than any filesystem: anything a
//! handler, a shell or a URL decoder might read differently from us is
//! refused instead of interpreted. In particular percent-encoded octets are
//! rejected, not decoded: `%2e%2e` would be harmless to a POSIX filesystem
//! but dangerous behind a handler that decodes, and decoding "until stable"
//! still depends on which layer decodes how often. Refusing `%XX` (which
//! includes `%25`, so double encoding goes too) leaves one meaning only. A
//! lone `%` not followed by two hex digits is an ordinary character.
//!
//! For the same reason a path must already be in the one form every layer
//! agrees on: a component that NFKC normalisation would change (fullwidth
//! `．．`, the one-dot leader `․`, fullwidth solidus `／`, ligatures,
//! compatibility digits) or that holds an invisible character (zero-width
//! characters, the soft hyphen, bidi controls such as the right-to-left
//! override, variation selectors, tags) or a Unicode line or paragraph
//! separator is refused, not folded: a filesystem, an archive tool or a
//! reviewer's screen may each read it differently.
//!
//! Symbolic links are out of scope: the check is lexical, and handlers must
//! not follow links out of their root.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;

use crate::provenance::normalise::is_invisible;

/// Why a path was refused before glob matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathProblem {
    /// Empty, or normalises to the root itself (`.`, `a/..`).
    Empty,
    /// NUL or another control character.
    ControlCharacter,
    /// A backslash (a Windows separator or an escape, never a name byte).
    Backslash,
    /// A leading `/` or a drive letter (`C:`).
    Absolute,
    /// A `%` followed by two hex digits.
    PercentEncoded,
    /// A `..` that climbs above the root.
    EscapesRoot,
    /// A character NFKC normalisation would change, an invisible
    /// (default-ignorable, bidi control) character or a non-ASCII
    /// whitespace character.
    AmbiguousUnicode,
}

impl PathProblem {
    /// `Empty` is merely outside every glob and `AmbiguousUnicode` has its
    /// own reason; the rest are traversal attempts.
    pub(crate) fn is_traversal(self) -> bool {
        !matches!(self, PathProblem::Empty | PathProblem::AmbiguousUnicode)
    }
}

/// Normalise `raw`: refuse tricks, then resolve `.`, `..` and empty segments
/// lexically. Borrows when `raw` is already normal (the common case), so the
/// success path does not allocate.
pub(crate) fn normalise(raw: &str) -> Result<Cow<'_, str>, PathProblem> {
    if raw.is_empty() {
        return Err(PathProblem::Empty);
    }
    if raw.chars().any(char::is_control) {
        return Err(PathProblem::ControlCharacter);
    }
    if raw.contains('\\') {
        return Err(PathProblem::Backslash);
    }
    let bytes = raw.as_bytes();
    let drive = matches!(bytes, [letter, b':', ..] if letter.is_ascii_alphabetic());
    if raw.starts_with('/') || drive {
        return Err(PathProblem::Absolute);
    }
    if has_percent_escape(bytes) {
        return Err(PathProblem::PercentEncoded);
    }
    if !raw.is_ascii() && is_ambiguous(raw) {
        return Err(PathProblem::AmbiguousUnicode);
    }

    let already_normal = raw.split('/').all(|seg| !matches!(seg, "" | "." | ".."));
    if already_normal {
        return Ok(Cow::Borrowed(raw));
    }

    let mut kept: Vec<&str> = Vec::new();
    for seg in raw.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if kept.pop().is_none() {
                    return Err(PathProblem::EscapesRoot);
                }
            }
            name => kept.push(name),
        }
    }
    if kept.is_empty() {
        return Err(PathProblem::Empty);
    }
    Ok(Cow::Owned(kept.join("/")))
}

/// Whether `raw` holds a character that NFKC would change, an invisible
/// character, or whitespace other than the ASCII space.
fn is_ambiguous(raw: &str) -> bool {
    raw.chars()
        .any(|c| is_invisible(c) || (c.is_whitespace() && c != ' '))
        || !raw.nfkc().eq(raw.chars())
}

fn has_percent_escape(bytes: &[u8]) -> bool {
    bytes
        .windows(3)
        .any(|w| matches!(w, [b'%', a, b] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> String {
        normalise(raw).unwrap().into_owned()
    }

    #[test]
    fn normal_paths_are_borrowed() {
        assert!(matches!(
            normalise("internal/a.txt"),
            Ok(Cow::Borrowed("internal/a.txt"))
        ));
        assert!(matches!(normalise("50%.txt"), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalise("a%2"), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalise("a%zz"), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn dots_and_empty_segments_resolve() {
        assert_eq!(ok("./internal/a.txt"), "internal/a.txt");
        assert_eq!(ok("internal/a/../b.txt"), "internal/b.txt");
        assert_eq!(ok("internal//a.txt"), "internal/a.txt");
        assert_eq!(ok("internal/./a/"), "internal/a");
        assert_eq!(ok("internal/../secret.txt"), "secret.txt");
        assert_eq!(ok("a/../internal/x"), "internal/x");
        assert_eq!(ok("..."), "...");
        assert_eq!(ok("..a/b"), "..a/b");
    }

    #[test]
    fn tricks_are_refused() {
        use PathProblem::*;
        let cases = [
            ("", Empty),
            (".", Empty),
            ("a/..", Empty),
            ("./", Empty),
            ("../x", EscapesRoot),
            ("internal/../../x", EscapesRoot),
            ("a/../../a", EscapesRoot),
            ("/etc/passwd", Absolute),
            ("//server/share", Absolute),
            ("C:/x", Absolute),
            ("c:x", Absolute),
            ("internal\\..\\x", Backslash),
            ("internal/\u{0}x", ControlCharacter),
            ("internal/a\nb", ControlCharacter),
            ("internal/%2e%2e/x", PercentEncoded),
            ("internal/%2E%2E/x", PercentEncoded),
            ("internal/%252e%252e/x", PercentEncoded),
            ("internal%2fx", PercentEncoded),
        ];
        for (raw, want) in cases {
            assert_eq!(normalise(raw), Err(want), "{raw:?}");
        }
        assert!(!Empty.is_traversal());
        assert!(!AmbiguousUnicode.is_traversal());
        assert!(EscapesRoot.is_traversal());
    }
}
