//! Targets embedded in text: the URLs, email addresses and host names found
//! inside an argument value (a message body that carries a link names a
//! target as surely as a `url` argument does).
//!
//! # What is extracted
//!
//! The text is read through a *folded view* used only to find targets:
//! each character is replaced by its NFKC compatibility form, lowercased;
//! the IDNA full stops `。` (U+3002) and `｡` (U+FF61) read as `.`; invisible
//! characters (default-ignorable and bidi controls, see
//! [`super::normalise::is_invisible`]) are skipped, so they never cut a
//! target in two. A target found in the folded view is returned as the
//! *original* text it covers, invisible and compatibility characters
//! included: it is then checked whole by the ordinary matching rules, so a
//! fullwidth, look-alike or zero-width-split link is a different value from
//! the genuine one (and denied as a look-alike of it when a vouching source
//! holds the genuine one).
//!
//! In the folded view:
//!
//! - A *label* is a run of letters, digits, combining marks, `-` and `_`
//!   (any script). A *host* is two or more labels joined by `.`, after
//!   dropping leading and trailing `.`, `-` and `_`; every label holds a
//!   letter or digit, and the last is either alphabetic with at least two
//!   letters (`com`, `рф`) or an IDNA `xn--` label; or four labels of one to
//!   three digits (an IPv4 address).
//! - A *scheme URL* is `scheme://` (the scheme: an ASCII letter, then ASCII
//!   letters, digits, `+`, `-`, `.`) followed by everything up to whitespace,
//!   a control character, `<`, `>`, `"` or a backtick. Its host is what lies
//!   between `//` and the first `/`, `?`, `#` or `\`, after the last `@`
//!   (userinfo) and before a `:port` (a bracketed IPv6 literal is kept
//!   whole); any non-empty host counts, `localhost` too.
//! - A *bare URL* is a host that stands on its own (not inside a scheme URL
//!   or an email address) with, if they follow at once, `:port` and a path,
//!   query or fragment (`/`, `?` or `#`, then up to the same terminators):
//!   `www.example.com`, `example.com/a?b`, `10.0.0.7:8080/x`. Linkifiers turn
//!   these into links, so they are URLs even without a scheme. (Anything of
//!   that shape counts, a file name like `notes.txt` too: over-extracting
//!   makes a target to check, never a target missed.)
//! - An address (below) whose local part is itself a host
//!   (`www.trusted.com@evil.io`, which a browser reads as userinfo and a
//!   host) is a URL too.
//! - An *email address* is a local part (letters, digits, marks and
//!   `.` `_` `-` `+` `%` `!` `#` `$` `&` `'` `*` `=` `?` `^` `{` `|` `}` `~`
//!   `/`, leading `.` and quote-like `'` `{` `|` `/` dropped) then `@` then a
//!   host, wherever it occurs (inside a URL too).
//!
//! URLs (scheme and bare) lose trailing `.` `,` `:` `;` `!` `?` `'` `*` and
//! an unbalanced closing `)`, `]` or `}`, as linkifiers do; nothing else is
//! trimmed, so a target is never shortened into a vouched prefix.
//!
//! [`Within::Urls`] yields every scheme URL, bare URL and address whose
//! local part is a host; [`Within::Emails`] every email address;
//! [`Within::Hosts`] every host: of each scheme URL, of each email address
//! (its domain), and every host-shaped run anywhere else (inside URL paths
//! too), never an email's local part. Targets come in text order; each
//! occurrence is a target of its own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use super::normalise::is_invisible;

/// Which targets a rule finds inside an argument's text (`within:`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Within {
    /// Every URL: `scheme://...`, and bare `host.tld[:port][/path]`.
    Urls,
    /// Every email address.
    Emails,
    /// Every host name: of URLs, of email addresses, and bare.
    Hosts,
}

impl Within {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Within::Urls => "urls",
            Within::Emails => "emails",
            Within::Hosts => "hosts",
        }
    }

    /// Whether targets of this kind are compared without case whatever the
    /// rule's `match:` says (host names and email addresses carry no case;
    /// a URL's path may).
    pub fn caseless(self) -> bool {
        matches!(self, Within::Emails | Within::Hosts)
    }

    /// What the rule finds, for `explain()`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Within::Urls => {
                "every URL (a `scheme://` URL, or a bare `host.tld` with any `:port` and path)"
            }
            Within::Emails => "every email address",
            Within::Hosts => "every host name (of a URL, of an email address, or bare)",
        }
    }
}

