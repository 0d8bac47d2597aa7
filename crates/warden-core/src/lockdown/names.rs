//! The tool-name heuristic: whether a name is a prompt-block write surface
//! (the rules are in the module docs of [`crate::lockdown`]).

/// The two words of [`WRITE_SURFACE_NAMESPACE`](super::WRITE_SURFACE_NAMESPACE).
pub(super) const NAMESPACE_WORDS: (&str, &str) = ("memory", "block");

/// The two words of each entry of
/// [`WRITE_SURFACE_VERB_FAMILIES`](super::WRITE_SURFACE_VERB_FAMILIES), same
/// order.
pub(super) const VERB_FAMILY_WORDS: [(&str, &str); 7] = [
    ("edit", "block"),
    ("write", "block"),
    ("update", "block"),
    ("append", "block"),
    ("replace", "block"),
    ("rewrite", "block"),
    ("block", "edit"),
];

/// Whether a tool called `name` may write a prompt block.
///
/// Case-insensitive, indifferent to surrounding whitespace, to the separator
/// style (`_ - . / :`, spaces, camelCase) and to a client's server prefix. The
/// exact rules, and what no name check can catch, are in the module docs. Does
/// not allocate.
pub fn is_write_surface_tool_name(name: &str) -> bool {
    let mut rest = name.trim();
    let mut at_word_start = true;
    loop {
        if starts_with_words(rest, NAMESPACE_WORDS) {
            return true;
        }
        if at_word_start
            && VERB_FAMILY_WORDS
                .iter()
                .any(|&words| starts_with_words(rest, words))
        {
            return true;
        }
        let mut chars = rest.chars();
        match chars.next() {
            None => return false,
            Some(c) => at_word_start = fold(c).is_none(),
        }
        rest = chars.as_str();
    }
}

/// Whether `s` starts with the two `words`, with any run of separators
/// (possibly none) between them.
fn starts_with_words(s: &str, (first, second): (&str, &str)) -> bool {
    strip_word(s, first)
        .map(|rest| rest.trim_start_matches(|c| fold(c).is_none()))
        .and_then(|rest| strip_word(rest, second))
        .is_some()
}

/// `s` after `word` (lowercase ASCII), if `s` starts with it once folded.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let mut chars = s.chars();
    for expected in word.chars() {
        if chars.next().and_then(fold) != Some(expected) {
            return None;
        }
    }
    Some(chars.as_str())
}

/// The lowercase ASCII letter or digit `c` stands for, or `None` if `c` is a
/// separator.
pub(super) fn fold(c: char) -> Option<char> {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric().then(|| c.to_ascii_lowercase());
    }
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) if l.is_ascii_alphanumeric() => Some(l),
        _ => None,
    }
}
