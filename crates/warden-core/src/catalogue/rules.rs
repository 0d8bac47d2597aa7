//! Compiled argument rules and their checks.
//!
//! Everything that can be prepared is prepared in [`CompiledRule::compile`]:
//! globs become a `GlobSet`, regexes are anchored and built once, hosts,
//! schemes and media types are parsed and lowercased. A check then only
//! walks the argument and compares; it allocates nothing unless it fails (or
//! a path needs `.`/`..` resolution).

use std::io;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};

use super::host::{HostAllow, HostCompileError, HostProblem};
use super::path::{PathProblem, normalise};
use super::reasons;
use super::spec::{ArgumentRule, Classification};
use crate::decision::Reason;
use crate::ids::{ActionName, check_identifier};

use super::CatalogueError;

/// Compiled size limit of a `pattern` regex (bytes of the compiled program).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A parsed argument reference: `path` or `target.path`.
#[derive(Debug, Clone)]
pub(crate) struct ArgPath {
    name: Box<str>,
    segments: Box<[Box<str>]>,
}

enum Lookup<'a> {
    Found(&'a Value),
    Missing,
    /// An intermediate segment is present but not an object.
    NotAnObject,
}

impl ArgPath {
    fn parse(name: &str) -> Result<Self, &'static str> {
        check_identifier(name)
            .map_err(|_| "argument names are 1 to 128 characters from `A-Z a-z 0-9 . _ : -`")?;
        let segments: Vec<Box<str>> = name.split('.').map(Box::from).collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err("a dotted argument path has an empty segment");
        }
        Ok(Self {
            name: name.into(),
            segments: segments.into_boxed_slice(),
        })
    }

    /// The name as written in the bundle (validated charset, safe in reasons).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn lookup<'a>(&self, args: &'a Map<String, Value>) -> Lookup<'a> {
        let mut segments = self.segments.iter();
        let Some(first) = segments.next() else {
            return Lookup::Missing;
        };
        let Some(mut current) = args.get(&**first) else {
            return Lookup::Missing;
        };
        for seg in segments {
            let Value::Object(map) = current else {
                return Lookup::NotAnObject;
            };
            match map.get(&**seg) {
                Some(v) => current = v,
                None => return Lookup::Missing,
            }
        }
        Lookup::Found(current)
    }
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct CompiledRule {
    argument: ArgPath,
    optional: bool,
    check: Check,
}

#[derive(Debug, Clone)]
enum Check {
    PathWithin(GlobSet),
    HostIn(HostAllow),
    MaxBytes(u64),
    Pattern(Regex),
    MimeIn(Box<[MimePattern]>),
    ClassificationAtMost(Classification),
}

/// An allowed media type; `None` is the `*` wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MimePattern {
    top: Option<String>,
    sub: Option<String>,
}