/// A target found inside a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedTarget {
    /// The original text of the target (invisible and compatibility
    /// characters included).
    pub text: String,
    /// Byte offset of its first character in the searched text.
    pub start: usize,
    /// Byte offset just past its last character.
    pub end: usize,
}

/// One character of the folded view, and the original character it came
/// from.
#[derive(Debug, Clone, Copy)]
struct Folded {
    c: char,
    orig: usize,
}

/// A span of the folded view, `[start, end)`.
type Span = (usize, usize);

fn fold(chars: &[(usize, char)]) -> Vec<Folded> {
    let mut out = Vec::with_capacity(chars.len());
    for (orig, &(_, c)) in chars.iter().enumerate() {
        // ASCII is its own compatibility form and never invisible.
        if c.is_ascii() {
            out.push(Folded {
                c: c.to_ascii_lowercase(),
                orig,
            });
            continue;
        }
        if is_invisible(c) {
            continue;
        }
        if matches!(c, '\u{3002}' | '\u{ff61}') {
            out.push(Folded { c: '.', orig });
            continue;
        }
        for n in std::iter::once(c).nfkc() {
            if is_invisible(n) {
                continue;
            }
            for l in n.to_lowercase() {
                out.push(Folded { c: l, orig });
            }
        }
    }
    out
}

fn is_label_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '-' || c == '_';
    }
    c.is_alphanumeric() || is_combining_mark(c)
}

fn is_host_char(c: char) -> bool {
    is_label_char(c) || c == '.'
}

fn is_terminator(c: char) -> bool {
    c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | '"' | '`')
}

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
}

fn is_local_char(c: char) -> bool {
    if !c.is_ascii() {
        return c.is_alphanumeric() || is_combining_mark(c);
    }
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            '.' | '_'
                | '-'
                | '+'
                | '%'
                | '!'
                | '#'
                | '$'
                | '&'
                | '\''
                | '*'
                | '='
                | '?'
                | '^'
                | '{'
                | '|'
                | '}'
                | '~'
                | '/'
        )
}

/// The folded view with the spans of everything found in it.
struct Scan {
    f: Vec<Folded>,
    /// Scheme URLs and their hosts.
    schemes: Vec<(Span, Option<Span>)>,
    /// Email addresses and their domains.
    emails: Vec<(Span, Span)>,
}

impl Scan {
    fn new(f: Vec<Folded>) -> Self {
        let mut scan = Self {
            f,
            schemes: Vec::new(),
            emails: Vec::new(),
        };
        scan.find_schemes();
        scan.find_emails();
        scan
    }

    fn at(&self, i: usize) -> Option<char> {
        self.f.get(i).map(|x| x.c)
    }

    /// The end of a URL body starting at `from`: up to a terminator, then
    /// trailing punctuation and unbalanced closers trimmed (not below
    /// `floor`).
    fn url_end(&self, from: usize, floor: usize) -> usize {
        let mut end = from;
        while self.at(end).is_some_and(|c| !is_terminator(c)) {
            end += 1;
        }
        self.trim_url(floor, end)
    }

    fn trim_url(&self, start: usize, mut end: usize) -> usize {
        while end > start {
            let Some(last) = self.at(end - 1) else { break };
            let unbalanced = |open: char, close: char| {
                let (mut o, mut c) = (0usize, 0usize);
                for x in self.f.get(start..end).unwrap_or(&[]) {
                    if x.c == open {
                        o += 1;
                    } else if x.c == close {
                        c += 1;
                    }
                }
                c > o
            };
            let trim = match last {
                '.' | ',' | ':' | ';' | '!' | '?' | '\'' | '*' => true,
                ')' => unbalanced('(', ')'),
                ']' => unbalanced('[', ']'),
                '}' => unbalanced('{', '}'),
                _ => false,
            };
            if !trim {
                break;
            }
            end -= 1;
        }
        end
    }

    fn find_schemes(&mut self) {
        let n = self.f.len();
        let mut i = 0;
        while i + 2 < n {
            let is_sep = self.at(i) == Some(':')
                && self.at(i + 1) == Some('/')
                && self.at(i + 2) == Some('/');
            if !is_sep {
                i += 1;
                continue;
            }
            let mut start = i;
            while start > 0 && self.at(start - 1).is_some_and(is_scheme_char) {
                start -= 1;
            }
            while start < i && !self.at(start).is_some_and(|c| c.is_ascii_alphabetic()) {
                start += 1;
            }
            let body = i + 3;
            let end = self.url_end(body, body);
            if start == i || end == body {
                i += 3;
                continue;
            }
            // The authority, its userinfo and port.
            let mut auth_end = body;
            while auth_end < end && !matches!(self.at(auth_end), Some('/' | '?' | '#' | '\\')) {
                auth_end += 1;
            }
            let mut host_start = body;
            for k in body..auth_end {
                if self.at(k) == Some('@') {
                    host_start = k + 1;
                }
            }
            let mut host_end = host_start;
            if self.at(host_start) == Some('[') {
                while host_end < auth_end && self.at(host_end) != Some(']') {
                    host_end += 1;
                }
                host_end = (host_end + 1).min(auth_end);
            } else {
                while host_end < auth_end && self.at(host_end) != Some(':') {
                    host_end += 1;
                }
            }
            let host = (host_end > host_start).then_some((host_start, host_end));
            self.schemes.push(((start, end), host));
            i = end.max(i + 3);
        }
    }