impl CompiledRule {
    /// Compile rule number `index` of `action`.
    pub(crate) fn compile(
        action: &ActionName,
        index: usize,
        rule: &ArgumentRule,
    ) -> Result<Self, CatalogueError> {
        let argument =
            ArgPath::parse(rule.argument()).map_err(|message| CatalogueError::InvalidArgument {
                action: action.clone(),
                rule: index,
                argument: rule.argument().to_owned(),
                message,
            })?;
        let empty = |field: &'static str| CatalogueError::EmptyList {
            action: action.clone(),
            rule: index,
            field,
        };
        let check = match rule {
            ArgumentRule::PathWithin(r) => {
                if r.globs.is_empty() {
                    return Err(empty("globs"));
                }
                let mut set = GlobSetBuilder::new();
                for glob in &r.globs {
                    let invalid = |message: String| CatalogueError::InvalidGlob {
                        action: action.clone(),
                        rule: index,
                        glob: glob.clone(),
                        message,
                    };
                    // Normalised paths are relative, `/`-separated and
                    // free of `.`/`..`; a glob that could only match
                    // something else is a mistake, so say so now.
                    if glob.starts_with('/') || glob.contains('\\') {
                        return Err(invalid(
                            "globs match relative `/`-separated paths".to_owned(),
                        ));
                    }
                    if glob.split('/').any(|s| s == "." || s == "..") {
                        return Err(invalid(
                            "`.` and `..` never survive normalisation".to_owned(),
                        ));
                    }
                    let compiled = GlobBuilder::new(glob)
                        .literal_separator(true)
                        .backslash_escape(true)
                        .build()
                        .map_err(|e| invalid(one_line(&e.to_string())))?;
                    set.add(compiled);
                }
                let set = set.build().map_err(|e| CatalogueError::InvalidGlob {
                    action: action.clone(),
                    rule: index,
                    glob: r.globs.join(", "),
                    message: one_line(&e.to_string()),
                })?;
                Check::PathWithin(set)
            }
            ArgumentRule::HostIn(r) => {
                if r.hosts.is_empty() {
                    return Err(empty("hosts"));
                }
                if r.schemes.is_empty() {
                    return Err(empty("schemes"));
                }
                let allow =
                    HostAllow::compile(&r.hosts, &r.schemes).map_err(|(why, input)| match why {
                        HostCompileError::Scheme => CatalogueError::InvalidScheme {
                            action: action.clone(),
                            rule: index,
                            scheme: input,
                        },
                        HostCompileError::Host(message) => CatalogueError::InvalidHost {
                            action: action.clone(),
                            rule: index,
                            host: input,
                            message,
                        },
                    })?;
                Check::HostIn(allow)
            }
            ArgumentRule::MaxBytes(r) => Check::MaxBytes(r.max),
            ArgumentRule::Pattern(r) => {
                let anchored = format!(r"\A(?:{})\z", r.regex);
                let regex = RegexBuilder::new(&anchored)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|e| CatalogueError::InvalidRegex {
                        action: action.clone(),
                        rule: index,
                        regex: r.regex.clone(),
                        message: one_line(&e.to_string()),
                    })?;
                Check::Pattern(regex)
            }
            ArgumentRule::MimeIn(r) => {
                if r.types.is_empty() {
                    return Err(empty("types"));
                }
                let mut patterns = Vec::with_capacity(r.types.len());
                for t in &r.types {
                    let pattern =
                        parse_mime_pattern(t).ok_or_else(|| CatalogueError::InvalidMimeType {
                            action: action.clone(),
                            rule: index,
                            mime: t.clone(),
                        })?;
                    patterns.push(pattern);
                }
                Check::MimeIn(patterns.into_boxed_slice())
            }
            ArgumentRule::ClassificationAtMost(r) => Check::ClassificationAtMost(r.ceiling),
        };
        Ok(Self {
            argument,
            optional: rule.optional(),
            check,
        })
    }

    /// Check the rule against `args`; `None` when it passes.
    pub(crate) fn check(&self, args: &Map<String, Value>) -> Option<Reason> {
        let name = self.argument.name();
        let fail = |prefix: &str| Some(Reason::with_param(prefix, name));
        let value = match self.argument.lookup(args) {
            Lookup::Found(v) => v,
            Lookup::Missing if self.optional => return None,
            Lookup::Missing => return fail(reasons::ARGUMENT_MISSING),
            Lookup::NotAnObject => return fail(reasons::ARGUMENT_WRONG_TYPE),
        };
        match &self.check {
            Check::MaxBytes(max) => {
                if encoded_len_exceeds(value, *max) {
                    return fail(reasons::ARGUMENT_TOO_LARGE);
                }
                None
            }
            check => {
                let Value::String(s) = value else {
                    return fail(reasons::ARGUMENT_WRONG_TYPE);
                };
                check_string(check, s).and_then(fail)
            }
        }
    }
}

/// Check a string argument; the reason prefix when it fails.
fn check_string(check: &Check, s: &str) -> Option<&'static str> {
    match check {
        Check::PathWithin(globs) => match normalise(s) {
            Ok(path) => {
                if globs.is_match(&*path) {
                    None
                } else {
                    Some(reasons::PATH_OUTSIDE_ALLOWED)
                }
            }
            Err(PathProblem::AmbiguousUnicode) => Some(reasons::PATH_AMBIGUOUS_UNICODE),
            Err(problem) if problem.is_traversal() => Some(reasons::PATH_TRAVERSAL),
            Err(_) => Some(reasons::PATH_OUTSIDE_ALLOWED),
        },
        Check::HostIn(allow) => match allow.check(s) {
            Ok(()) => None,
            Err(HostProblem::Scheme) => Some(reasons::SCHEME_NOT_ALLOWED),
            Err(HostProblem::Host) => Some(reasons::HOST_NOT_ALLOWED),
        },
        Check::Pattern(regex) => (!regex.is_match(s)).then_some(reasons::PATTERN_MISMATCH),
        Check::MimeIn(patterns) => {
            let allowed = parse_mime_value(s)
                .is_some_and(|(top, sub)| patterns.iter().any(|p| p.matches(top, sub)));
            (!allowed).then_some(reasons::MIME_NOT_ALLOWED)
        }
        Check::ClassificationAtMost(ceiling) => {
            // Off-ladder names fail closed: they are above every ceiling.
            let within = Classification::parse(s).is_some_and(|c| c <= *ceiling);
            (!within).then_some(reasons::CLASSIFICATION_ABOVE_CEILING)
        }
        Check::MaxBytes(max) => (s.len() as u64 > *max).then_some(reasons::ARGUMENT_TOO_LARGE),
    }
}

impl MimePattern {
    fn matches(&self, top: &str, sub: &str) -> bool {
        let part = |want: &Option<String>, got: &str| {
            want.as_ref().is_none_or(|w| w.eq_ignore_ascii_case(got))
        };
        part(&self.top, top) && part(&self.sub, sub)
    }
}

/// RFC 9110 `token` characters.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Split a media-type value into `(type, subtype)`, dropping parameters.
/// Wildcards are not concrete types, so `image/*` as a value is refused.
fn parse_mime_value(s: &str) -> Option<(&str, &str)> {
    let essence = s.split(';').next()?.trim_matches([' ', '\t']);
    let (top, sub) = essence.split_once('/')?;
    let ok = |part: &str| is_token(part) && part != "*";
    (ok(top) && ok(sub)).then_some((top, sub))
}

/// Parse an allowlist entry: `type/subtype`, `type/*` or `*/*`.
fn parse_mime_pattern(s: &str) -> Option<MimePattern> {
    let (top, sub) = s.split_once('/')?;
    if !is_token(top) || !is_token(sub) || s.contains(';') {
        return None;
    }
    let part = |p: &str| (p != "*").then(|| p.to_ascii_lowercase());
    let pattern = MimePattern {
        top: part(top),
        sub: part(sub),
    };
    // `*/json` has no meaning.
    if pattern.top.is_none() && pattern.sub.is_some() {
        return None;
    }
    Some(pattern)
}

/// Whether the argument is more than `max` bytes: a string's UTF-8 length,
/// otherwise its compact JSON encoding, counted without allocating and
/// abandoned as soon as the cap is passed.
fn encoded_len_exceeds(value: &Value, max: u64) -> bool {
    if let Value::String(s) = value {
        return s.len() as u64 > max;
    }
    encoded_json_len_exceeds(value, max)
}

/// Whether the compact JSON encoding of `value` is longer than `max` bytes.
pub(crate) fn encoded_json_len_exceeds<T: serde::Serialize + ?Sized>(value: &T, max: u64) -> bool {
    let mut counter = ByteCounter { count: 0, max };
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.count > max,
        // The counter only fails once it passes the cap; any other
        // serialisation failure is treated as too large (fail closed).
        Err(_) => true,
    }
}

struct ByteCounter {
    count: u64,
    max: u64,
}

impl io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.count = self.count.saturating_add(buf.len() as u64);
        if self.count > self.max {
            return Err(io::Error::other("size cap passed"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One line, no final period: fit a library's message into ours.
pub(crate) fn one_line(message: &str) -> String {
    let joined = message.split_whitespace().collect::<Vec<_>>().join(" ");
    joined.trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_values() {
        assert_eq!(parse_mime_value("image/png"), Some(("image", "png")));
        assert_eq!(
            parse_mime_value("Text/Plain; charset=utf-8"),
            Some(("Text", "Plain"))
        );
        assert_eq!(parse_mime_value("image/*"), None);
        assert_eq!(parse_mime_value("*/*"), None);
        assert_eq!(parse_mime_value("image"), None);
        assert_eq!(parse_mime_value("image/"), None);
        assert_eq!(parse_mime_value("/png"), None);
        assert_eq!(parse_mime_value("image/png/x"), None);
        assert_eq!(parse_mime_value("ima ge/png"), None);
        assert_eq!(parse_mime_value(""), None);
    }

    #[test]
    fn mime_patterns() {
        assert!(parse_mime_pattern("image/*").is_some());
        assert!(parse_mime_pattern("*/*").is_some());
        assert!(parse_mime_pattern("*/json").is_none());
        assert!(parse_mime_pattern("application/json; q=1").is_none());
        assert!(parse_mime_pattern("json").is_none());
        let p = parse_mime_pattern("Application/JSON").unwrap();
        assert!(p.matches("application", "json"));
        assert!(p.matches("APPLICATION", "Json"));
        assert!(!p.matches("application", "xml"));
    }

    #[test]
    fn encoded_lengths() {
        assert!(!encoded_len_exceeds(&Value::String("abc".into()), 3));
        assert!(encoded_len_exceeds(&Value::String("abcd".into()), 3));
        // "é" is two bytes of UTF-8.
        assert!(encoded_len_exceeds(&Value::String("éé".into()), 3));
        let v = serde_json::json!({"a": [1, 2]});
        let len = serde_json::to_string(&v).unwrap().len() as u64;
        assert!(!encoded_len_exceeds(&v, len));
        assert!(encoded_len_exceeds(&v, len - 1));
        assert!(!encoded_len_exceeds(&Value::Null, 4));
        assert!(encoded_len_exceeds(&Value::Null, 3));
    }

    #[test]
    fn argument_paths() {
        assert!(ArgPath::parse("a.b").is_ok());
        assert!(ArgPath::parse("").is_err());
        assert!(ArgPath::parse("a..b").is_err());
        assert!(ArgPath::parse(".a").is_err());
        assert!(ArgPath::parse("a b").is_err());
        let p = ArgPath::parse("target.path").unwrap();
        let args = serde_json::json!({"target": {"path": "x"}, "flat": 1});
        let args = args.as_object().unwrap();
        assert!(matches!(p.lookup(args), Lookup::Found(Value::String(_))));
        let q = ArgPath::parse("flat.x").unwrap();
        assert!(matches!(q.lookup(args), Lookup::NotAnObject));
        let r = ArgPath::parse("target.nope").unwrap();
        assert!(matches!(r.lookup(args), Lookup::Missing));
    }

    #[test]
    fn one_line_messages() {
        assert_eq!(one_line("bad thing.\n  more here."), "bad thing. more here");
    }
}