    /// A host in `[from, to)` after trimming; `None` if it is not one.
    fn host_in(&self, mut from: usize, mut to: usize) -> Option<Span> {
        // Most runs are plain words: no dot, no host.
        if !self.f.get(from..to)?.iter().any(|x| x.c == '.') {
            return None;
        }
        let edge = |c: Option<char>| matches!(c, Some('.' | '-' | '_'));
        while from < to && edge(self.at(from)) {
            from += 1;
        }
        while to > from && edge(self.at(to - 1)) {
            to -= 1;
        }
        let text: String = self.f.get(from..to)?.iter().map(|x| x.c).collect();
        let labels: Vec<&str> = text.split('.').collect();
        if labels.len() < 2
            || labels
                .iter()
                .any(|l| !l.chars().any(|c| c.is_alphanumeric()))
        {
            return None;
        }
        let tld = labels.last()?;
        let alphabetic_tld = tld.chars().count() >= 2
            && tld
                .chars()
                .all(|c| c.is_alphabetic() || is_combining_mark(c));
        let ipv4 = labels.len() == 4
            && labels
                .iter()
                .all(|l| (1..=3).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_digit()));
        (alphabetic_tld || tld.starts_with("xn--") || ipv4).then_some((from, to))
    }

    fn find_emails(&mut self) {
        for i in 0..self.f.len() {
            if self.at(i) != Some('@') {
                continue;
            }
            let mut start = i;
            while start > 0 && self.at(start - 1).is_some_and(is_local_char) {
                start -= 1;
            }
            while start < i && matches!(self.at(start), Some('.' | '\'' | '{' | '|' | '/')) {
                start += 1;
            }
            let mut to = i + 1;
            while self.at(to).is_some_and(is_host_char) {
                to += 1;
            }
            if start == i {
                continue;
            }
            // The domain starts right after `@`: a leading `.` or `-` is not
            // trimmed away into another address.
            if let Some((a, b)) = self.host_in(i + 1, to)
                && a == i + 1
            {
                self.emails.push(((start, b), (a, b)));
            }
        }
    }

    /// Maximal runs of host characters, each as `[start, end)`.
    fn runs(&self) -> Vec<Span> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.f.len() {
            if !self.at(i).is_some_and(is_host_char) {
                i += 1;
                continue;
            }
            let start = i;
            while self.at(i).is_some_and(is_host_char) {
                i += 1;
            }
            out.push((start, i));
        }
        out
    }

    fn inside(span: Span, spans: impl IntoIterator<Item = Span>) -> bool {
        spans.into_iter().any(|(a, b)| a <= span.0 && span.1 <= b)
    }

    fn email_spans(&self) -> impl Iterator<Item = Span> + '_ {
        self.emails.iter().map(|(s, _)| *s)
    }

    fn local_parts(&self) -> impl Iterator<Item = Span> + '_ {
        self.emails
            .iter()
            .map(|((a, _), (d, _))| (*a, d.saturating_sub(1)))
    }

    fn urls(&self) -> Vec<Span> {
        let mut out: Vec<Span> = self.schemes.iter().map(|(s, _)| *s).collect();
        // `www.trusted.com@evil.io` is an address, and to a browser a URL
        // with userinfo that leads to `evil.io`: an address whose local part
        // is a host is a URL too.
        for (span, (domain, _)) in &self.emails {
            if Self::inside(*span, self.schemes.iter().map(|(s, _)| *s)) {
                continue;
            }
            if self.host_in(span.0, domain.saturating_sub(1)).is_some() {
                out.push(*span);
            }
        }
        let mut taken_to = 0;
        for run in self.runs() {
            if run.0 < taken_to
                || Self::inside(run, self.schemes.iter().map(|(s, _)| *s))
                || Self::inside(run, self.email_spans())
            {
                continue;
            }
            let Some((a, b)) = self.host_in(run.0, run.1) else {
                continue;
            };
            let mut end = b;
            if b == run.1 {
                if self.at(end) == Some(':') && self.at(end + 1).is_some_and(|c| c.is_ascii_digit())
                {
                    end += 1;
                    while self.at(end).is_some_and(|c| c.is_ascii_digit()) {
                        end += 1;
                    }
                }
                if matches!(self.at(end), Some('/' | '?' | '#')) {
                    end = self.url_end(end, b);
                }
            }
            out.push((a, end));
            taken_to = end;
        }
        out.sort_unstable();
        out
    }

    fn hosts(&self) -> Vec<Span> {
        let mut out: Vec<Span> = self.schemes.iter().filter_map(|(_, h)| *h).collect();
        out.extend(self.emails.iter().map(|(_, d)| *d));
        for run in self.runs() {
            if Self::inside(run, self.local_parts()) {
                continue;
            }
            if let Some(h) = self.host_in(run.0, run.1) {
                out.push(h);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Every target of kind `within` in `text`, in text order (see the module
/// docs for what is extracted).
pub fn embedded_targets(text: &str, within: Within) -> Vec<EmbeddedTarget> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let scan = Scan::new(fold(&chars));
    let spans = match within {
        Within::Urls => scan.urls(),
        Within::Emails => scan.email_spans().collect(),
        Within::Hosts => scan.hosts(),
    };
    let mut out = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        let (Some(first), Some(last)) =
            (scan.f.get(a), b.checked_sub(1).and_then(|l| scan.f.get(l)))
        else {
            continue;
        };
        let (Some(&(start, _)), Some(&(last_at, last_char))) =
            (chars.get(first.orig), chars.get(last.orig))
        else {
            continue;
        };
        let end = last_at + last_char.len_utf8();
        if let Some(t) = text.get(start..end) {
            out.push(EmbeddedTarget {
                text: t.to_owned(),
                start,
                end,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str, within: Within) -> Vec<String> {
        embedded_targets(text, within)
            .into_iter()
            .map(|t| {
                assert_eq!(&text[t.start..t.end], t.text);
                t.text
            })
            .collect()
    }

    #[test]
    fn scheme_and_bare_urls_with_their_punctuation_trimmed() {
        let text = "See https://Example.com/a_(b)?q=1#f, (www.restaurant-zurich.com). \
                    Or <http://localhost:8080/x> and example.org/path/to?x=y! \
                    mail dora@gmail.com; ip 10.0.0.7:8443/admin. not-a-host 98.70 v1.2";
        assert_eq!(
            found(text, Within::Urls),
            [
                "https://Example.com/a_(b)?q=1#f",
                "www.restaurant-zurich.com",
                "http://localhost:8080/x",
                "example.org/path/to?x=y",
                "10.0.0.7:8443/admin",
            ]
        );
        assert_eq!(found(text, Within::Emails), ["dora@gmail.com"]);
        assert_eq!(
            found(text, Within::Hosts),
            [
                "Example.com",
                "www.restaurant-zurich.com",
                "localhost",
                "example.org",
                "gmail.com",
                "10.0.0.7",
            ]
        );
    }

    #[test]
    fn nothing_found_in_plain_text_and_numbers() {
        for text in [
            "",
            "Car Rental\t\t\t98.70",
            "SE3550000000054910000003;50.0;US122000000121212121212;1100.0",
            "Congrats on being the 1-th most active user!",
            "version 1.2.3 at 12:30, a.b? no: x.1",
            "://nothing here",
        ] {
            for within in [Within::Urls, Within::Emails, Within::Hosts] {
                assert!(found(text, within).is_empty(), "{text:?} {within:?}");
            }
        }
        assert!(found("@ @@ a@ @b.com x@.com", Within::Emails).is_empty());
        // A bare `domain.tld` counts, file names too (over-extraction).
        assert_eq!(found("open notes.txt", Within::Urls), ["notes.txt"]);
    }

    #[test]
    fn userinfo_ports_and_ipv6_give_the_real_host() {
        let text = "http://trusted.com@evil.io:80/x https://[2001:db8::1]:443/ ftp://a.b";
        assert_eq!(
            found(text, Within::Urls),
            [
                "http://trusted.com@evil.io:80/x",
                "https://[2001:db8::1]:443/",
                "ftp://a.b"
            ]
        );
        let hosts = found(text, Within::Hosts);
        assert!(hosts.contains(&"evil.io".to_owned()), "{hosts:?}");
        assert!(hosts.contains(&"[2001:db8::1]".to_owned()), "{hosts:?}");
        // The userinfo looks like an address: over-extracted as one.
        assert_eq!(found(text, Within::Emails), ["trusted.com@evil.io"]);
        // A backslash ends the authority but not the URL.
        assert_eq!(
            found(r"https://trusted.com\@evil.io", Within::Urls),
            [r"https://trusted.com\@evil.io"]
        );
    }

    #[test]
    fn emails_and_their_local_parts() {
        let text = "write 'dora@gmail.com' or <a.b+tag@Sub.Example.ORG>, not a@b or x@.com";
        assert_eq!(
            found(text, Within::Emails),
            ["dora@gmail.com", "a.b+tag@Sub.Example.ORG"]
        );
        // A local part is never a host; the domain is. An address whose
        // local part is a host is also a URL (userinfo to a browser).
        assert!(found("dora@company.com", Within::Urls).is_empty());
        assert_eq!(
            found("go www.trusted.com@evil.io", Within::Urls),
            ["www.trusted.com@evil.io"]
        );
        assert_eq!(
            found("john.doe@company.com", Within::Hosts),
            ["company.com"]
        );
        assert_eq!(
            found("mailto:evil!victim@x.com", Within::Emails),
            ["evil!victim@x.com"]
        );
    }

    #[test]
    fn invisible_and_compatibility_characters_never_cut_a_target() {
        // Zero-width space, soft hyphen and a bidi control inside: one
        // target, returned with them.
        for text in [
            "go to www.trus\u{200b}ted.com now",
            "go to www.trusted\u{ad}.com now",
            "go to www.trusted.c\u{202e}om now",
        ] {
            let urls = found(text, Within::Urls);
            assert_eq!(urls.len(), 1, "{text:?}");
            assert!(urls[0].starts_with("www.trus"), "{urls:?}");
            assert!(urls[0].ends_with("om"), "{urls:?}");
        }
        // Fullwidth letters and dots, ideographic full stops, a one-dot
        // leader, Cyrillic letters: found, in their original form.
        for text in [
            "\u{ff57}\u{ff57}\u{ff57}\u{ff0e}evil\u{ff0e}com",
            "www\u{3002}evil\u{3002}com",
            "www\u{2024}evil\u{2024}com",
            "www.\u{435}vil.com",
            "HTTPS\u{ff1a}\u{ff0f}\u{ff0f}evil.com/x",
        ] {
            assert_eq!(found(text, Within::Urls), [text], "{text:?}");
        }
        assert_eq!(
            found("d\u{200b}ora@gmail.com", Within::Emails),
            ["d\u{200b}ora@gmail.com"]
        );
    }

    #[test]
    fn a_target_is_never_shortened_into_a_prefix() {
        // Everything up to a terminator stays in the URL.
        assert_eq!(
            found("https://trusted.com/a{b}|c^d~e", Within::Urls),
            ["https://trusted.com/a{b}|c^d~e"]
        );
        // A host glued to more labels is one host.
        assert_eq!(
            found("www.trusted.com.evil.io/x", Within::Urls),
            ["www.trusted.com.evil.io/x"]
        );
        // Whitespace really ends it: the rest is checked on its own.
        assert_eq!(
            found("www.trusted.com\u{a0}.evil.io", Within::Urls),
            ["www.trusted.com", "evil.io"]
        );
    }
}
